"""specfleet_stage_upstream: a stage's upstream stages, from its declaration, in one task
(roles/stage/tasks/upstream.yml: the stage graph alone, for a play that renders or inspects a
stage without deciding it). A stage role's decision finds them itself, first
(plugins/action/specfleet_stage_decide.py); both use plugins/plugin_utils/upstream.py.

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
from ansible_collections.specfleet.ascend.plugins.plugin_utils.upstream import (
    find_upstream,
    graph_entry,
    missing_message,
    pending_plan,
)

WHO = "specfleet_stage_upstream"


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
                f"{WHO}: expected stage, stage_runs, run_results"
                + (f"; unknown option(s) {', '.join(sorted(unknown))}" if unknown else "")
            )
        stage: str = args["stage"]
        declared = (task_vars or {}).get("specfleet_stages")
        if not isinstance(declared, Mapping):
            raise AnsibleActionFail(f"{WHO}: specfleet_stages is not defined")
        if not isinstance(declared.get(stage), Mapping):
            raise AnsibleActionFail(
                f"{WHO}: {stage} is not a stage of specfleet_stages "
                "(roles/specfleet/vars/main/stages.yml)"
            )
        runs = dict(args.get("stage_runs") or {})
        found = find_upstream(self._templar, WHO, stage, declared[stage], runs)
        host = (task_vars or {}).get("inventory_hostname", "")
        result.update(found, changed=False, stage=stage)
        if found["pending"] and self._task.check_mode:
            planned = pending_plan(stage, found["pending"], runs, args.get("run_results") or {})
            result.update(planned)
            result["specfleet_plan"] = result["msg"]  # printed by the progress callback
            set_facts(
                self,
                {
                    "specfleet_stage_runs": planned["stage_runs"],
                    "specfleet_run_results": planned["run_results"],
                },
            )
        else:
            result["pending"] = []
        if found["missing"]:
            provides = {
                name: str(graph_entry(self._templar, declared[name]).get("provides", ""))
                for name in found["missing"]
                if isinstance(declared.get(name), Mapping)
            }
            result["msg"] = missing_message(stage, found["missing"], provides, host)
            result["failed"] = True
        return result
