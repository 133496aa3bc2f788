"""Run a repo plugin's cases through a real ansible-playbook on localhost (the repo's
ansible.cfg: its plugins and callbacks), each case a task whose result is registered and
read back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")


@dataclass
class PlayRun:
    results: dict[str, dict[str, Any]]  # {case: its registered result}
    stdout: str


def run_cases(
    work: Path,
    cases: list[dict[str, Any]],
    play_vars: dict[str, Any] | None = None,
    interpreter: str | None = sys.executable,
    env: dict[str, str] | None = None,
    roles: list[str] | None = None,
) -> PlayRun:
    """One play of `cases` (tasks, each with a unique name; run with ignore_errors), then
    every case's registered result, in the order given. `interpreter`: the host's
    ansible_python_interpreter (None: Ansible discovers one); `env`: more of the environment;
    `roles`: the play's roles (the repo's, e.g. specfleet for the fleet-wide defaults)."""
    out = work / "results.json"
    names = [case["name"] for case in cases]
    tasks = [{**case, "register": f"r_{i}", "ignore_errors": True} for i, case in enumerate(cases)]
    kept = ", ".join(f"{json.dumps(name)}: r_{i}" for i, name in enumerate(names))
    tasks.append(
        {
            "name": "keep the results",
            "ansible.builtin.copy": {"dest": str(out), "content": "{{ {" + kept + "} | to_json }}"},
        }
    )
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "vars": play_vars or {},
            "roles": roles or [],
            "tasks": tasks,
        }
    ]
    (work / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    done = subprocess.run(
        [
            str(ANSIBLE_PLAYBOOK),
            "-i",
            "localhost,",
            "-c",
            "local",
            *(["-e", f"ansible_python_interpreter={interpreter}"] if interpreter else []),
            str(work / "play.yml"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), **(env or {})},
        cwd=REPO,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return PlayRun(results=json.loads(out.read_text()), stdout=done.stdout)
