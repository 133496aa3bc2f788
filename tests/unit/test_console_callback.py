"""plugins/callback/console.py, the stdout callback ansible.cfg names, through real
ansible-playbook runs on localhost: what a run prints at the default verbosity, with -v, and
with SPECFLEET_TASK_TIMINGS; and the progress callback's one line per change of step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from plugin_loader import load_callback

pytest.importorskip("ansible")

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")

# A poll that says "running" twice, with a new step, then finishes; progress lines come from
# the progress callback as they would for a stage.
POLL = (
    "import json, pathlib, sys; p = pathlib.Path(sys.argv[1]); n = int(p.read_text() or 0) "
    "if p.exists() else 0; p.write_text(str(n + 1)); steps = ['fetch', 'fetch', 'build']; "
    "print(json.dumps({'name': 'train', 'state': 'running', 'elapsed_s': n, 'step': steps[n]}"
    " if n < 3 else {'name': 'train', 'state': 'finished'}))"
)


def play(work: Path) -> Path:
    counter = work / "polls"
    tasks = [
        {"name": "An ok task", "ansible.builtin.set_fact": {"seen": True}},
        {"name": "An ok task that warns", "warner": {}},
        {"name": "A skipped task", "ansible.builtin.debug": {"msg": "never"}, "when": False},
        {
            "name": "A changed task",
            "ansible.builtin.command": {"argv": ["true"]},
            "changed_when": True,
        },
        {"name": "An include", "ansible.builtin.include_tasks": "inner.yml"},
        {
            "name": "A plan line",
            "ansible.builtin.debug": {"var": "specfleet_plan"},
            "vars": {"specfleet_plan": "serve: held: rollout stopped"},
        },
        {
            "name": "A poll",
            "ansible.builtin.command": {"argv": [sys.executable, "-c", POLL, str(counter)]},
            "register": "poll",
            "changed_when": False,
            "until": "(poll.stdout | from_json).state != 'running'",
            "retries": 5,
            "delay": 0,
        },
        {
            "name": "Summarize the run",
            "ansible.builtin.debug": {"var": "specfleet_summary"},
            "vars": {
                "specfleet_summary": {
                    "green": True,
                    "summary": ["GREEN: 1 of 1 hosts", "report: somewhere"],
                }
            },
        },
    ]
    (work / "library").mkdir()
    (work / "library" / "warner.py").write_text(
        "from ansible.module_utils.basic import AnsibleModule\n"
        "module = AnsibleModule(argument_spec={})\n"
        "module.warn('mind the gap')\n"
        "module.exit_json(changed=False)\n"
    )
    (work / "inner.yml").write_text(
        yaml.safe_dump([{"name": "Inside the include", "ansible.builtin.set_fact": {"x": 1}}])
    )
    path = work / "play.yml"
    path.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": tasks}]))
    return path


def run(work: Path, *args: str, **env: str) -> tuple[str, str]:
    environ = {
        **os.environ,
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        "PATH": f"{ANSIBLE_PLAYBOOK.parent}{os.pathsep}{os.environ.get('PATH', '')}",
        **env,
    }
    for name in ("ANSIBLE_DISPLAY_OK_HOSTS", "SPECFLEET_TASK_TIMINGS"):
        if name not in env:
            environ.pop(name, None)
    done = subprocess.run(
        [str(ANSIBLE_PLAYBOOK), "-i", "localhost,", "-c", "local", *args, str(play(work))],
        capture_output=True,
        text=True,
        cwd=work,
        env=environ,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout, done.stderr


def test_default_verbosity_prints_changes_progress_and_the_summary(tmp_path: Path) -> None:
    out, err = run(tmp_path)
    lines = out.splitlines()
    assert "TASK [A changed task]" in out and "changed: [localhost]" in out
    for quiet in ("An ok task", "A skipped task", "An include", "Inside the include", "A poll"):
        assert f"TASK [{quiet}" not in out, out
    # a plan line (the progress callback) is shown, not the debug result that carries it
    assert "[localhost] serve: held: rollout stopped" in lines and "TASK [A plan line]" not in out
    # an ok result is left out, not the warning it carries
    assert "mind the gap" in out + err, out
    assert "ok: [localhost]" not in out and "included:" not in out
    assert "FAILED - RETRYING" not in out, out
    # one progress line per new step: elapsed 0 (fetch), then build; not the second fetch
    progress = [line for line in lines if line.startswith("[localhost] train: running")]
    assert progress == [
        "[localhost] train: running 0s | step: fetch",
        "[localhost] train: running 2s | step: build",
    ], out
    # the summary comes last, after the recap, and is not shown as a debug result
    recap = out.index("PLAY RECAP")
    summary = out.index("SUMMARY")
    assert recap < summary and "specfleet_summary" not in out
    assert lines[-2:] == ["GREEN: 1 of 1 hosts", "report: somewhere"], out
    assert "SLOWEST TASKS" not in out


def test_verbose_shows_everything(tmp_path: Path) -> None:
    out, _ = run(tmp_path, "-v")
    assert "TASK [An ok task]" in out and "ok: [localhost]" in out
    assert "included:" in out and "FAILED - RETRYING" in out
    assert "specfleet_summary" in out


def test_ok_results_on_request_and_task_timings(tmp_path: Path) -> None:
    out, _ = run(tmp_path, ANSIBLE_DISPLAY_OK_HOSTS="1", SPECFLEET_TASK_TIMINGS="2")
    assert "TASK [An ok task]" in out and "ok: [localhost]" in out
    timings = out.split("SLOWEST TASKS (2)", 1)[1].strip().splitlines()[1:]
    assert len(timings) == 2 and all(line.strip()[0].isdigit() for line in timings), out


def test_slowest_ranks_and_formats() -> None:
    console = load_callback("console")
    assert console.slowest([("a", 0.5), ("b", 12.25), ("c", 3.0)], 2) == [
        "   12.25s  b",
        "    3.00s  c",
    ]


def test_progress_shows_a_new_step_or_every_quiet_period() -> None:
    progress = load_callback("progress")
    shown: dict = {}

    def state(elapsed: float, step: str) -> str:
        return json.dumps({"name": "train", "state": "running", "elapsed_s": elapsed, "step": step})

    seen = [
        progress.worth_showing(shown, "h/t", state(t, step))
        for t, step in [(1, "a"), (10, "a"), (12, "b"), (41, "b"), (42, "b"), (75, "b")]
    ]
    assert seen == [True, False, True, False, True, True]
    assert progress.worth_showing(shown, "other/t", state(0, "a")) is True
    assert progress.worth_showing(shown, "h/t", "not json") is False
