"""Tests for the specfleet.ascend.progress callback plugin's progress line.

The plugin imports ansible, so run these with the controller venv's Python.
"""

from __future__ import annotations

import json
import os

import pytest
from plugin_loader import load_callback

pytest.importorskip("ansible")

CONTROLLER_PID = "SPECFLEET_CONTROLLER_PID"


def _load_plugin():
    """Load the plugin as Ansible does; its SPECFLEET_CONTROLLER_PID is not left behind, so
    ansible-playbook runs started later by this test process record their own pid."""
    before = os.environ.get(CONTROLLER_PID)
    try:
        return _exec_plugin()
    finally:
        if before is None:
            os.environ.pop(CONTROLLER_PID, None)
        else:
            os.environ[CONTROLLER_PID] = before


def _exec_plugin():
    return load_callback("progress")


progress_line = _load_plugin().progress_line


def test_loading_the_plugin_records_the_controller_pid(monkeypatch):
    monkeypatch.setenv(CONTROLLER_PID, "placeholder")  # restored after the test
    monkeypatch.delenv(CONTROLLER_PID)
    module = _exec_plugin()
    assert os.environ[CONTROLLER_PID] == str(os.getpid())
    module.CallbackModule()  # instantiating it changes nothing
    assert os.environ[CONTROLLER_PID] == str(os.getpid())


def test_an_inherited_controller_pid_is_kept(monkeypatch):
    """An ansible-playbook started from inside another keeps the outer (longer-lived) pid."""
    monkeypatch.setenv(CONTROLLER_PID, "4242")
    _exec_plugin()
    assert os.environ[CONTROLLER_PID] == "4242"


def running(**fields) -> str:
    return json.dumps({"name": "train", "state": "running", **fields})


def test_running_stage_line():
    line = progress_line(
        "a2-node01",
        running(elapsed_s=125.4, step="torchrun epoch 1", last_line="step 40/100 loss=3.21"),
    )
    assert line == (
        "[a2-node01] train: running 2m05s | step: torchrun epoch 1 | last: step 40/100 loss=3.21"
    )


def test_elapsed_under_a_minute_and_default():
    assert progress_line("h", running(elapsed_s=42.9)) == "[h] train: running 42s"
    assert progress_line("h", running()) == "[h] train: running 0s"
    assert progress_line("h", running(elapsed_s=3600)).startswith("[h] train: running 60m00s")


def test_last_line_that_repeats_the_step_is_left_out():
    line = progress_line(
        "h", running(elapsed_s=61, step="download weights", last_line="==> download weights")
    )
    assert line == "[h] train: running 1m01s | step: download weights"


def test_long_last_line_is_cut():
    line = progress_line("h", running(elapsed_s=5, last_line="x" * 500))
    assert line == ("[h] train: running 5s | last: " + "x" * 500)[:118] + "…"
    assert len(line) == 119


def test_a_dict_at_the_end_of_the_last_line_is_shown_as_its_numbers():
    last = "INFO step {'train/loss': 3.2145678, 'train/lr': 0.0001, 'epoch': 1, 'note': 'x'}"
    line = progress_line("h", running(elapsed_s=5, last_line=last))
    assert line == "[h] train: running 5s | last: INFO step loss=3.215 lr=0.0001 epoch=1", line


@pytest.mark.parametrize(
    "stdout",
    [
        json.dumps({"name": "train", "state": "finished", "rc": 0, "elapsed_s": 3}),
        json.dumps({"name": "train", "state": "lost", "rc": None}),
        json.dumps({"state": "running", "elapsed_s": 3}),
        json.dumps(["running"]),
        "not json",
        "",
        None,
    ],
)
def test_no_line_for_anything_but_a_running_stage(stdout):
    assert progress_line("h", stdout) is None


class _Shown:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def display(self, msg: str, **_: object) -> None:
        self.lines.append(msg)


class _Result:
    def __init__(self, host: str, result: dict) -> None:
        self._result = result
        self._host = type("Host", (), {"get_name": lambda _self: host})()


def test_a_stage_decisions_plan_line_is_printed_once_per_host():
    """The stage decision actions return their plan line as specfleet_plan; other results are
    not printed by this callback."""
    callback = _load_plugin().CallbackModule()
    shown = _Shown()
    callback._display = shown
    line = "train: running: inputs changed: epochs"
    callback.v2_runner_on_ok(_Result("a2-node01", {"specfleet_plan": line, "script": "..."}))
    callback.v2_runner_on_ok(_Result("a2-node01", {"msg": "not a plan", "changed": False}))
    assert shown.lines == [f"[a2-node01] {line}"]
