"""Process helpers for tests that start real processes (independent of the code under test)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

HELPERS = Path(__file__).resolve().parents[2] / "python_helpers"


def run_helper(module: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m <module> ARGS` as a role starts it: a fresh interpreter that finds the
    helpers' sources on its PYTHONPATH, its output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(HELPERS)},
    )


def pid_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_until(predicate, timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
