"""plugins/filter/specfleet_stage.py: a stage's inputs against its stamp (begin.yml)."""

from __future__ import annotations

import hashlib
import json

from plugin_loader import load_plugin

stage_filters = load_plugin("plugins/filter/specfleet_stage.py")

INPUTS = {
    "epochs": 1,
    "lr": 0.0003,
    "upstream": {"data": "abc"},
    "script_sha256": "f" * 64,
    "name": "Qwen/Qwen3-8B",
}


def stamp_of(inputs: dict) -> dict:
    return {"fingerprint": stage_filters.fingerprint(inputs), "inputs": inputs, "run_id": "r1"}


def test_the_fingerprint_is_what_the_stamps_hold() -> None:
    """Stamps written before this filter hold `inputs | to_json(sort_keys=true) | hash('sha256')`:
    the same bytes, or every stage would redo once after an upgrade."""
    expected = hashlib.sha256(json.dumps(INPUTS, sort_keys=True).encode()).hexdigest()
    assert stage_filters.fingerprint(INPUTS) == expected
    assert stage_filters.fingerprint(dict(reversed(list(INPUTS.items())))) == expected


def test_an_unchanged_stage_has_no_reason() -> None:
    plan = stage_filters.stage_plan(INPUTS, stamp_of(INPUTS), False)
    assert plan == {
        "inputs": INPUTS,
        "fingerprint": stage_filters.fingerprint(INPUTS),
        "reason": "",
        "script": None,
    }


def test_a_rendered_script_is_an_input_by_its_sha256_and_kept_for_the_start() -> None:
    """What `lookup('template', ...) | hash('sha256')` put into the inputs before: the same
    script_sha256, so a stamp from before the change still matches."""
    script = "#!/usr/bin/env bash\necho '==> train'\n"
    inputs = {k: v for k, v in INPUTS.items() if k != "script_sha256"}
    expected = {**inputs, "script_sha256": hashlib.sha256(script.encode()).hexdigest()}
    plan = stage_filters.stage_plan(inputs, stamp_of(expected), False, script)
    assert plan["reason"] == "" and plan["inputs"] == expected
    assert plan["script"] == script
    edited = stage_filters.stage_plan(inputs, stamp_of(expected), False, script + "exit 1\n")
    assert edited["reason"] == "inputs changed: script_sha256"


def test_forced_and_unstamped_stages_say_why() -> None:
    assert (
        stage_filters.stage_plan(INPUTS, stamp_of(INPUTS), True)["reason"]
        == "forced by specfleet_force_stages"
    )
    assert stage_filters.stage_plan(INPUTS, {}, False)["reason"] == "no stamp from an earlier run"


def test_changed_inputs_are_named_whether_changed_added_or_removed() -> None:
    old = {**INPUTS, "removed": 1}
    new = {**INPUTS, "epochs": 2, "added": True}
    del new["name"]
    plan = stage_filters.stage_plan(new, stamp_of(old), False)
    assert plan["reason"] == "inputs changed: added, epochs, name, removed"
    assert plan["fingerprint"] == stage_filters.fingerprint(new)


def test_a_stamp_without_inputs_still_compares_by_fingerprint() -> None:
    plan = stage_filters.stage_plan(INPUTS, {"fingerprint": "0" * 64}, False)
    assert plan["reason"].startswith("inputs changed: ") and "epochs" in plan["reason"]


def test_the_filter_is_registered() -> None:
    assert stage_filters.FilterModule().filters() == {
        "specfleet_stage_plan": stage_filters.stage_plan
    }
