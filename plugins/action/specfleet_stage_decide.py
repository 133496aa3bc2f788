"""specfleet_stage_decide: whether one stage must run, in one task (roles/stage/tasks/begin.yml).

First its upstream stages, from its declaration's needs and needs_if
(plugins/plugin_utils/upstream.py): one with neither a stamp nor a run in this play fails the
task before any work, naming what to run; in --check mode, when one would run, this stage is
planned as would-run too (it cannot be planned without their artifacts) and nothing else is
templated: `pending` names them and `redo` is false, so the role's work is skipped. Otherwise
they are `stage_upstream` ({needs, run_ids, missing, pending}) for everything templated after:
the `upstream` input is their run ids, so a redone upstream stage redoes this one. It is set as
a fact too, for the role's later tasks.

Then the stage's declared preconditions (roles/specfleet/vars/main/stages.yml), rules on its
settings against what its upstream stages made, checked as specfleet_rules checks rules
(plugins/plugin_utils/rules.py): the first refusal fails the task with its message, before
anything else is templated. Then the stage's declared inputs and its rendered script are
hashed into a fingerprint and compared with its stamp. A forced stage, a missing stamp or a
changed fingerprint gives the reason to run at once; otherwise the artifacts of the previous
run are checked by the one verifier (checks/stage_verify.py: every file the stamp lists, then
the stage's checker), whose failure is the reason. The verification that opening the session
already made for this play (session open --verify) stands for that check while the checker is
the one the stamp recorded; without it the check runs on the host, in check mode too (it only
reads; an older stamp is given its file list only in a real run).

A stage that stays up to date drops the failure record an earlier run left. The plan line
(`<stage>: up to date, skipping (stamp <fingerprint>)` / `running: <reason>` /
`would run: <reason>`) is the result's `msg` and `specfleet_plan`, which the specfleet_progress
callback prints as `[host] <line>` (the result itself is long: it holds the script).

    - name: "Plan: {{ stage_name }}"
      specfleet.ascend.specfleet_stage_decide:
        stage: train
        inputs: "{{ stage_declared.inputs }}"
        script_template: "{{ stage_script_template }}"   # or script: the text, rendered
        ...
      register: stage_decision

The script template is rendered as lookup('ansible.builtin.template') renders it, without the
lookup's copy of every variable of the task (_render_script).

Returns redo, reason, pending, fingerprint, inputs (with script_sha256), script, previous (the
stamp), checker, stage_runs / run_results (the play's specfleet_stage_runs and
specfleet_run_results with this stage's entry) and metrics (the stamp's; finish.yml puts a
new run's in their place). It sets those two as facts, with stage_upstream, as set_fact would: a
set_fact task of its own after every decision cost each stage a task on every run, no-op runs
included. A stage's outputs are not its decision's business: the session read them from the
stamps, and a stage that runs publishes its new ones when it ends (plugins/filter/outputs.py).
"""

from __future__ import annotations

import json
import shlex
from collections import ChainMap
from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleActionFail, AnsibleFileNotFound
from ansible.module_utils.common.text.converters import to_text
from ansible.plugins.action import ActionBase
from ansible.plugins.filter.core import get_hash
from ansible_collections.specfleet.ascend.plugins.plugin_utils.compiled_once import compiled_once
from ansible_collections.specfleet.ascend.plugins.plugin_utils.facts import set_facts
from ansible_collections.specfleet.ascend.plugins.plugin_utils.fingerprint import fingerprint
from ansible_collections.specfleet.ascend.plugins.plugin_utils.rules import check_rules
from ansible_collections.specfleet.ascend.plugins.plugin_utils.templates import render_file
from ansible_collections.specfleet.ascend.plugins.plugin_utils.upstream import (
    find_upstream,
    graph_entry,
    missing_message,
    pending_plan,
)

WHO = "specfleet_stage_decide"

# What the check prints at most into the reason (the stamp and the report show the reason).
REASON_OUTPUT_CHARS = 300

OPTIONS: dict[str, type | tuple[type, ...]] = {
    "stage": str,
    "inputs": Mapping,
    "script": (str, type(None)),
    "script_template": (str, type(None)),
    "stamp": Mapping,
    "forced": bool,
    "verifier": (list, str),
    "unlisted": list,
    "prechecked": (Mapping, type(None)),
    "failure_recorded": bool,
    # The play's plan of this stage ({fingerprint, reason}: specfleet_stage_plan.decided).
    "planned": (Mapping, type(None)),
    "stage_runs": Mapping,
    "run_results": Mapping,
    "state_dir": str,
    "python": str,
    "env": Mapping,
}
REQUIRED = {"stage", "inputs", "stamp", "state_dir", "python"}
# Templated by the action once the stage's preconditions hold, not before the task: a refused
# precondition names the setting, where templating what it guards could fail obscurely.
LAZY = ("inputs", "script", "verifier", "unlisted")


def changed_inputs(inputs: Mapping[str, Any], previous: Mapping[str, Any]) -> list[str]:
    """The names whose value differs, or that only one side has."""
    return sorted(
        name
        for name in set(inputs) | set(previous)
        if inputs.get(name, ...) != previous.get(name, ...)
    )


def plan(
    inputs: Mapping[str, Any],
    stamp: Mapping[str, Any],
    forced: bool,
    script: str | None = None,
) -> dict[str, Any]:
    """{inputs, fingerprint, reason}: reason is why the stage must run, '' when its stamp still
    matches (its artifacts are then checked). A rendered `script` is an input too, as
    `script_sha256`: a changed command line redoes the stage."""
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
    return {"inputs": dict(inputs), "fingerprint": current, "reason": reason}


def usable_precheck(
    prechecked: Mapping[str, Any] | None, stamp: Mapping[str, Any], verifier: Any
) -> Mapping[str, Any] | None:
    """The session's verification of this stage, when it checked what this check would: the
    stamp has a file list and recorded this very checker."""
    if not isinstance(prechecked, Mapping) or "manifest" not in stamp:
        return None
    return prechecked if stamp.get("verify_argv") == verifier else None


def check_problem(check: Mapping[str, Any]) -> str:
    """'' when the artifacts verified, else what is wrong: the failed checker's own output, or
    the problem stage_verify found (what `stage_verify check --reason` prints)."""
    if check.get("status") == "ok":
        return ""
    return str(check.get("output") or check.get("problem") or "verification failed").strip()


def plan_line(stage: str, redo: bool, reason: str, fingerprint_: str, check_mode: bool) -> str:
    if not redo:
        return f"{stage}: up to date, skipping (stamp {fingerprint_[:12]})"
    return f"{stage}: {'would run' if check_mode else 'running'}: {reason}"


def truncated(text: str, limit: int = REASON_OUTPUT_CHARS, leeway: int = 5) -> str:
    """What Jinja's `truncate(limit)` gives: kept whole within `limit` (+ its leeway of 5),
    else cut at the last whole word before `limit` - 3 and ended with '...'."""
    if len(text) <= limit + leeway:
        return text
    return text[: limit - 3].rsplit(" ", 1)[0] + "..."


def refused(stage: str) -> dict[str, Any]:
    """What a decision that refuses its stage (an upstream stage missing, a precondition not
    holding) registers besides its message: the stage, and an empty reason, as every decision
    registers one (roles/stage/tasks/failed.yml records it)."""
    return {"failed": True, "changed": False, "stage": stage, "reason": ""}


class ActionModule(ActionBase):
    _supports_check_mode = True
    _supports_async = False

    @classmethod
    def finalize_task_arg(cls, name: str, value: Any, templar: Any, context: Any) -> Any:
        if name in LAZY:
            return value
        return super().finalize_task_arg(name, value, templar, context)

    @compiled_once()
    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        args = self._options()
        decided, facts = self.decide(args, task_vars or {}, bool(self._task.check_mode))
        result.update(decided)
        if decided.get("forget") and not self._task.check_mode:
            self._forget([args["stage"]], args["state_dir"])
        if facts:
            set_facts(self, facts)
        return result

    def decide(
        self,
        args: dict[str, Any],
        task_vars: Mapping[str, Any],
        check_mode: bool,
        preconditions: bool = True,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """(the task's result, the facts it sets) for one stage, decided with self._templar
        (the stage role's variables). `forget` in the result: the stage is up to date and an
        earlier run's failure record of it is to be removed (the caller does, not in --check).
        `preconditions=False` leaves the declared preconditions to the stage role's own
        decision (the play's plan: plugins/action/specfleet_stage_plan.py)."""
        result: dict[str, Any] = {}
        stage: str = args["stage"]
        declared = self._declared(stage, task_vars)
        runs = dict(args.get("stage_runs") or {})
        found = find_upstream(self._templar, WHO, stage, declared, runs)
        if found["missing"]:
            result.update(found, **refused(stage))
            result["msg"] = missing_message(
                stage,
                found["missing"],
                self._provides(found["missing"], task_vars),
                str(task_vars.get("inventory_hostname", "")),
            )
            return result, {}
        if found["pending"] and check_mode:
            planned = pending_plan(stage, found["pending"], runs, args.get("run_results") or {})
            result.update(planned, changed=False, stage=stage, redo=False, pending=found["pending"])
            result["specfleet_plan"] = result["msg"]  # printed by the progress callback
            return result, {
                "specfleet_stage_runs": planned["stage_runs"],
                "specfleet_run_results": planned["run_results"],
                "stage_upstream": found,
            }
        found["pending"] = []
        # Everything templated from here on reads the upstream stages as stage_upstream.
        self._templar = self._templar.copy_with_new_env(
            available_variables=ChainMap(
                {"stage_upstream": found}, self._templar.available_variables
            )
        )
        if preconditions:
            refusal = self._preconditions(declared.get("preconditions"))
            if refusal:
                result.update(refusal, **refused(stage))
                return result, {}
        args.update(self._templated(args, LAZY))
        if args.get("script_template"):
            args["script"] = self._render_script(str(args["script_template"]))
        stamp: Mapping[str, Any] = args["stamp"]
        decided = plan(args["inputs"], stamp, args.get("forced", False), args.get("script"))
        verifier = args.get("verifier", [])
        changed = False
        reason = decided["reason"]
        live: Mapping[str, Any] = {}
        planned = args.get("planned")
        # The play's plan verified these very inputs a moment ago and found the artifacts
        # wanting: its reason stands, without a second verification.
        if (
            not reason
            and isinstance(planned, Mapping)
            and planned.get("fingerprint") == decided["fingerprint"]
            and planned.get("reason")
        ):
            reason = str(planned["reason"])
        if not reason:
            check = usable_precheck(args.get("prechecked"), stamp, verifier)
            if check is None:
                check = self._check_on_host(args, stage, verifier, check_mode)
                changed = bool(check.get("recorded"))
            problem = check_problem(check)
            if problem:
                reason = "artifacts no longer valid: " + truncated(problem)
            live = check.get("live") or {}
        redo = bool(reason)
        # Up to date means it passed: an earlier run's failure record no longer stands.
        forget = not redo and args.get("failure_recorded", False)
        changed = changed or forget
        stage_runs = dict(args.get("stage_runs") or {})
        stage_runs[stage] = "pending" if redo else stamp.get("run_id", "unknown")
        run_results = dict(args.get("run_results") or {})
        if not redo or check_mode:
            # A stage that runs is noted when it ends (finish.yml, failed.yml).
            run_results[stage] = {
                "status": "would_run" if redo else "up_to_date",
                "reason": reason,
                "duration_s": None,
            }
        result.update(
            changed=changed,
            forget=forget,
            msg=plan_line(stage, redo, reason, decided["fingerprint"], check_mode),
            stage=stage,
            redo=redo,
            reason=reason,
            pending=[],
            fingerprint=decided["fingerprint"],
            inputs=decided["inputs"],
            script=args.get("script"),
            previous=dict(stamp),
            # What a stage that is not redone reports: its stamp's metrics, with what its checker
            # saw of anything running now (live_*: the deployed service's pid and restarts).
            metrics={**(stamp.get("metrics") or {}), **live},
            checker=verifier,
            stage_runs=stage_runs,
            run_results=run_results,
        )
        # What a user reads of this task (plugins/callback/progress.py prints it).
        result["specfleet_plan"] = result["msg"]
        return result, {
            "specfleet_stage_runs": stage_runs,
            "specfleet_run_results": run_results,
            "stage_upstream": found,
        }

    def _forget(self, stages: list[str], state_dir: str) -> None:
        """Remove the failure records earlier runs left of `stages`, now up to date."""
        records = [f"{state_dir}/{stage}.failed.json" for stage in stages]
        done = self._on_host(["rm", "-f", "--", *records], {})
        if done.get("rc") != 0:
            raise AnsibleActionFail(
                f"{', '.join(stages)} up to date, but the earlier failure record(s) "
                f"{', '.join(records)} could not be removed: "
                f"{to_text(done.get('stderr', '')).strip()}"
            )

    @staticmethod
    def _declared(stage: str, task_vars: Mapping[str, Any]) -> Mapping[str, Any]:
        """The stage's declaration as written (roles/specfleet/vars/main/stages.yml), not
        templated: its preconditions are templated rule by rule. {} where there is none (a
        test's own stage)."""
        declared = task_vars.get("specfleet_stages")
        entry = declared.get(stage) if isinstance(declared, Mapping) else None
        return entry if isinstance(entry, Mapping) else {}

    def _provides(self, stages: list[str], task_vars: Mapping[str, Any]) -> dict[str, str]:
        """What each of `stages` provides, from its declaration: for the missing message."""
        provides: dict[str, str] = {}
        for name in stages:
            entry = self._declared(name, task_vars)
            if "provides" in entry:
                provides[name] = str(graph_entry(self._templar, entry).get("provides", ""))
        return provides

    def _preconditions(self, rules: Any) -> dict[str, Any] | None:
        """The first refused precondition ({msg, rule, assertion}), or None."""
        if rules is None:
            return None
        if not isinstance(rules, list):
            raise AnsibleActionFail(
                "specfleet_stage_decide: the stage's preconditions must be a list of rules"
            )
        counts: dict[str, int] = {}
        return check_rules(
            self._templar, rules, self._templar.available_variables, counts, "preconditions"
        )

    def _render_script(self, path: str) -> str:
        """The stage's script template, rendered as lookup('ansible.builtin.template') renders
        it, without the lookup's copy of every variable (plugins/plugin_utils/templates.py)."""
        try:
            return render_file(self._templar, self._loader, path, self._templar.available_variables)
        except (OSError, AnsibleFileNotFound) as exc:
            raise AnsibleActionFail(
                f"specfleet_stage_decide: the script template {path} could not be read: {exc}"
            ) from exc

    def _templated(self, args: Mapping[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
        """The lazy options among `names`, templated and type-checked."""
        done: dict[str, Any] = {}
        for name in names:
            if name not in args:
                continue
            value = self._templar.template(args[name])
            if value is not None and not isinstance(value, OPTIONS[name]):
                raise AnsibleActionFail(
                    f"specfleet_stage_decide: {name} is a {type(value).__name__}, "
                    f"expected {OPTIONS[name]}"
                )
            done[name] = value
        if "inputs" in names and done.get("inputs") is None:
            raise AnsibleActionFail("specfleet_stage_decide: missing option(s) inputs")
        return done

    def _options(self) -> dict[str, Any]:
        args = dict(self._task.args)
        unknown = set(args) - set(OPTIONS)
        if unknown:
            raise AnsibleActionFail(
                f"specfleet_stage_decide: unknown option(s) {', '.join(sorted(unknown))}; "
                f"expected {', '.join(sorted(OPTIONS))}"
            )
        missing = REQUIRED - {k for k, v in args.items() if v is not None}
        if missing:
            raise AnsibleActionFail(
                f"specfleet_stage_decide: missing option(s) {', '.join(sorted(missing))}"
            )
        for name, value in args.items():
            if name in LAZY:
                continue  # type-checked once templated (_templated)
            if value is not None and not isinstance(value, OPTIONS[name]):
                raise AnsibleActionFail(
                    f"specfleet_stage_decide: {name} is a {type(value).__name__}, "
                    f"expected {OPTIONS[name]}"
                )
        return args

    def _check_on_host(
        self, args: Mapping[str, Any], stage: str, verifier: Any, check_mode: bool
    ) -> dict[str, Any]:
        """stage_verify check on the host: {status, output|problem, recorded}."""
        argv = [
            args["python"],
            "-m",
            "specfleet_helpers.checks.stage_verify",
            "check",
            f"--state-dir={args['state_dir']}",
            f"--stage={stage}",
            "--checker-json=" + json.dumps(verifier),
            "--reason",
        ]
        if not check_mode:
            # Only an older stamp gets its file list added (once, when it verified).
            argv += ["--record-missing", "--unlisted=" + ",".join(args.get("unlisted") or [])]
        done = self._on_host(argv, args.get("env") or {})
        stdout = to_text(done.get("stdout", "")).strip()
        if done.get("rc") == 0:
            return {"status": "ok", "recorded": stdout.endswith("(manifest recorded)")}
        stderr = to_text(done.get("stderr", "")).strip()
        return {"status": "failed", "output": f"{stdout} {stderr}".strip()}

    def _on_host(self, argv: list[str], env: Mapping[str, Any]) -> dict[str, Any]:
        """One command on the host, without a module: argv quoted for its shell, env by name."""
        command = shlex.join(argv)
        if env:
            command = shlex.join(["env", *(f"{k}={v}" for k, v in env.items())]) + " " + command
        return self._low_level_execute_command(command)
