"""Write the fleet report for a run that ended before its validate play.

site.yml ends with validate.yml, which writes the fleet report and points `latest` at it.
When every host of a play is lost (unreachable) part-way through the run, Ansible ends the
whole playbook there ("NO MORE HOSTS LEFT") and the validate play never starts: without this
callback `latest` would keep pointing at an older, possibly green, report. At the end of such
a run this callback writes the report from what the run recorded (which stages each host ran,
the connection errors), with `ended_early` saying where the run stopped, and moves `latest`
(check/latest in check mode) as validate.yml would.

It does nothing when the playbook has no validate play, when the validate play started (it
writes its own report), or when no host was lost: a run whose every host failed outside a
stage without losing one, such as a run refused by another run's host lock, leaves the
reports to the runs that hold the truth.

An interrupted run (Ctrl-C, AWX's cancel: SIGINT to ansible-playbook) is ended the same way,
and more: the stages run detached from Ansible, so they would go on, with the host locks held.
At the first SIGINT this notes where the run was; once Ansible has stopped its workers and is
exiting, it runs playbooks/interrupted.yml on the hosts the run reached, with the run's
inventory, extra vars and connection options and what the run recorded per host: every stage
still running is stopped, recorded as interrupted, the report written and the lock released.
A second Ctrl-C leaves that undone (the next run stops the leftovers and takes the lock over,
and says so). In --check mode nothing runs on the hosts, and nothing is left to stop.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import signal
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

from ansible import context
from ansible.plugins.callback import CallbackBase
from ansible.template import Templar

DOCUMENTATION = """
name: report_net
type: notification
short_description: the fleet report of a site.yml run that ended before its validate play
description:
  - When every host of a play was lost part-way through a run and Ansible ended the playbook
    before validate.yml, writes the fleet report from what the run recorded and moves latest.
requirements:
  - enable in ansible.cfg (callbacks_enabled)
"""

REPO = Path(__file__).resolve().parents[2]
HELPERS = REPO / "python_helpers"
VALIDATE_ROLE = "validate"

# The project's one atomic write (a leaf module, standard library only).
if str(HELPERS) not in sys.path:
    sys.path.append(str(HELPERS))
from specfleet_helpers.files import write_atomic  # noqa: E402


def report_id(now: datetime) -> str:
    """The id validate.yml's report.yml gives a report: UTC time and a short hash."""
    digest = hashlib.sha1(str(now.timestamp()).encode()).hexdigest()[:6]
    return f"{now.strftime('%Y%m%dT%H%M%SZ')}-{digest}"


def host_input(
    groups: list[str], lost: Optional[str], run: dict[str, Any], stopped: dict[str, Any]
) -> dict[str, Any]:
    """One host of the report's input, as hosts.json.j2 writes a host that has no collected
    state: what this run did on it (`run`) and, for a lost host, the connection error."""
    if lost is None and stopped.get("why") == "unreachable":
        lost = str(stopped.get("error") or "unreachable")
    return {
        "groups": groups,
        "reachable": lost is None,
        "wall_time_s": None,
        "settings": {},
        "state": None,
        "run": run,
        "unreachable_error": lost,
        "refused": (
            {"stage": str(stopped.get("stage")), "error": str(stopped.get("error"))}
            if stopped.get("why") == "refused"
            else None
        ),
    }


def report_input(
    rid: str,
    now: datetime,
    playbook: str,
    stages: list[str],
    hosts: dict[str, dict[str, Any]],
    ended_early: str,
    check_mode: bool,
) -> dict[str, Any]:
    return {
        "report_id": rid,
        "generated": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "playbook": playbook,
        "check_mode": check_mode,
        "limit": context.CLIARGS.get("subset"),
        "tags": [t for t in context.CLIARGS.get("tags") or [] if t != "all"],
        "stages": stages,
        "hosts": hosts,
        "ended_early": ended_early,
    }


# The run's command-line options that the interrupted run's ending repeats: how to reach the
# hosts and what they were given (context.CLIARGS key -> ansible-playbook option).
REPEATED_OPTIONS = {
    "inventory": "--inventory",
    "extra_vars": "--extra-vars",
    "vault_ids": "--vault-id",
    "vault_password_files": "--vault-password-file",
    "private_key_file": "--private-key",
    "remote_user": "--user",
    "connection": "--connection",
    "timeout": "--timeout",
    "ssh_common_args": "--ssh-common-args",
    "ssh_extra_args": "--ssh-extra-args",
    "scp_extra_args": "--scp-extra-args",
    "sftp_extra_args": "--sftp-extra-args",
    "become_method": "--become-method",
    "become_user": "--become-user",
    "forks": "--forks",
}
INTERRUPTED_PLAYBOOK = REPO / "playbooks" / "interrupted.yml"
# Set for the run that ends an interrupted one: a Ctrl-C there ends it as Ansible does, and
# leaves the rest to the next run.
ENDING_ENV = "SPECFLEET_ENDING_INTERRUPTED_RUN"


def interrupted_argv(cliargs: Any, hosts: list[str], record: dict[str, Any]) -> list[str]:
    """The ansible-playbook command that ends an interrupted run (playbooks/interrupted.yml) on
    `hosts`, with the run's own inventory, extra vars and connection options."""
    argv = [sys.executable, "-m", "ansible", "playbook", str(INTERRUPTED_PLAYBOOK)]
    for key, option in REPEATED_OPTIONS.items():
        value = cliargs.get(key)
        if value in (None, "", (), []) or (key == "timeout" and value == 0):
            continue
        for item in value if isinstance(value, (list, tuple)) else [value]:
            argv += [option, str(item)]
    if cliargs.get("become"):
        argv.append("--become")
    record_var = json.dumps({"specfleet_interrupted": record})
    argv += ["--limit", ",".join(hosts), "--extra-vars", record_var]
    return argv


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "notification"
    CALLBACK_NAME = "specfleet.ascend.report_net"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._playbook = ""
        self._validate_play: Any = None
        self._validate_started = False
        self._play: Any = None
        self._hosts: dict[str, Any] = {}  # name -> Host, in the order they were first seen
        self._lost: dict[str, str] = {}  # name -> connection error
        self._where = ""  # the play and task where the last host was lost
        self._task: Any = None
        self._interrupted = ""  # where the run was when it was interrupted
        self._main_pid = os.getpid()
        self._sigint: Any = None  # the handler this one defers to (Ansible's)

    # --- what the run does ----------------------------------------------------------------

    def v2_playbook_on_start(self, playbook: Any) -> None:
        self._playbook = os.path.basename(getattr(playbook, "_file_name", "") or "")
        for play in playbook.get_plays():
            if VALIDATE_ROLE in (role.get_name() for role in play.get_roles()):
                self._validate_play = play
        # Installed over Ansible's own (TaskQueueManager's), which it then calls: Ansible stops
        # its workers and ends the run as it always does, and this ends the hosts' work after.
        if (
            self._validate_play is not None
            and self._sigint is None
            and not os.environ.get(ENDING_ENV)
        ):
            self._sigint = signal.signal(signal.SIGINT, self._on_sigint)

    def v2_playbook_on_task_start(self, task: Any, is_conditional: bool) -> None:
        self._task = task

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if os.getpid() == self._main_pid and not self._interrupted:
            play = self._play.get_name() if self._play is not None else "the start"
            task = self._task.get_name() if self._task is not None else "none"
            self._interrupted = f"play {play!r}, task {task!r}"
            atexit.register(self._end_interrupted_run)
        previous = self._sigint
        if callable(previous):
            previous(signum, frame)
        else:
            raise KeyboardInterrupt

    def _end_interrupted_run(self) -> None:
        """After Ansible has ended the interrupted run: stop the hosts' stages, release their
        locks, write the report (playbooks/interrupted.yml)."""
        if context.CLIARGS.get("check"):
            self._display.display(
                f"specfleet: interrupted at {self._interrupted} "
                "(check mode: nothing ran on the hosts)",
                color="red",
            )
            return
        if context.CLIARGS.get("ask_pass") or context.CLIARGS.get("become_ask_pass"):
            self._display.display(
                f"specfleet: interrupted at {self._interrupted}. The passwords given at the "
                "prompt cannot be asked again: the next run stops what is left running and "
                "takes the host locks over",
                color="red",
            )
            return
        hosts, record = self._interrupted_record()
        if not hosts:
            return
        self._display.display(
            f"specfleet: interrupted at {self._interrupted}. Stopping the stages still running on "
            f"{len(hosts)} host(s), releasing the host locks and writing the report "
            "(Ctrl-C again leaves that to the next run)...",
            color="red",
        )
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        try:
            # Ansible made its stdio non-inheritable (TaskQueueManager): given as descriptors,
            # the child gets the run's own stdout and stderr again.
            subprocess.run(
                interrupted_argv(context.CLIARGS, hosts, record),
                # The same working directory and environment: the same ansible.cfg.
                env={**os.environ, ENDING_ENV: "1"},
                stdin=subprocess.DEVNULL,
                stdout=1,
                stderr=2,
                check=False,
            )
        except Exception as exc:  # the run is over either way; say what was left
            self._display.warning(
                f"specfleet: could not end the interrupted run's work ({exc}): the next run "
                "stops what is left and takes the host locks over"
            )

    def _interrupted_record(self) -> tuple[list[str], dict[str, Any]]:
        """The hosts the run reached and had not lost, with what it recorded on each: the
        stages' results, the lock token, when it started there."""
        hosts: dict[str, Any] = {}
        for name, host in self._hosts.items():
            if name in self._lost:
                continue
            facts = self._vars(host)
            session = facts.get("specfleet_session") or {}
            if facts.get("specfleet_host_stopped") or not session.get("token"):
                continue  # unreachable, refused, or the run took no lock there
            hosts[name] = {
                "run": dict(facts.get("specfleet_run_results") or {}),
                "token": str(session["token"]),
                "started": session.get("started"),
            }
        return list(hosts), {"where": self._interrupted, "hosts": hosts}

    def v2_playbook_on_play_start(self, play: Any) -> None:
        self._play = play
        # the play that starts is a copy of the playbook's (TaskQueueManager.run): same _uuid
        validate = self._validate_play
        if validate is not None and getattr(play, "_uuid", None) == validate._uuid:
            self._validate_started = True

    def _seen(self, result: Any) -> None:
        self._hosts.setdefault(result._host.get_name(), result._host)

    def v2_runner_on_ok(self, result: Any) -> None:
        self._seen(result)

    def v2_runner_on_failed(self, result: Any, ignore_errors: bool = False) -> None:
        self._seen(result)

    def v2_runner_on_skipped(self, result: Any) -> None:
        self._seen(result)

    def v2_runner_on_unreachable(self, result: Any) -> None:
        self._seen(result)
        message = str(result._result.get("msg") or "unreachable")
        self._lost[result._host.get_name()] = message.removeprefix("Task failed: ").strip()
        play = self._play.get_name() if self._play is not None else "?"
        self._where = f"play {play!r}, task {result._task.get_name()!r}"

    # --- the end of the run ---------------------------------------------------------------

    def v2_playbook_on_stats(self, stats: Any) -> None:
        if self._validate_play is None or self._validate_started or not self._lost:
            return
        try:
            written = self._write_report()
        except Exception as exc:  # a report problem must not hide the run's own failure
            self._display.warning(
                f"specfleet: the run ended before its report ({self._where}), and the "
                f"report could not be written: {exc}"
            )
            return
        self._display.display(
            f"specfleet: the run ended before its report ({self._where}): every host of "
            f"that play was lost or had failed. Report written from what the run recorded: "
            f"{written / 'fleet.md'}",
            color="red",
        )

    def _vars(self, host: Any) -> dict[str, Any]:
        """The validate play's view of a host's variables: its facts, the project's defaults."""
        manager = self._validate_play.get_variable_manager()
        return manager.get_vars(play=self._validate_play, host=host)

    def _write_report(self) -> Path:
        first = next(iter(self._hosts.values()))
        play_vars = self._vars(first)
        loader = self._validate_play._loader
        # playbook_dir, which the report directory's default derives from, is the validate
        # play's own directory, as when that play runs (validate.yml is in playbooks/).
        included = getattr(self._validate_play, "_included_path", None)
        if included:
            loader.set_basedir(included)
        templar = Templar(loader=loader, variables=play_vars)
        reports = Path(str(templar.template(play_vars["validate_reports_dir"])))
        stages = [str(s) for s in templar.template(play_vars["validate_stages"])]
        hosts = {}
        for name, host in self._hosts.items():
            facts = self._vars(host)
            hosts[name] = host_input(
                groups=[str(g) for g in facts.get("group_names") or []],
                lost=self._lost.get(name),
                run=dict(facts.get("specfleet_run_results") or {}),
                stopped=dict(facts.get("specfleet_host_stopped") or {}),
            )
        now = datetime.now(timezone.utc)
        rid = report_id(now)
        check_mode = bool(context.CLIARGS.get("check"))
        base = reports / "check" if check_mode else reports
        out = base / rid
        out.mkdir(parents=True, exist_ok=True)
        ended = (
            f"at {self._where} every host of the play was lost or had failed, and Ansible "
            "ended the playbook before its validate play"
        )
        doc = report_input(rid, now, self._playbook, stages, hosts, ended, check_mode)
        write_atomic(out / "hosts.json", json.dumps(doc, default=str))
        env = {
            **os.environ,
            "PYTHONPATH": str(HELPERS),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        command = [sys.executable, "-m", "specfleet_helpers.report.fleet_report"]
        done = subprocess.run(
            [
                *command,
                f"--input={out / 'hosts.json'}",
                f"--out-dir={out}",
                f"--latest={base / 'latest'}",
                f"--index={base}",
            ],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"fleet_report exited {done.returncode}: {done.stderr.strip()}")
        return out
