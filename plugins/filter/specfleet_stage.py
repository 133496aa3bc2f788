"""Filters for the stage contract (roles/stage/tasks/begin.yml).

stage_plan: one stage's inputs against its stamp. Computed by one filter in one set_fact key,
so the stage's rendered script (one of its inputs, by its sha256) is rendered once per stage: a
set_fact of several keys that each refer to the inputs renders them once per key. The plan
keeps the script's text, which the stage's start then writes on the host (run.yml).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible.plugins.filter.core import get_hash, to_json


def fingerprint(inputs: Mapping[str, Any]) -> str:
    """What `inputs | to_json(sort_keys=true) | hash('sha256')` gives: the stamps' fingerprint."""
    return get_hash(to_json(inputs, sort_keys=True), "sha256")


def changed_inputs(inputs: Mapping[str, Any], previous: Mapping[str, Any]) -> list[str]:
    """The names whose value differs, or that only one side has."""
    return sorted(
        name
        for name in set(inputs) | set(previous)
        if inputs.get(name, ...) != previous.get(name, ...)
    )


def stage_plan(
    inputs: Mapping[str, Any],
    stamp: Mapping[str, Any],
    forced: bool,
    script: str | None = None,
) -> dict[str, Any]:
    """{inputs, fingerprint, reason, script}: reason is why the stage must run, '' when its
    stamp still matches (its artifacts are then checked by the verifier). A rendered `script`
    is an input too, as `script_sha256`: a changed command line redoes the stage."""
    if script is not None:
        inputs = {**inputs, "script_sha256": get_hash(script, "sha256")}
    current = fingerprint(inputs)
    if forced:
        reason = "forced by specfleet_force_stages"
    elif not stamp:
        reason = "no stamp from an earlier run"
    elif stamp.get("fingerprint", "") != current:
        reason = "inputs changed: " + ", ".join(changed_inputs(inputs, stamp.get("inputs") or {}))
    else:
        reason = ""
    return {"inputs": dict(inputs), "fingerprint": current, "reason": reason, "script": script}


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"specfleet_stage_plan": stage_plan}
