"""Show each stage's plan, and a running stage's progress while Ansible polls it.

The stage role decides each stage in one task (plugins/action/specfleet_stage_decide.py; the
graph alone: specfleet_stage_upstream.py), whose result carries the plan line as
`specfleet_plan`; and it polls `specfleet_helpers.host.stage_run status` with `until`, every
retry carrying the stage's state as JSON. This callback prints both, one line per host:

    [a2-node01] train: running: inputs changed: epochs
    [a2-node01] train: running 2m31s | step: torchrun epoch 1 | last: ... loss=3.21
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: progress
type: notification
short_description: each specfleet stage's plan, and a progress line while it runs
description:
  - Prints each stage's plan (up to date, running or would run, and why).
  - Prints stage, elapsed time, current step and the last log line while a stage runs, when
    its step changes, else every 30 s.
requirements:
  - enable in ansible.cfg (callbacks_enabled)
"""

# The host lock (specfleet_helpers.host.host_lock) records the controller process that holds it,
# so a later run on the same controller can tell a dead run's lock from a live one. This
# module is loaded in the main ansible-playbook process before any worker forks; workers
# inherit the environment, and `lookup('env', 'SPECFLEET_CONTROLLER_PID')` reads it there.
# setdefault: an ansible-playbook started from inside another keeps the outer pid, which
# outlives it, so its lock can only look alive too long, never dead too early.
os.environ.setdefault("SPECFLEET_CONTROLLER_PID", str(os.getpid()))


def _elapsed(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


# A progress line fits a terminal and a CI log's width (the last log line is cut to fit).
MAX_LINE = 119
# A JSON or Python dict at the end of a log line (speculators' metrics): its numbers are kept.
_DICT_TAIL = re.compile(r"\{[^{}]*\}\s*$")
_NUMBER_ITEM = re.compile(r"""['"]?([A-Za-z_][\w/.-]*)['"]?\s*[:=]\s*(-?[\d.]+(?:e-?\d+)?)""")


def readable_tail(line: str) -> str:
    """A log line for one glance: whitespace collapsed, a trailing dict as its key=number pairs."""
    line = " ".join(line.split())
    found = _DICT_TAIL.search(line)
    if found:
        pairs = _NUMBER_ITEM.findall(found.group(0))
        numbers = " ".join(f"{key.rsplit('/', 1)[-1]}={_short(value)}" for key, value in pairs)
        line = (line[: found.start()].rstrip() + " " + numbers).strip()
    return line


def _short(number: str) -> str:
    try:
        value = float(number)
    except ValueError:
        return number
    return number if value.is_integer() and "." not in number else f"{value:.4g}"


def progress_line(host: str, stdout: str) -> str | None:
    """The line to print for one poll result, or None when it is not a stage status."""
    try:
        state = json.loads(stdout)
    except (TypeError, ValueError):
        return None
    if not isinstance(state, dict) or state.get("state") != "running" or "name" not in state:
        return None
    parts = [f"[{host}] {state['name']}: running {_elapsed(state.get('elapsed_s', 0))}"]
    if state.get("step"):
        parts.append(f"step: {state['step']}")
    line = " | ".join(parts)
    last = readable_tail(state.get("last_line") or "")
    if last and last.lstrip("=> ").strip() != state.get("step"):
        line += f" | last: {last}"
    return line if len(line) <= MAX_LINE else line[: MAX_LINE - 1] + "…"


# A running stage gets a new line when its step changes, else at most this often.
QUIET_S = 30


def worth_showing(shown: dict[str, Any], key: str, stdout: str) -> bool:
    """Whether a poll of a running stage deserves a line: its first, a new step, or QUIET_S
    since the last line shown for it. `shown` remembers, per key, what was last shown."""
    try:
        state = json.loads(stdout)
        elapsed = float(state.get("elapsed_s", 0))
    except (TypeError, ValueError, AttributeError):
        return False
    step = state.get("step")
    last = shown.get(key)
    if last is not None and last["step"] == step and elapsed - last["elapsed"] < QUIET_S:
        return False
    shown[key] = {"step": step, "elapsed": elapsed}
    return True


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "notification"
    CALLBACK_NAME = "specfleet.ascend.progress"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._shown: dict[str, Any] = {}

    def v2_runner_retry(self, result) -> None:
        host = result._host.get_name()
        stdout = result._result.get("stdout", "")
        line = progress_line(host, stdout)
        if line and worth_showing(self._shown, f"{host}/{result._task._uuid}", stdout):
            self._display.display(line, color="cyan")

    def v2_runner_on_ok(self, result) -> None:
        plan = result._result.get("specfleet_plan")
        # A line, or one per stage (the play's plan: plugins/action/specfleet_stage_plan.py).
        for line in [plan] if isinstance(plan, str) else plan if isinstance(plan, list) else []:
            if isinstance(line, str) and line:
                self._display.display(f"[{result._host.get_name()}] {line}")
