"""plugins/action/specfleet_stage_plan.py: every stage of a play decided in one task, in order,
with the project's real declarations and roles (a real ansible-playbook run on localhost)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from playrun import run_cases


# What the session and npu_env would have set (plugins/action/specfleet_session.py,
# roles/npu_env): a host with speculators installed (its run id) and nothing else stamped.
def host_facts(root: Path) -> dict[str, Any]:
    return {
        "specfleet_root": str(root),
        "specfleet_host_python": sys.executable,
        "specfleet_accelerator": "cpu",
        "specfleet_env": {
            "profile": "cpu",
            "runtime": "host",
            "python": str(root / "venv" / "bin" / "python"),
            "stack": {"python": "3.11.2"},
        },
        "specfleet_session": {
            "stamps": {},
            "failures": {},
            "env": {"PYTHONPATH": str(Path(__file__).resolve().parents[2] / "python_helpers")},
        },
        "specfleet_stage_runs": {"speculators_install": "r0"},
        "specfleet_run_results": {},
        "specfleet_outputs": {},
    }


def plan_case(name: str, stages: list[str], check: bool = False) -> dict[str, Any]:
    case: dict[str, Any] = {
        "name": name,
        "specfleet.ascend.specfleet_stage_plan": {"stages": stages},
    }
    if check:
        case["check_mode"] = True
    return case


def test_a_stage_after_one_that_runs_runs_too(tmp_path: Path) -> None:
    """models has no stamp: it runs; convert needs it, so it runs after it (its own decision,
    in its role, comes once models has published)."""
    run = run_cases(
        tmp_path,
        [plan_case("plan", ["models", "convert"])],
        host_facts(tmp_path / "root"),
        roles=["specfleet"],
    )
    planned = run.results["plan"]
    assert not planned.get("failed"), planned
    assert planned["specfleet_stage_plan"]["run"] == ["models", "convert"], planned
    lines = planned["specfleet_plan"]
    assert lines[0].startswith("models: "), lines
    assert lines[1] == "convert: running: after models", lines


def test_in_check_mode_a_stage_after_one_that_would_run_is_planned_not_included(
    tmp_path: Path,
) -> None:
    run = run_cases(
        tmp_path,
        [plan_case("plan", ["models", "convert"], check=True)],
        host_facts(tmp_path / "root"),
        roles=["specfleet"],
    )
    planned = run.results["plan"]
    assert not planned.get("failed"), planned
    assert "convert" not in planned["specfleet_stage_plan"]["run"], planned
    assert "convert: would run: upstream would run: models" in planned["specfleet_plan"], planned


def test_a_stage_whose_upstream_has_no_stamp_is_left_to_its_role(tmp_path: Path) -> None:
    """No run id of speculators_install: the plan cannot decide models; its role's own
    decision names what is missing and fails the stage (roles/stage/tasks/begin.yml)."""
    facts = {**host_facts(tmp_path / "root"), "specfleet_stage_runs": {}}
    run = run_cases(tmp_path, [plan_case("plan", ["models"])], facts, roles=["specfleet"])
    planned = run.results["plan"]
    assert planned["specfleet_stage_plan"]["run"] == ["models"], planned
    assert planned["specfleet_plan"][0].startswith("models: decided by its role (models needs "), (
        planned
    )


def test_options_are_checked(tmp_path: Path) -> None:
    run = run_cases(
        tmp_path,
        [{"name": "bad", "specfleet.ascend.specfleet_stage_plan": {"stages": "models"}}],
        host_facts(tmp_path / "root"),
        roles=["specfleet"],
    )
    assert run.results["bad"]["failed"], run.results["bad"]
    assert "stages must be a list of stage names" in run.results["bad"]["msg"]
