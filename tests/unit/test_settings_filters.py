"""The settings checks' filters (plugins/filter/settings.py): the floors the stage roles share."""

from __future__ import annotations

import pytest
from plugin_loader import load_plugin

filters = load_plugin("plugins/filter/settings.py")


def test_every_filter_is_registered_under_the_specfleet_prefix() -> None:
    names = filters.FilterModule().filters()
    assert set(names) == {
        "at_least",
        "below_floor",
        "fields_at_least",
    }


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        (["n", 1, 1, "what"], []),
        (["n", "3", 1, "what"], []),
        (["n", 0, 1, "what"], ["n is 0, expected >= 1 (what)"]),
        (["n", -2, -1, "w"], ["n is -2, expected >= -1 (w)"]),
        (["n", "abc", 1, "w"], ['n is "abc", expected a number >= 1 (w)']),
        (["n", None, 1, "w"], ["n is null, expected a number >= 1 (w)"]),
    ],
)
def test_at_least(rule: list, expected: list[str]) -> None:
    assert filters.at_least([rule]) == expected


def test_at_least_reports_each_rule_in_order() -> None:
    rules = [["a", 0, 1, "x"], ["b", 5, 1, "y"], ["c", 1, 2, "z"]]
    assert filters.at_least(rules) == ["a is 0, expected >= 1 (x)", "c is 1, expected >= 2 (z)"]


@pytest.mark.parametrize(
    ("value", "floor", "expected"),
    [
        (1, 1, []),
        ("3", 1, []),
        ("2.0", 2, []),
        (0, 1, ["n is 0, expected >= 1"]),
        ("0", 1, ["n is 0, expected >= 1"]),
        (-2, -1, ["n is -2, expected >= -1"]),
        ("abc", 0, ["n is abc, expected >= 0"]),
        (None, 1, ["n is None, expected >= 1"]),
    ],
)
def test_below_floor(value: object, floor: int, expected: list[str]) -> None:
    assert filters.below_floor({"n": value}, floor) == expected


def test_below_floor_reports_each_setting_in_order() -> None:
    values = {"a": 0, "b": 5, "c": "-1"}
    assert filters.below_floor(values, 1) == ["a is 0, expected >= 1", "c is -1, expected >= 1"]


@pytest.mark.parametrize(
    ("mapping", "expected"),
    [
        ({"a": 1, "b": "2"}, []),
        ({"a": 0, "b": 1}, ["m.a is 0, expected >= 1"]),
        ({"a": 1, "b": "abc"}, ["m.b is abc, expected >= 1"]),
        ({"a": 1}, ["m.b is None, expected >= 1"]),
        ("not a dict", ["m.a is None, expected >= 1", "m.b is None, expected >= 1"]),
    ],
)
def test_fields_at_least(mapping: object, expected: list[str]) -> None:
    assert filters.fields_at_least([["m", mapping]], ["a", "b"], 1) == expected


def test_fields_at_least_compares_floats_and_names_the_unit() -> None:
    gb = {"npu": 0.5, "cpu": -0.5}
    assert filters.fields_at_least([["gb", gb]], ["npu", "cpu"], 0, "GB") == [
        "gb.cpu is -0.5, expected GB >= 0"
    ]


def test_fields_at_least_reports_each_setting_then_each_key_in_order() -> None:
    settings = [["x", {"p": -1, "q": -2}], ["y", {"p": 0, "q": -3}]]
    assert filters.fields_at_least(settings, ["q", "p"], 0) == [
        "x.q is -2, expected >= 0",
        "x.p is -1, expected >= 0",
        "y.q is -3, expected >= 0",
    ]
