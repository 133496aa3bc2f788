"""What the reliability modules (test_failures.py, test_interruptions.py) share: the result of
one `ansible-playbook site.yml` run against localhost and the small waits and probes around
it. Each module keeps its own Pipeline (work root, ports, how it starts runs)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

HOST = "localhost"
REPO = Path(__file__).resolve().parents[2]
STARTED_STAGE = re.compile(r"TASK \[stage : Start: (\w+)\]")
# This machine is no Ascend server, and what it is busy with at the moment must not fail a
# run's host checks: the fleet defaults' npu floors (40 GB disk, 20 GB for the models, 32 GB RAM)
# say nothing here, so the integration runs set every floor to 1 GB unless the case is about
# a floor. All three: the CI machine's /tmp once had 15 GB free, under the models' 20 GB.
LOW_HOST_FLOORS: dict[str, dict[str, int]] = {
    "specfleet_disk_required_gb": {"npu": 1, "cpu": 1},
    "specfleet_models_disk_required_gb": {"npu": 1, "cpu": 1},
    "specfleet_ram_required_gb": {"npu": 1, "cpu": 1},
}


def flat(text: str) -> str:
    """Whitespace collapsed: a message reads the same however the callback wrapped it."""
    return " ".join(text.split())


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A loopback port free now (bound, then released): for a server, or, left unused, for
    a connection that must be refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def playbook_env() -> dict[str, str]:
    """The environment of an ansible-playbook the integration modules start: the project's
    config, plain output, no retry files, the controller venv first on PATH (testinfra and
    the validate role run its tools)."""
    env = {
        **os.environ,
        "PATH": f"{REPO / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "PY_COLORS": "0",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_RETRY_FILES_ENABLED": "0",
        # The console (plugins/callback/console.py) shows ok results too, as with -v, so a
        # test can check what a task said; and lists every task's wall time after the recap.
        "ANSIBLE_DISPLAY_OK_HOSTS": "1",
        "SPECFLEET_TASK_TIMINGS": "100000",
    }
    # Each ansible-playbook must record ITS pid in the host lock (the callback keeps an
    # inherited one, for playbooks started from inside another).
    env.pop("SPECFLEET_CONTROLLER_PID", None)
    return env


def run_playbook(argv: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    """`ansible-playbook ARGS` from the checkout, as a user starts it (playbook_env), its output
    and errors as one text, nothing on stdin."""
    return subprocess.run(
        argv,
        cwd=REPO,
        env=playbook_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def wait_for(what: str, check: Callable[[], Any], timeout_s: float, every_s: float = 0.2) -> Any:
    """check()'s first true value, polled every every_s; fails naming `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(every_s)


@dataclass
class Run:
    """One finished site.yml run: its exit status, output and the reports it wrote."""

    label: str
    rc: int
    stdout: str
    seconds: float
    reports: Path

    @property
    def text(self) -> str:
        return flat(self.stdout)

    def tail(self, lines: int = 80) -> str:
        return "\n".join(self.stdout.splitlines()[-lines:])

    def fleet(self) -> dict[str, Any]:
        path = self.reports / "latest" / "fleet.json"
        assert path.is_file(), f"[{self.label}] no report {path}\n{self.tail()}"
        return json.loads(path.read_text())

    def host(self) -> dict[str, Any]:
        return next(h for h in self.fleet()["hosts"] if h["name"] == HOST)

    def assert_green(self, artifact_tests: bool = True) -> None:
        """Exit 0 and a green report (not a --check one); with artifact_tests, the testinfra
        suite (tests/artifacts) ran against the root and passed."""
        assert self.rc == 0, f"[{self.label}] rc={self.rc}\n{self.tail()}"
        fleet = self.fleet()
        assert fleet["green"] is True, (self.host(), self.tail())
        assert fleet["check_mode"] is False
        if artifact_tests:
            tests = self.host()["artifact_tests"]
            assert tests["passed"] > 0 and tests["failed"] == 0, tests

    def started_stages(self) -> list[str]:
        return STARTED_STAGE.findall(self.stdout)
