"""specfleet_stage_upstream: a stage's upstream stages, from its declaration, in one task
(roles/stage/tasks/upstream.yml, first in every stage role).

The declaration (roles/specfleet/vars/main/stages.yml) names what the stage `needs`, and
`needs_if` edges that exist only while a boolean setting of its role is true ({stage: setting};
train needs convert only with train_from_converted). Each upstream stage's run id in this play
(specfleet_stage_runs: from its stamp, or from its run earlier in the play) becomes the stage's
`upstream` input, so a redone upstream stage redoes it.

Returns:
  run_ids   {stage: run id} of the upstream stages that have one: the `upstream` input
  missing   upstream stages with neither a stamp nor a run in this play: the task fails before
            any work, and `msg` says what to run (the stage role's rescue records it as the
            stage's failure, as any failure of the stage)
  pending   check mode: upstream stages that would run, so this one cannot be planned (no
            verifier config, no dataset) and would run too; `msg` is its plan line, and
            stage_runs / run_results are the play's specfleet_stage_runs / specfleet_run_results
            with this stage marked so, which it also sets as those facts (as set_fact would)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible_collections.specfleet.ascend.plugins.plugin_utils.facts import set_facts


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


class ActionModule(ActionBase):
    _requires_connection = False
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        unknown = set(args) - {"stage", "stage_runs", "run_results"}
        if unknown or not isinstance(args.get("stage"), str):
            raise AnsibleActionFail(
                "specfleet_stage_upstream: expected stage, stage_runs, run_results"
                + (f"; unknown option(s) {', '.join(sorted(unknown))}" if unknown else "")
            )
        stage: str = args["stage"]
        graph = self._graph(task_vars or {})
        if stage not in graph:
            raise AnsibleActionFail(
                f"specfleet_stage_upstream: {stage} is not a stage of specfleet_stages "
                "(roles/specfleet/vars/main/stages.yml)"
            )
        declared = graph[stage]
        needs_if = {
            upstream: self._setting(stage, setting)
            for upstream, setting in (declared.get("needs_if") or {}).items()
        }
        runs = dict(args.get("stage_runs") or {})
        found = upstream_of(list(declared.get("needs") or []), needs_if, runs)
        host = (task_vars or {}).get("inventory_hostname", "")
        result.update(found, changed=False, stage=stage)
        if found["pending"] and self._task.check_mode:
            reason = "upstream would run: " + ", ".join(found["pending"])
            result["msg"] = f"{stage}: would run: {reason}"
            result["stage_runs"] = {**runs, stage: "pending"}
            result["run_results"] = {
                **(args.get("run_results") or {}),
                stage: {"status": "would_run", "reason": reason, "duration_s": None},
            }
            result["specfleet_plan"] = result["msg"]  # printed by the progress callback
            set_facts(
                self,
                {
                    "specfleet_stage_runs": result["stage_runs"],
                    "specfleet_run_results": result["run_results"],
                },
            )
        else:
            result["pending"] = []
        if found["missing"]:
            provides = {name: str((graph.get(name) or {}).get("provides", "")) for name in graph}
            result["msg"] = missing_message(stage, found["missing"], provides, host)
            result["failed"] = True
        return result

    def _graph(self, task_vars: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        """needs, needs_if and provides of every declared stage: only those keys are templated
        (the others name settings of roles that may not be in this play)."""
        declared = task_vars.get("specfleet_stages")
        if not isinstance(declared, Mapping):
            raise AnsibleActionFail("specfleet_stage_upstream: specfleet_stages is not defined")
        return {
            str(name): {
                key: self._templar.template(entry[key])
                for key in ("needs", "needs_if", "provides")
                if key in entry
            }
            for name, entry in declared.items()
            if isinstance(entry, Mapping)
        }

    def _setting(self, stage: str, name: Any) -> bool:
        """A needs_if setting's value: a boolean setting of the stage's role, by name."""
        try:
            value = self._templar.resolve_variable_expression(str(name))
        except Exception as exc:  # an undefined or malformed name: say which
            raise AnsibleActionFail(
                f"specfleet_stage_upstream: {stage}'s needs_if names the setting {name!r}, "
                f"which could not be read: {exc}"
            ) from exc
        if isinstance(value, str):
            return value.strip().lower() in ("true", "yes", "on", "1")
        return bool(value)
