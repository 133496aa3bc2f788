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
"""

from __future__ import annotations

import hashlib
import json
import os
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

    # --- what the run does ----------------------------------------------------------------

    def v2_playbook_on_start(self, playbook: Any) -> None:
        self._playbook = os.path.basename(getattr(playbook, "_file_name", "") or "")
        for play in playbook.get_plays():
            if VALIDATE_ROLE in (role.get_name() for role in play.get_roles()):
                self._validate_play = play

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
