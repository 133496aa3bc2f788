"""specfleet_session: a play's start on a host, in one task (roles/session/tasks/open.yml).

In a run's first play, in order:

1. python_helpers: the controller packs them (specfleet_helpers.bundle, the reproducible zip)
   and compares the zip's sha1 with the host's copy; a host without them, or with other ones,
   gets this run's beside the ones in place (another run may still be using those), which run
   only this run's lock until it holds the host lock, and then take their place. In --check
   mode, where nothing of the work root may be created, they run from a scratch copy, like
   Ansible's own modules.
2. the host lock (specfleet_helpers.host.session open: the work root's layout, the lock, the
   stamps and failure records, the checksums of the files the play writes, and the
   verification of every stage the run may skip): first without waiting; a lock held by a run
   of this controller whose ansible-playbook is gone is a dead run's, taken over at once; a
   live run's is waited for (`wait_s`), then the host stops with the holder named. A takeover
   and a work root directory whose mode was set again are reported as changes.
3. the facts the stages read: `specfleet_session`, the session's record: what earlier runs
   left (`stamps`, `failures`, the `environment` npu_env recorded, the `verification` of the
   stamped stages, the checksums of the play's `files`) and the run's own (`token`, `started`,
   `env`: how a helper runs on the host, `lock_held`, the `restored_modes` of the layout it set
   again); and the first values of specfleet_stage_runs, specfleet_outputs (each stage's
   declared outputs read from its stamp, plugins/filter/outputs.py) and specfleet_run_results,
   which the stages update (docs/architecture.md, "Facts that cross roles").

A later play of the same run finds the session started and only refreshes the lock's
heartbeat (a lock another controller took over as stale stops the host there).

    - name: Start this run's session on the host
      specfleet.ascend.specfleet_session:
        root: "{{ specfleet_root }}"
        ...                       # see OPTIONS; roles/session/tasks/open.yml gives them all

Why one task: the same steps as tasks cost 15 of every run's tasks per host, no-op runs
included, each a worker process and its templating on the controller.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import shlex
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.text.converters import to_text
from ansible.plugins.action import ActionBase
from ansible_collections.specfleet.ascend.plugins.action.specfleet_command import shell_command
from ansible_collections.specfleet.ascend.plugins.filter.outputs import stamps_outputs
from ansible_collections.specfleet.ascend.plugins.plugin_utils.facts import set_facts
from ansible_collections.specfleet.ascend.plugins.plugin_utils.tags import selected

WHO = "specfleet_session"
HELPERS = Path(__file__).resolve().parents[2] / "python_helpers"
OPTIONS: dict[str, type | tuple[type, ...]] = {
    "root": str,  # specfleet_root
    "python": str,  # the host's Python for the helpers (specfleet_host_python)
    "env": Mapping,  # specfleet_helper_env
    "bundle": str,  # where the controller writes the helpers' zip
    "layout": list,  # the work root's directories
    "files": list,  # the files the play writes only when they changed (their sha1 and mode)
    # the stages the run may skip, whose stamps are verified now: those --tags lets run (the
    # plan's rule, plugin_utils/tags.py)
    "verify": list,
    "stale_after_s": int,  # specfleet_lock_stale_s
    "wait_s": int,  # specfleet_lock_wait_s
}
REQUIRED = set(OPTIONS)
# host_lock's exit status for a lock another run holds.
HELD = 4


def helpers_dir_on_path() -> None:
    if str(HELPERS) not in sys.path:
        sys.path.append(str(HELPERS))


def to_verify(stages: list[str], task_vars: Mapping[str, Any]) -> list[str]:
    """The stages whose stamps the session verifies ahead: of those the run may skip, the ones
    --tags / --skip-tags let run (the plan decides those, and reuses the verification)."""
    return [stage for stage in stages if selected([stage], task_vars)]


def dead_owner(holder: Mapping[str, Any], token: str, controller: str) -> bool:
    """A lock held by another run of this controller whose ansible-playbook process is gone."""
    owner = holder.get("owner") or {}
    pid = str(owner.get("pid") or "")
    return (
        bool(holder.get("token"))
        and holder.get("token") != token
        and owner.get("controller") == controller
        and pid.isdigit()
        and not Path(f"/proc/{pid}").is_dir()
    )


class ActionModule(ActionBase):
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        args = self._options()
        args["verify"] = to_verify(args["verify"], task_vars)
        check_mode = bool(self._task.check_mode)
        result["changed"] = False
        if task_vars.get("specfleet_session"):
            return self._heartbeat(result, args, task_vars["specfleet_session"], check_mode)

        token = self._new_token()
        env = dict(args["env"])
        lib = f"{args['root']}/lib/specfleet_helpers.zip"
        bundle = self._bundle(args["bundle"])
        on_host = self._run(["sha1sum", "--", lib])
        current = to_text(on_host.get("stdout", "")).split()
        incoming = ""
        if not current or current[0] != bundle["sha1"]:
            if check_mode:
                env["PYTHONPATH"] = self._ship_scratch(bundle["path"])
            else:
                self._ensure(["mkdir", "-p", "-m", "0750", "--", *args["layout"]])
                incoming = f"{args['root']}/lib/specfleet_helpers.{bundle['sha1'][:12]}.zip"
                self._ship(bundle["path"], incoming)
                env["PYTHONPATH"] = incoming
                result["changed"] = True
                result["shipped"] = incoming

        opened: dict[str, Any] = {}
        if not check_mode:
            opened = self._lock(args, token, env, self._owner(task_vars))
            if incoming:
                self._ensure(["mv", "-f", "--", incoming, lib])
                env["PYTHONPATH"] = lib
            broke = opened.get("broke")
            if isinstance(broke, Mapping):
                result["changed"] = True
                result["took_over"] = (
                    f"took over the host lock of run {broke.get('token')} ({broke.get('why')})"
                )
            restored = opened.get("restored_modes") or []
            if restored:
                result["changed"] = True
                result["restored_modes"] = f"set the mode again: {', '.join(restored)}"
            state = opened.get("state") or {}
        else:
            done = self._run(
                [args["python"], "-m", "specfleet_helpers.host.stamps",
                 f"--state-dir={args['root']}/state", "--manifest-counts"], env,
            )  # fmt: skip
            if done.get("rc") != 0:
                raise AnsibleActionFail(
                    f"{WHO}: reading the stamps failed: {to_text(done.get('stderr', '')).strip()}"
                )
            state = json.loads(to_text(done.get("stdout", "")))

        stamps = state.get("stamps") or {}
        runs = {stage: stamp.get("run_id", "unknown") for stage, stamp in stamps.items()}
        runs.update(task_vars.get("specfleet_stage_runs") or {})
        # The declarations as written: their outputs are paths, no templates.
        outputs = stamps_outputs(stamps, task_vars.get("specfleet_stages") or {})
        outputs.update(task_vars.get("specfleet_outputs") or {})
        facts = {
            "specfleet_session": {
                "token": token,
                "started": time.time(),
                "env": env,
                "stamps": stamps,
                "failures": state.get("failures") or {},
                # npu_env.json as an earlier run's npu_env recorded it: the memory plan it keeps.
                "environment": state.get("environment") or {},
                "verification": opened.get("verification") or {},
                "files": opened.get("files") or {},
                "lock_held": not check_mode,
                # The layout's directories whose mode was set again (the report's warnings).
                "restored_modes": opened.get("restored_modes") or [],
            },
            "specfleet_run_results": task_vars.get("specfleet_run_results") or {},
            "specfleet_stage_runs": runs,
            "specfleet_outputs": outputs,
        }
        set_facts(self, facts)
        result["msg"] = self._summary(args["root"], result, stamps, check_mode)
        # Shown without -v: a dead run's lock taken over or modes repaired are worth a line.
        said = [result[k] for k in ("took_over", "restored_modes") if k in result]
        if said:
            result["warnings"] = said
        return result

    # --- the steps -----------------------------------------------------------------------

    def _heartbeat(
        self, result: dict[str, Any], args: Mapping[str, Any], session: Mapping[str, Any],
        check_mode: bool,
    ) -> dict[str, Any]:  # fmt: skip
        """A later play: the lock is still this run's (its heartbeat refreshed)."""
        if check_mode or not session.get("lock_held"):
            result["msg"] = "session started by an earlier play of this run"
            return result
        done = self._run(
            [args["python"], "-m", "specfleet_helpers.host.host_lock", "heartbeat",
             f"--lock={args['root']}/run/lock.json",
             f"--token={session.get('token')}"],
            session.get("env") or args["env"],
        )  # fmt: skip
        if done.get("rc") != 0:
            result.update(
                failed=True,
                msg=to_text(done.get("stderr") or done.get("stdout") or "").strip()
                or "the host lock is no longer this run's",
            )
            return result
        result["msg"] = "the host lock is still this run's"
        return result

    @staticmethod
    def _owner(task_vars: Mapping[str, Any]) -> dict[str, str]:
        """Who holds the lock: this controller, its ansible-playbook, the user, the play."""
        return {
            "controller": socket.gethostname(),
            "pid": os.environ.get("SPECFLEET_CONTROLLER_PID", ""),
            "user": getpass.getuser(),
            "play": str(task_vars.get("ansible_play_name", "")),
        }

    def _lock(
        self, args: Mapping[str, Any], token: str, env: Mapping[str, Any], owner: Mapping[str, str]
    ) -> dict[str, Any]:
        """session open: first without waiting; a dead run's lock taken over, a live run's waited
        for. Raises with the holder named when it stays held."""
        argv = [
            args["python"], "-m", "specfleet_helpers.host.session", "open",
            f"--lock={args['root']}/run/lock.json", f"--token={token}",
            "--owner=" + json.dumps(dict(owner)),
            f"--stale-after-s={args['stale_after_s']}", f"--state-dir={args['root']}/state",
            "--verify=" + ",".join(args["verify"]),
            *(f"--layout={d}" for d in args["layout"]),
            *(f"--file={f}" for f in args["files"]),
        ]  # fmt: skip
        done = self._run([*argv, "--wait-s=0"], env)
        if done.get("rc") == HELD:
            holder = self._json(done).get("holder") or {}
            extra = ["--wait-s=" + str(args["wait_s"])]
            if dead_owner(holder, token, owner["controller"]):
                extra.append(f"--break-token={holder.get('token')}")
            done = self._run([*argv, *extra], env)
        if done.get("rc") != 0:
            stderr = to_text(done.get("stderr", "")).strip()
            raise AnsibleActionFail(stderr or to_text(done.get("stdout", "")).strip())
        return self._json(done)

    def _bundle(self, path: str) -> dict[str, str]:
        """The helpers' zip, written on the controller (specfleet_helpers.bundle)."""
        helpers_dir_on_path()
        from specfleet_helpers import bundle

        try:
            out = bundle.build(Path(path))
        except OSError as exc:
            raise AnsibleActionFail(f"{WHO}: cannot write the helpers' zip {path}: {exc}") from exc
        return {"path": str(out), "sha1": bundle.sha1(out)}

    def _ship(self, local: str, remote: str) -> None:
        """The zip to `remote` on the host, mode 0640, through Ansible's remote tmp (become
        applies to the final move, as the copy module does it)."""
        tmp = self._make_tmp_path()
        staged = self._connection._shell.join_path(tmp, "specfleet_helpers.zip")
        self._transfer_file(local, staged)
        self._fixup_perms2((tmp, staged))
        self._ensure(["install", "-m", "0640", "--", staged, remote])
        self._remove_tmp_path(tmp)

    def _ship_scratch(self, local: str) -> str:
        """--check: the zip in a scratch directory of its own; its path."""
        done = self._run(["mktemp", "-d", "--suffix=.specfleet-check"])
        scratch = to_text(done.get("stdout", "")).strip()
        if done.get("rc") != 0 or not scratch:
            raise AnsibleActionFail(f"{WHO}: no scratch directory on the host for the helpers")
        target = f"{scratch}/specfleet_helpers.zip"
        self._ship(local, target)
        return target

    @staticmethod
    def _new_token() -> str:
        pid = os.environ.get("SPECFLEET_CONTROLLER_PID", "0")
        stamp = hashlib.sha1(str(time.time()).encode()).hexdigest()[:12]
        return f"{pid}-{stamp}"

    # --- plumbing ------------------------------------------------------------------------

    def _run(self, argv: list[str], env: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return self._low_level_execute_command(shell_command(argv, env))

    def _ensure(self, argv: list[str]) -> None:
        done = self._run(argv)
        if done.get("rc") != 0:
            raise AnsibleActionFail(
                f"{WHO}: {shlex.join(argv)} failed: {to_text(done.get('stderr', '')).strip()}"
            )

    @staticmethod
    def _json(done: Mapping[str, Any]) -> dict[str, Any]:
        lines = to_text(done.get("stdout", "")).strip().splitlines()
        try:
            return json.loads(lines[-1]) if lines else {}
        except ValueError:
            return {}

    def _summary(
        self, root: str, result: Mapping[str, Any], stamps: Mapping[str, Any], check: bool
    ) -> str:
        said = [result[k] for k in ("took_over", "restored_modes") if k in result]
        held = "no lock in --check mode" if check else "the host lock held"
        return "; ".join([f"work root {root}: {held}; {len(stamps)} stamps of earlier runs", *said])

    def _options(self) -> dict[str, Any]:
        args = dict(self._task.args)
        unknown = set(args) - set(OPTIONS)
        missing = REQUIRED - set(args)
        if unknown or missing:
            raise AnsibleActionFail(
                f"{WHO}: unknown option(s) {sorted(unknown)}, missing {sorted(missing)}"
            )
        for name, value in args.items():
            if not isinstance(value, OPTIONS[name]):
                raise AnsibleActionFail(
                    f"{WHO}: {name} is a {type(value).__name__}, expected {OPTIONS[name]}"
                )
        return args
