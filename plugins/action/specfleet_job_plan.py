"""specfleet_job_plan: one plan for a stage that every host of a job runs at once (train,
declared `job: together` in roles/specfleet/vars/main/stages.yml), after each host decided.

torchrun's rendezvous needs every host of the job, so the job trains on all of its hosts or on
none. Each host's decision (specfleet_stage_decide, the task before this one, so every host of
the job has decided) is read from hostvars:

- a host of the job that has no decision for the stage (an earlier stage failed there, or it
  became unreachable) fails the stage here, naming it: started without it, the others would
  wait out the rendezvous's join timeout;
- decisions with different inputs fail it too, naming them: the hosts would not agree on the
  checkpoint directory. `own_inputs` are each host's own and may differ (its script: its
  address, whether it hosts the rendezvous; where it publishes, under its own work root);
- a host that is up to date while another must run is planned to run with it, with that host's
  reason (`<stage>: running: the job's host <h> runs it: <reason>`), so the job runs once, on
  all of its hosts, and a stage redone because of one host is redone everywhere.

    - name: Agree with the other hosts of the job
      specfleet.ascend.specfleet_job_plan:
        stage: train
        own_inputs: [script_sha256, output]
      when: specfleet_job_nodes | int > 1

It updates stage_decision (redo, reason), specfleet_stage_runs and specfleet_run_results as
the decision sets them, and prints the plan line through the progress callback
(`specfleet_plan`) when it changed the plan.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible_collections.specfleet.ascend.plugins.plugin_utils.facts import set_facts

WHO = "specfleet_job_plan"


def _why_out(host_vars: Mapping[str, Any]) -> str:
    stopped = host_vars.get("specfleet_host_stopped") or {}
    if stopped:
        return str(stopped.get("why") or "stopped")
    failed = host_vars.get("specfleet_failed_stage")
    return f"its {failed} stage failed" if failed else "it did not get this far"


def differing_inputs(
    mine: Mapping[str, Any], theirs: Mapping[str, Any], own: Iterable[str] = ()
) -> list[str]:
    """The inputs two hosts of a job disagree on, their `own` ones aside."""
    names = (set(mine) | set(theirs)) - set(own)
    return sorted(k for k in names if mine.get(k, ...) != theirs.get(k, ...))


def agree(
    stage: str,
    host: str,
    hosts: list[str],
    decisions: Mapping[str, Any],
    out_why: Mapping[str, str],
    own: Iterable[str] = (),
) -> dict[str, Any]:
    """{"error"} or {"redo", "reason"}: this host's plan given every host's decision."""
    missing = [h for h in hosts if (decisions.get(h) or {}).get("stage") != stage]
    if missing:
        named = "; ".join(f"{h} ({out_why.get(h, 'it did not get this far')})" for h in missing)
        return {
            "error": f"{stage} runs on every host of the job at once, and {named} cannot take "
            f"part: {stage} does not start on {host} either"
        }
    mine = decisions[host]
    decided = [h for h in hosts if not (decisions[h].get("pending") or [])]
    for other in decided:
        if other != host and host in decided:
            theirs = decisions[other].get("inputs") or {}
            differ = differing_inputs(mine.get("inputs") or {}, theirs, own)
            if differ:
                return {
                    "error": f"{host} and {other} planned {stage} with different inputs "
                    f"({', '.join(differ)}): the hosts of a job must agree on them (set the "
                    "job's settings for the whole group)"
                }
    if mine.get("redo"):
        return {"redo": True, "reason": mine.get("reason", "")}
    running = next((h for h in hosts if decisions[h].get("redo")), None)
    if running is None:
        return {"redo": False, "reason": mine.get("reason", "")}
    return {
        "redo": True,
        "reason": f"the job's host {running} runs it: {decisions[running].get('reason', '')}",
    }


class ActionModule(ActionBase):
    _requires_connection = False
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        args = dict(self._task.args)
        stage = args.get("stage")
        own = args.get("own_inputs", [])
        if not set(args) <= {"stage", "own_inputs"} or not isinstance(stage, str):
            raise AnsibleActionFail(
                f"{WHO}: expected stage (the stage's name) and own_inputs (a list of input names)"
            )
        if not isinstance(own, list) or not all(isinstance(name, str) for name in own):
            raise AnsibleActionFail(f"{WHO}: own_inputs must be a list of input names")
        host = str(task_vars["inventory_hostname"])
        hosts = [str(h) for h in self._templar.template(task_vars["specfleet_job_hosts"])]
        hostvars = task_vars["hostvars"]
        decisions = {h: hostvars[h].get("stage_decision") or {} for h in hosts}
        out_why = {h: _why_out(hostvars[h]) for h in hosts}
        plan = agree(stage, host, hosts, decisions, out_why, own)
        if "error" in plan:
            result.update(failed=True, changed=False, msg=plan["error"])
            return result
        mine = dict(decisions[host])
        if plan["redo"] == bool(mine.get("redo")):
            result.update(changed=False, redo=plan["redo"], msg="")
            return result
        check_mode = bool(self._task.check_mode)
        line = f"{stage}: {'would run' if check_mode else 'running'}: {plan['reason']}"
        mine.update(redo=True, reason=plan["reason"], msg=line)
        runs = dict(task_vars.get("specfleet_stage_runs") or {})
        runs[stage] = "pending"
        results = dict(task_vars.get("specfleet_run_results") or {})
        if check_mode:
            results[stage] = {"status": "would_run", "reason": plan["reason"], "duration_s": None}
        else:
            results.pop(stage, None)  # a stage that runs is noted when it ends
        set_facts(
            self,
            {
                "stage_decision": mine,
                "specfleet_stage_runs": runs,
                "specfleet_run_results": results,
            },
        )
        result.update(changed=False, redo=True, reason=plan["reason"], msg=line)
        result["specfleet_plan"] = line  # printed by the progress callback
        return result
