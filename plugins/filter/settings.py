"""Filters for the roles' settings rules (roles/<role>/meta/rules.yml).

The "each of these counts is at least N" rules the stage roles share (of plain settings:
at_least, below_floor; of a dict setting's fields: fields_at_least), and the split of the
training rows over the ranks that read them (split_for_ranks), checked up front by train's
settings and against the prepared rows by hidden_states' declaration; and the rows of a data
file on the controller (input_file_rows). The types and choices from meta/argument_specs.yml
are checked by the specfleet_settings action itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

# The helpers beside the plugins (a checkout is the collection): run on the controller.
PYTHON_HELPERS = Path(__file__).resolve().parents[2] / "python_helpers"


def at_least(rules: Iterable[Sequence[Any]]) -> list[str]:
    """Each rule is [name, value, floor, what]: a problem for each value below its floor (or
    not a number)."""
    problems = []
    for name, value, floor, what in rules:
        try:
            number = int(value)
        except (TypeError, ValueError):
            problems.append(f"{name} is {json.dumps(value)}, expected a number >= {floor} ({what})")
            continue
        if number < int(floor):
            problems.append(f"{name} is {value}, expected >= {floor} ({what})")
    return problems


def _as_int(value: Any) -> int | None:
    """value as Jinja's int filter reads it ("3", 3.0 and "3.0" are 3); None for no number."""
    try:
        return int(value)
    except (TypeError, ValueError):
        try:
            return int(float(value))
        except (TypeError, ValueError):
            return None


def below_floor(values: Mapping[str, Any], floor: int) -> list[str]:
    """A problem for each setting of `values` (name -> value, in order) below `floor`, or not a
    number: "<name> is <value>, expected >= <floor>". For the rules whose message gives no
    purpose (at_least gives one); the value is shown as given, like Jinja's ~ shows it."""
    problems = []
    for name, value in values.items():
        number = _as_int(value)
        if number is None or number < int(floor):
            problems.append(f"{name} is {value}, expected >= {floor}")
    return problems


def fields_at_least(
    settings: Iterable[Sequence[Any]], keys: Sequence[str], floor: float, unit: str = ""
) -> list[str]:
    """Each setting is [name, mapping]: a problem "<name>.<key> is <value>, expected [<unit> ]>=
    <floor>" for each of `keys` of the mapping whose value is below `floor` or not a number (or
    missing), settings and keys in order. For the dict settings whose fields share a floor (the
    synthetic models' sizes, the GB per profile); the value is shown as given, like Jinja's ~."""
    expected = f"{unit} >= {floor}" if unit else f">= {floor}"
    problems = []
    for name, mapping in settings:
        for key in keys:
            value = mapping.get(key) if isinstance(mapping, Mapping) else None
            try:
                below = float(value) < float(floor)
            except (TypeError, ValueError):
                below = True
            if below:
                problems.append(f"{name}.{key} is {value}, expected {expected}")
    return problems


def train_split(rows: int, ratio: float) -> tuple[int, int]:
    """(training rows, validation rows) as speculators 0.9.0 splits a prepared dataset
    (train/data.py: ``split_idx = int(len(data) * train_ratio)``)."""
    train = int(int(rows) * float(ratio))
    return train, int(rows) - train


def rows_for_ranks(ranks: int, ratio: float) -> int:
    """The fewest rows whose splits each give every one of `ranks` ranks a row."""
    rows = 2 * int(ranks)
    while min(train_split(rows, ratio)) < int(ranks):
        rows += 1
    return rows


def split_for_ranks(rows: Any, ratio: Any, ranks: Any) -> str:
    """'' when each split of `rows` prepared rows has a row for each of `ranks` ranks, else what
    is short, with the rows that would do and the ranks these rows can feed.

    speculators' MultipackDistributedBatchSamplerV2 packs a batch for every rank while at least
    as many rows as ranks remain, and stops otherwise: a split with fewer rows than ranks gives
    no rank a batch. No validation batch means no checkpoint_best and no val/loss_epoch (the
    publish fails after the whole run); no training batch, no step."""
    rows, ratio, ranks = int(rows), float(ratio), int(ranks)
    train, val = train_split(rows, ratio)
    if min(train, val) >= ranks:
        return ""
    splits = (("training", train), ("validation", val))
    short = " and ".join(f"{name} has {count}" for name, count in splits if count < ranks)
    most = max(min(train, val), 0)
    return (
        f"speculators splits {rows} rows into {train} for training and {val} for validation "
        f"(train_data_ratio {ratio:g}); each split needs a row for every one of the {ranks} ranks "
        f"that read it, and {short}: expected at least {rows_for_ranks(ranks, ratio)} rows for "
        f"{ranks} ranks, or at most {most} rank{'' if most == 1 else 's'} for {rows} rows"
    )


def input_file_rows(path: str, source: str) -> dict[str, Any]:
    """{rc, rows, error}: every row of the data file `path` on the controller parsed and
    checked by the helper the stage runs (chat_data for data_source file, prompt_set for
    regenerate), so a malformed row is named with its line before any host work."""
    module = (
        ["specfleet_helpers.stages.chat_data", "--check-only"]
        if source == "file"
        else ["specfleet_helpers.stages.prompt_set", "check"]
    )
    done = subprocess.run(
        [sys.executable, "-m", *module, "--input", str(path)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(PYTHON_HELPERS), "PYTHONDONTWRITEBYTECODE": "1"},
        check=False,
    )
    rows = None
    if done.returncode == 0:
        rows = json.loads(done.stdout).get("rows")
    return {"rc": done.returncode, "rows": rows, "error": done.stderr.strip()}


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "input_file_rows": input_file_rows,
            "at_least": at_least,
            "below_floor": below_floor,
            "fields_at_least": fields_at_least,
            "split_for_ranks": split_for_ranks,
        }
