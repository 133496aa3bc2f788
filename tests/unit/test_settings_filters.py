"""The settings checks' filters (plugins/filter/specfleet.py), on the shapes Ansible hands them:
validate_argument_spec's registered result and the options of a role's meta/argument_specs.yml."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from plugin_loader import load_plugin

REPO = Path(__file__).resolve().parents[2]
filters = load_plugin("plugins/filter/specfleet.py")

TRAIN_SPEC = yaml.safe_load((REPO / "roles/train/meta/argument_specs.yml").read_text())[
    "argument_specs"
]["main"]["options"]
PASSED = {"changed": False, "msg": "The arg spec validation passed", "failed": False}


def test_every_filter_is_registered_under_the_specfleet_prefix() -> None:
    names = filters.FilterModule().filters()
    assert set(names) == {
        "specfleet_structured_options",
        "specfleet_spec_problems",
        "specfleet_spec_message",
        "specfleet_at_least",
        "specfleet_below_floor",
        "specfleet_fields_at_least",
    }


def test_a_passed_validation_has_no_problems() -> None:
    assert filters.spec_problems(PASSED, TRAIN_SPEC, {"train_extra_args": []}) == []


def test_argument_errors_are_the_problems() -> None:
    result = {
        "failed": False,
        "msg": "Validation of arguments failed:\n...",
        "argument_errors": [
            "argument 'train_epochs' is of type str and we were unable to convert to int"
        ],
    }
    assert filters.spec_problems(result, TRAIN_SPEC, {}) == result["argument_errors"]


def test_a_failure_without_argument_errors_keeps_its_message() -> None:
    result = {"failed": False, "msg": "unsupported parameter"}
    assert filters.spec_problems(result, TRAIN_SPEC, {}) == ["unsupported parameter"]


def test_a_list_given_as_a_string_is_a_problem_naming_how_to_give_it() -> None:
    problems = filters.spec_problems(PASSED, TRAIN_SPEC, {"train_extra_args": "--a,--b"})
    assert problems == [
        'train_extra_args is the string "--a,--b", not a list '
        "(give it as JSON or YAML, e.g. -e '{\"train_extra_args\": ...}')"
    ]


def test_structured_options_are_the_list_and_dict_ones() -> None:
    spec = {"a": {"type": "list"}, "b": {"type": "dict"}, "c": {"type": "int"}, "d": {}}
    assert filters.structured_options(spec) == ["a", "b"]


def test_the_message_names_only_the_options_in_the_problems_with_their_declaration() -> None:
    spec = {
        "x_mode": {"type": "str", "choices": ["a", "b"], "description": "Mode."},
        "x_mode_extra": {"type": "list", "elements": "str", "description": "Extra."},
        "x_other": {"type": "int", "description": "Other."},
    }
    message = filters.spec_message(["x_mode must be one of: a, b, got: c"], spec, "x")
    assert message == (
        "x settings: x_mode must be one of: a, b, got: c. "
        "Expected x_mode: str, one of a, b (Mode); see roles/x/meta/argument_specs.yml."
    )


def test_the_message_shows_element_types_and_keys() -> None:
    spec = {
        "y_map": {"type": "dict", "options": {"k": {}, "l": {}}, "description": ["Two", "lines."]}
    }
    message = filters.spec_message(['y_map is the string "k"'], spec, "y")
    assert "y_map: dict with keys k, l (Two lines)" in message


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
