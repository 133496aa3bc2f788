"""Process and process-group bookkeeping shared by the helpers that own long-running work
(stage scripts, vLLM servers, model builds).

Liveness is read from /proc and ignores zombies: on hosts (and containers) whose init does
not reap orphans, a finished process can linger as a zombie and must not count as running.
Signals only ever go to a recorded process group, never to processes matched by name.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any, Optional

DEFAULT_GRACE_S = 10.0


def proc_stat(pid: int) -> Optional[tuple[str, int, int]]:
    """(state, pgid, starttime) from /proc/PID/stat, or None when the process is gone."""
    if pid <= 0:
        return None
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    # After the command name: state ppid pgrp ... starttime is field 22 of the full line.
    return fields[0], int(fields[2]), int(fields[19])


def process_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    stat = proc_stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def group_members(pgid: int) -> list[int]:
    """Pids of the live (non-zombie) processes of a process group."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = proc_stat(int(entry.name))
            if stat and stat[1] == pgid and stat[0] not in ("Z", "X"):
                members.append(int(entry.name))
    return sorted(members)


def group_alive(pgid: int) -> bool:
    return bool(group_members(pgid))


def signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def kill_group(pgid: int, grace_s: float = DEFAULT_GRACE_S) -> bool:
    """SIGTERM the group, SIGKILL what is left after grace_s. True if anything was signalled."""
    if not group_alive(pgid):
        return False
    signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not group_alive(pgid):
            return True
        time.sleep(0.2)
    signal_group(pgid, signal.SIGKILL)
    return True


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write JSON to a temporary sibling, then rename: readers never see half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, sort_keys=True) + "\n")
    os.replace(tmp, path)


def read_json(path: Path) -> Optional[dict[str, Any]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
