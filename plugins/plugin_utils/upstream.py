"""A stage's upstream stages from the one declaration (roles/specfleet/vars/main/stages.yml):
what it `needs`, and the `needs_if` edges that exist only while a boolean setting of its role
is true ({stage: setting}; train needs convert only with train_from_converted). Each upstream
stage's run id in this play (specfleet_stage_runs: from its stamp, or from its run earlier in
the play) becomes the stage's `upstream` input, so a redone upstream stage redoes it.

Shared by the stage's decision (plugins/action/specfleet_stage_decide.py), which finds them
first, and specfleet_stage_upstream (the stage role's `upstream` entry point: the graph alone).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleActionFail

GRAPH_KEYS = ("needs", "needs_if", "provides")


def upstream_of(
    needs: list[str], needs_if: Mapping[str, bool], runs: Mapping[str, str]
) -> dict[str, Any]:
    """{needs, run_ids, missing, pending} for a stage that needs `needs` plus each `needs_if`
    stage whose setting is true, in a play whose stages have the run ids `runs`
    ('pending': it would run in this --check run)."""
    wanted = list(needs) + [stage for stage, on in needs_if.items() if on and stage not in needs]
    return {
        "needs": wanted,
        "run_ids": {stage: runs[stage] for stage in wanted if stage in runs},
        "missing": [stage for stage in wanted if stage not in runs],
        "pending": [stage for stage in wanted if runs.get(stage) == "pending"],
    }


def missing_message(stage: str, missing: list[str], provides: Mapping[str, str], host: str) -> str:
    one = len(missing) == 1
    what = ", ".join(f"{name} ({provides.get(name, 'its artifacts')})" for name in missing)
    return (
        f"{stage} needs {what}: {'no stamp of it' if one else 'no stamps of them'} on {host}, "
        f"and {'it does' if one else 'they do'} not run in this play; run site.yml, "
        f"or add --tags {','.join(missing)}"
    )


def graph_entry(templar: Any, entry: Mapping[str, Any]) -> dict[str, Any]:
    """A declaration's needs, needs_if and provides, templated: only those keys (the others
    name settings of roles that may not be in this play)."""
    return {key: templar.template(entry[key]) for key in GRAPH_KEYS if key in entry}


def setting_on(templar: Any, who: str, stage: str, name: Any) -> bool:
    """A needs_if setting's value: a boolean setting of the stage's role, by name."""
    try:
        value = templar.resolve_variable_expression(str(name))
    except Exception as exc:  # an undefined or malformed name: say which
        raise AnsibleActionFail(
            f"{who}: {stage}'s needs_if names the setting {name!r}, which could not be read: {exc}"
        ) from exc
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "on", "1")
    return bool(value)


def find_upstream(
    templar: Any, who: str, stage: str, entry: Mapping[str, Any], runs: Mapping[str, str]
) -> dict[str, Any]:
    """upstream_of for the stage declared as `entry` (as written)."""
    declared = graph_entry(templar, entry)
    needs_if = {
        upstream: setting_on(templar, who, stage, setting)
        for upstream, setting in (declared.get("needs_if") or {}).items()
    }
    return upstream_of(list(declared.get("needs") or []), needs_if, runs)


def pending_plan(
    stage: str, pending: list[str], runs: Mapping[str, str], results: Mapping[str, Any]
) -> dict[str, Any]:
    """What a --check run plans for a stage whose upstream stages would run: it would run too
    (it cannot be planned: no verifier config, no dataset yet). {msg, stage_runs,
    run_results}, the last two the play's with this stage marked so."""
    reason = "upstream would run: " + ", ".join(pending)
    return {
        "msg": f"{stage}: would run: {reason}",
        "stage_runs": {**runs, stage: "pending"},
        "run_results": {
            **results,
            stage: {"status": "would_run", "reason": reason, "duration_s": None},
        },
    }
