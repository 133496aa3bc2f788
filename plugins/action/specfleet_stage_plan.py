"""specfleet_stage_plan: every stage of the play decided in one task, before any of them runs.

The stages play (playbooks/stages.yml) calls it once per host after npu_env, with the play's
stages in their order:

    - name: Plan the stages
      specfleet.ascend.specfleet_stage_plan:
        stages: [speculators_install, models, convert, data, hidden_states, train, serve]

Each stage is decided as its role's own decision decides it (specfleet_stage_decide's
`decide`, with the variables the stage role's tasks see: plugin_utils/role_scope.py), in the
play's order, so that a stage after one that runs runs too (its `upstream` input holds the run
id the earlier one is about to replace). The play then includes a stage role only when its
stage is in the plan's `run` list: a stage that is up to date costs the play one skipped task.
A stage role that runs decides again, first (roles/stage/tasks/begin.yml), with what the
stages before it have just published, and checks the declared preconditions then: those
guard running a stage, and read what the earlier stages of this run made.

What the plan cannot decide it leaves to the stage's role, by putting the stage in `run`: an
upstream stage with no stamp (the role's decision names it and fails the stage), anything that
cannot be templated yet. A job's stages are decided per host; the play includes a job's stage
on every host of the job when any of them runs it (playbooks/stages.yml).

--tags / --skip-tags: a stage they leave out is not planned (its stamp's run id stands).
In --check mode a stage whose upstream stage would run is planned as would-run and not
included (it cannot be planned without the upstream's artifacts), as its own decision would.

Sets, as set_fact would: specfleet_stage_runs and specfleet_run_results (every stage planned:
its run id or `pending`; the result of the stages that are up to date), and
specfleet_stage_plan {run: [stage, ...], decided: {stage: {fingerprint, reason}}}. Removes the
failure records earlier runs left of the stages found up to date, and of those that passed in
this play before the plan (npu_env). Its plan lines go to the progress callback
(specfleet_plan).
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleActionFail, AnsibleError
from ansible.template import trust_as_template
from ansible_collections.specfleet.ascend.plugins.action.specfleet_stage_decide import (
    ActionModule as DecideAction,
)
from ansible_collections.specfleet.ascend.plugins.plugin_utils.compiled_once import compiled_once
from ansible_collections.specfleet.ascend.plugins.plugin_utils.facts import set_facts
from ansible_collections.specfleet.ascend.plugins.plugin_utils.role_scope import role_scope
from ansible_collections.specfleet.ascend.plugins.plugin_utils.tags import selected
from ansible_collections.specfleet.ascend.plugins.plugin_utils.upstream import (
    find_upstream,
    pending_plan,
)

WHO = "specfleet_stage_plan"
OPTIONS = {"stages": list}

# What roles/stage/tasks/begin.yml gives the decision, as templates in the stage role's scope
# (the decision templates these itself, once the upstream stages are known).
DECISION_ARGS = {
    name: trust_as_template(text)
    for name, text in {
        "inputs": (
            "{{ stage_declared.follower_inputs if stage_follows | bool"
            " else stage_declared.inputs }}"
        ),
        "verifier": "{{ stage_declared.verifier }}",
        "unlisted": "{{ stage_declared.unlisted | default([]) }}",
    }.items()
}


class ActionModule(DecideAction):
    _supports_check_mode = True
    _supports_async = False

    @compiled_once()
    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super(DecideAction, self).run(tmp, task_vars)
        task_vars = task_vars or {}
        stages = self._plan_options()
        check_mode = bool(self._task.check_mode)
        runs = dict(task_vars.get("specfleet_stage_runs") or {})
        results = dict(task_vars.get("specfleet_run_results") or {})
        to_run: list[str] = []
        decided: dict[str, dict[str, Any]] = {}
        lines: list[str] = []
        base = self._templar
        for stage in stages:
            if not selected([stage], task_vars):
                continue
            self._templar = base.copy_with_new_env(
                available_variables=self._stage_scope(stage, task_vars)
            )
            ahead = self._needed_ahead(stage, task_vars, runs, to_run)
            if ahead:
                if check_mode:
                    planned = pending_plan(stage, ahead, runs, results)
                    runs, results = dict(planned["stage_runs"]), dict(planned["run_results"])
                    lines.append(planned["msg"])
                else:
                    runs[stage] = "pending"
                    to_run.append(stage)
                    lines.append(f"{stage}: running: after {', '.join(ahead)}")
                continue
            try:
                outcome, _ = self.decide(
                    self._decision_args(stage, task_vars, runs, results),
                    task_vars,
                    check_mode,
                    preconditions=False,
                )
            except AnsibleError as exc:
                outcome = {"failed": True, "msg": (str(exc).splitlines() or [repr(exc)])[0]}
            if outcome.get("failed"):
                # Its role decides again and says why it cannot run (missing upstream, ...).
                runs[stage] = "pending"
                to_run.append(stage)
                lines.append(f"{stage}: decided by its role ({outcome.get('msg', '')})")
                continue
            runs, results = dict(outcome["stage_runs"]), dict(outcome["run_results"])
            decided[stage] = {"fingerprint": outcome["fingerprint"], "reason": outcome["reason"]}
            if outcome["redo"]:
                to_run.append(stage)
            lines.append(outcome["msg"])
        self._templar = base
        # Up to date, or passed earlier in this play (npu_env): an earlier run's failure record
        # of it no longer stands.
        failures = (task_vars.get("specfleet_session") or {}).get("failures") or {}
        forget = [
            stage
            for stage in failures
            if (results.get(stage) or {}).get("status") in ("ran", "up_to_date")
        ]
        if forget and not check_mode:
            self._forget(forget, str(self._value("specfleet_state_dir")))
        plan = {"run": to_run, "decided": decided}
        set_facts(
            self,
            {
                "specfleet_stage_runs": runs,
                "specfleet_run_results": results,
                "specfleet_stage_plan": plan,
            },
        )
        result.update(
            changed=bool(forget) and not check_mode,
            msg="; ".join(lines) or "no stage of this play selected",
            specfleet_stage_plan=plan,
            # One line per stage (plugins/callback/progress.py prints each).
            specfleet_plan=lines,
        )
        return result

    def _stage_scope(self, stage: str, task_vars: Mapping[str, Any]) -> ChainMap:
        """What the tasks of the stage's decision see: roles/stage/tasks/begin.yml, imported by
        the stage role with stage_name set: the stage role's vars and defaults, then the
        stage's own role's, under the host's variables."""
        own = role_scope(self._loader, stage, task_vars)
        return ChainMap({"stage_name": stage}, role_scope(self._loader, "stage", own))

    def _needed_ahead(
        self, stage: str, task_vars: Mapping[str, Any], runs: Mapping[str, str], to_run: list[str]
    ) -> list[str]:
        """The stages it needs that are about to run in this play (none: it is decided)."""
        if not to_run:
            return []
        found = find_upstream(self._templar, WHO, stage, self._declared(stage, task_vars), runs)
        return [s for s in found["needs"] if s in to_run]

    def _decision_args(
        self,
        stage: str,
        task_vars: Mapping[str, Any],
        runs: Mapping[str, str],
        results: Mapping[str, Any],
    ) -> dict[str, Any]:
        session = task_vars.get("specfleet_session") or {}
        verification = session.get("verification") or {}
        return {
            "stage": stage,
            **DECISION_ARGS,
            "script_template": self._value("stage_script_template | default('', true) or none"),
            "stamp": (session.get("stamps") or {}).get(stage) or {},
            "forced": stage in (self._value("specfleet_force_stages") or []),
            "prechecked": verification.get(stage),
            "failure_recorded": stage in (session.get("failures") or {}),
            "stage_runs": dict(runs),
            "run_results": dict(results),
            "state_dir": str(self._value("specfleet_state_dir")),
            "python": str(self._value("specfleet_host_python")),
            "env": session.get("env") or {},
        }

    def _value(self, expression: str) -> Any:
        """An expression, templated in the stage role's scope."""
        return self._templar.template(trust_as_template("{{ " + expression + " }}"))

    def _plan_options(self) -> list[str]:
        args = dict(self._task.args)
        unknown = set(args) - set(OPTIONS)
        if unknown or "stages" not in args:
            raise AnsibleActionFail(f"{WHO}: unknown option(s) {sorted(unknown)}; expected stages")
        stages = args["stages"]
        if not isinstance(stages, list) or not all(isinstance(v, str) for v in stages):
            raise AnsibleActionFail(f"{WHO}: stages must be a list of stage names")
        return list(stages)
