"""specfleet's console: what changed, what failed, each stage's plan and progress, and a short
summary at the end. Ansible's default callback underneath, made quiet.

At the default verbosity it leaves out what a run does every time: results that are ok or
skipped, `included:` lines, the `FAILED - RETRYING` line of every poll (the progress
callback prints one line per change of a running stage's step instead) and a play that
matched no host. A changed task is shown as Ansible shows it; a failed one as its message
alone, once: no excerpt of the file the task is in, no dump of the result around the message
(-v shows both). A failure that a later task says again in full (a refused setting, said by
the validate role's verdict with the report's path) is not shown where it happened: a block
marks it with the variable `specfleet_failure_said_later`. After the recap come the summary
lines of the validate role's `specfleet_summary` (verdict, hosts per group, what this run
redid, where the report is) and, on request, the slowest tasks. With -v it shows everything
the default callback does.

    [defaults]
    stdout_callback = specfleet.ascend.console
"""

from __future__ import annotations

import time
from typing import Any

from ansible import constants as C
from ansible.playbook.task_include import TaskInclude
from ansible.plugins.callback.default import CallbackModule as DefaultCallback

DOCUMENTATION = """
name: console
type: stdout
short_description: changes, failures, stage progress and a short summary; the rest with -v
description:
  - Ansible's default output without the results that are ok or skipped, the included-file
    lines and the retry line of every poll, unless run with -v.
  - Ends with the run's summary (the validate role's specfleet_summary) after the recap.
  - Lists the slowest tasks after the recap when task_timings asks for them.
extends_documentation_fragment:
  - default_callback
  - result_format_callback
options:
  display_ok_hosts:
    description: Show results that are ok (always on with -v).
    type: bool
    default: false
    env:
      - name: ANSIBLE_DISPLAY_OK_HOSTS
    ini:
      - section: defaults
        key: display_ok_hosts
  display_skipped_hosts:
    description: Show results that are skipped (always on with -v).
    type: bool
    default: false
    env:
      - name: ANSIBLE_DISPLAY_SKIPPED_HOSTS
    ini:
      - section: defaults
        key: display_skipped_hosts
  task_timings:
    description: After the recap, list this many of the slowest tasks with their wall time
      (0 lists none).
    type: int
    default: 0
    env:
      - name: SPECFLEET_TASK_TIMINGS
    ini:
      - section: callback_console
        key: task_timings
"""

# The validate role hands over its summary as a debug `var` of this name: fleet_report's line
# (green, report_dir, hosts, ...), whose `summary` holds the lines to print.
SUMMARY_KEY = "specfleet_summary"
# A block's variable: its failures are said again, in full, by a later task (see above).
SAID_LATER_VAR = "specfleet_failure_said_later"
# The end of a failed command's output shown under its message.
OUTPUT_TAIL_LINES = 10


def failure_message(result: dict[str, Any]) -> str:
    """What a failed result says: its msg, then the end of its stderr (or stdout) when the msg
    does not already hold it (a command's "non-zero return code" says nothing of the why)."""
    said = str(result.get("msg") or "").strip()
    output = str(result.get("stderr") or result.get("stdout") or "").strip()
    if output and output.splitlines()[-1] not in said:
        tail = "\n".join(output.splitlines()[-OUTPUT_TAIL_LINES:])
        said = f"{said}\n{tail}" if said else tail
    return said or "failed"


def slowest(timings: list[tuple[str, float]], count: int) -> list[str]:
    """The lines listing the `count` slowest (name, seconds) pairs, slowest first."""
    ranked = sorted(timings, key=lambda item: item[1], reverse=True)[:count]
    return [f"{seconds:8.2f}s  {name}" for name, seconds in ranked]


class CallbackModule(DefaultCallback):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "specfleet.ascend.console"

    def __init__(self) -> None:
        super().__init__()
        self._summary: list[str] = []
        self._timings: list[tuple[str, float]] = []
        self._current: tuple[str, float] | None = None
        # A play's banner waits for its first task: a play that matches no host says nothing.
        self._pending_play: Any = None

    def set_options(self, *args: Any, **kwargs: Any) -> None:
        super().set_options(*args, **kwargs)
        if self._verbose:
            self._plugin_options["display_ok_hosts"] = True
            self._plugin_options["display_skipped_hosts"] = True

    @property
    def _verbose(self) -> bool:
        return self._display.verbosity >= 1

    def _timed(self, task: Any) -> None:
        now = time.monotonic()
        if self._current is not None:
            self._timings.append((self._current[0], now - self._current[1]))
        self._current = (task.get_name().strip(), now) if task is not None else None

    def v2_playbook_on_play_start(self, play: Any) -> None:
        if self._verbose:
            super().v2_playbook_on_play_start(play)
        else:
            self._pending_play = play

    def _play_banner(self) -> None:
        if self._pending_play is not None:
            play, self._pending_play = self._pending_play, None
            super().v2_playbook_on_play_start(play)

    def v2_playbook_on_no_hosts_matched(self) -> None:
        if self._verbose:
            super().v2_playbook_on_no_hosts_matched()
        self._pending_play = None

    def v2_playbook_on_task_start(self, task: Any, is_conditional: bool) -> None:
        self._timed(task)
        self._play_banner()
        super().v2_playbook_on_task_start(task, is_conditional)

    def v2_playbook_on_handler_task_start(self, task: Any) -> None:
        self._timed(task)
        self._play_banner()
        super().v2_playbook_on_handler_task_start(task)

    def v2_runner_on_failed(self, result: Any, ignore_errors: bool = False) -> None:
        if self._verbose or (result.task.loop and "results" in result.result):
            super().v2_runner_on_failed(result, ignore_errors)
            return
        if not ignore_errors and _said_later(result.task):
            return
        if self._last_task_banner != result.task._uuid:
            self._print_task_banner(result.task)
        self._handle_warnings(result.result)
        message = failure_message(result.result)
        self._display.display(
            f"fatal: [{self.host_label(result)}]: FAILED! {message}",
            color=C.COLOR_ERROR if not ignore_errors else C.COLOR_SKIP,
            stderr=self.get_option("display_failed_stderr"),
        )
        if ignore_errors:
            self._display.display("...ignoring", color=C.COLOR_SKIP)

    def v2_playbook_on_include(self, included_file: Any) -> None:
        if self._verbose:
            super().v2_playbook_on_include(included_file)

    def v2_runner_retry(self, result: Any) -> None:
        if self._verbose:
            super().v2_runner_retry(result)

    def v2_runner_on_ok(self, result: Any) -> None:
        if not self._verbose:
            # an include's banner, with nothing under it
            if isinstance(result.task, TaskInclude):
                return
            summary = result.result.get(SUMMARY_KEY)
            if isinstance(summary, dict):
                self._summary = [str(line) for line in summary.get("summary") or []]
                return
            if not result.result.get("changed") and not self.get_option("display_ok_hosts"):
                # the result is not shown; what it warns about still is
                self._handle_warnings_and_exception(result)
                return
        super().v2_runner_on_ok(result)

    def v2_runner_item_on_failed(self, result: Any) -> None:
        if self._verbose or not _said_later(result.task):
            super().v2_runner_item_on_failed(result)

    def v2_playbook_on_stats(self, stats: Any) -> None:
        self._timed(None)
        super().v2_playbook_on_stats(stats)
        if self._summary:
            self._display.banner("SUMMARY")
            for line in self._summary:
                self._display.display(line)
        count = self.get_option("task_timings")
        if count and self._timings:
            self._display.banner(f"SLOWEST TASKS ({min(count, len(self._timings))})")
            for line in slowest(self._timings, count):
                self._display.display(line)


def _said_later(task: Any) -> bool:
    try:
        return bool(task.get_vars().get(SAID_LATER_VAR))
    except Exception:  # a task without a variable scope, or one that does not template
        return False
