"""The settings checks' filters (plugins/filter/settings.py): the floors the stage roles share."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from plugin_loader import load_plugin

REPO = Path(__file__).resolve().parents[2]
CPU_PYTHON = Path(
    os.environ.get("SPECFLEET_TEST_VENV_PYTHON", str(REPO / ".work/local/venv/bin/python"))
)

filters = load_plugin("plugins/filter/settings.py")


def test_every_filter_is_registered_under_the_specfleet_prefix() -> None:
    names = filters.FilterModule().filters()
    assert set(names) == {
        "at_least",
        "below_floor",
        "fields_at_least",
        "input_file_rows",
        "split_for_ranks",
    }


def test_a_data_file_is_read_row_by_row_on_the_controller(tmp_path: Path) -> None:
    """input_file_rows runs the stage's own reader: the rows of a good file, the line of a bad
    one."""
    good = tmp_path / "good.jsonl"
    chat = {
        "conversations": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    }
    good.write_text("\n".join(json.dumps(chat) for _ in range(3)) + "\n")
    assert filters.input_file_rows(str(good), "file") == {"rc": 0, "rows": 3, "error": ""}
    bad = filters.input_file_rows(str(REPO / "tests/fixtures/data/malformed-row.jsonl"), "file")
    assert (
        bad["rc"] != 0
        and bad["rows"] is None
        and "malformed-row.jsonl:3: not valid JSON" in bad["error"]
    )


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


# ----------------------------------------------------------------------------- rows and ranks


def test_the_runbook_rows_fit_one_rank_and_not_eight() -> None:
    # The npu default before issue 38: the 10 smoke rows on every device of an A2 host.
    assert filters.split_for_ranks(10, 0.9, 1) == ""
    assert filters.split_for_ranks(10, 0.9, 8) == (
        "speculators splits 10 rows into 9 for training and 1 for validation (train_data_ratio "
        "0.9); each split needs a row for every one of the 8 ranks that read it, and validation "
        "has 1: expected at least 71 rows for 8 ranks, or at most 1 rank for 10 rows"
    )
    # An A3 host's 16 dies: neither split has enough.
    assert "training has 9 and validation has 1" in filters.split_for_ranks(10, 0.9, 16)


@pytest.mark.parametrize("ranks", [1, 2, 3, 8, 16, 32])
@pytest.mark.parametrize("ratio", [0.9, 0.8, 0.5])
def test_the_rows_it_asks_for_are_the_fewest_that_fit(ranks: int, ratio: float) -> None:
    rows = filters.rows_for_ranks(ranks, ratio)
    assert filters.split_for_ranks(rows, ratio, ranks) == ""
    assert filters.split_for_ranks(rows - 1, ratio, ranks) != ""
    train, val = filters.train_split(rows, ratio)
    assert min(train, val) >= ranks


def test_the_split_is_speculators_own() -> None:
    # int(len * ratio) in float arithmetic, as speculators' train/data.py computes it.
    assert filters.train_split(913, 0.9) == (821, 92)
    assert filters.train_split(30, 0.9) == (27, 3)
    assert filters.train_split("10", "0.9") == (9, 1)


@pytest.mark.skipif(not CPU_PYTHON.exists(), reason=f"no CPU venv python at {CPU_PYTHON}")
def test_a_split_with_a_row_per_rank_gives_every_rank_a_batch_in_speculators_sampler() -> None:
    """The rule's premise, against the installed speculators: a split feeds every rank a batch
    when it has at least as many rows as ranks, and no rank otherwise (short rows and rows as
    long as the packing length alike)."""
    cases = [(rows, ranks) for ranks in (1, 2, 8, 16) for rows in (ranks - 1, ranks, ranks + 1)]
    code = (
        "import json, sys\n"
        "from speculators.train.distributed_batch_sampler import "
        "MultipackDistributedBatchSamplerV2 as S\n"
        "out = []\n"
        "for rows, ranks, length in json.loads(sys.argv[1]):\n"
        "    out.append(min(len(S(8192, [length] * rows, ranks, r)) for r in range(ranks)))\n"
        "print(json.dumps(out))\n"
    )
    asked = [[rows, ranks, length] for rows, ranks in cases if rows > 0 for length in (300, 8192)]
    proc = subprocess.run(
        [str(CPU_PYTHON), "-c", code, json.dumps(asked)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    fewest_batches = json.loads(proc.stdout)
    for (rows, ranks, _length), batches in zip(asked, fewest_batches):
        # One split's rows: every rank gets a batch exactly when there is a row per rank.
        assert (batches >= 1) == (rows >= ranks), (rows, ranks, batches)
