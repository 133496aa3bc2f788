"""Process bookkeeping shared by the helpers that own long-running work (stage scripts, vLLM
servers, model builds), and the records they leave under ``<root>/run``.

One owner per process: a stage script runs in a process group of its own (stage_run), and
everything the stage starts, its vLLM server included, stays in that group. What leaves the
group is still the stage's: torchrun starts every rank in a session of its own, so each
process a stage starts carries the stage's mark in its environment (STAGE_ENV, inherited
across sessions). The group and the marked processes are the stage; ending them ends the stage
and all it started, from one place (end_processes): the stage's supervisor when the script
ends, times out or is told to stop, ``stage_run stop``, or the run that takes over an
abandoned host lock. The group is asked first (SIGTERM), so torchrun ends its own ranks and
they save their checkpoint; ranks that lost their torchrun are asked next; what is left when
the stage's stop grace runs out is killed, each marked process with its own process group.

Records (JSON, written atomically):
  NAME.pid          a running stage: {"pid", "pgid", "supervisor", "started", "marker",
                    "stop_grace_s"} (stage_run)
  NAME.server.json  a server a stage started: {"pid", "pgid", "marker", "boot_id", ...}
                    (vllm_server). Its processes are those of group ``pgid`` whose
                    environment carries OWNER_ENV=marker, so the server can be stopped on
                    its own (the stage script that started it shares the group) and is found
                    even after its main process died and its children were re-parented.

Liveness is read from /proc and ignores zombies: on hosts (and containers) whose init does
not reap orphans, a finished process can linger as a zombie and must not count as running.
Signals only ever go to a recorded process group or to members of a recorded server, never
to processes matched by name. Standard library only: this runs with the host's python3
(psutil is not there), and the few /proc reads it needs are below.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any, Optional

DEFAULT_GRACE_S = 10.0
# After SIGKILL: how long to wait for the group to be gone (the kernel frees it at once;
# this only covers a slow exit of a process stuck in the kernel, e.g. on a device).
KILL_WAIT_S = 10.0
STAGE_RECORD = ".pid"
SERVER_RECORD = ".server.json"
# The environment variable that marks every process of one recorded server.
OWNER_ENV = "SPECFLEET_OWNER"
# The environment variable that marks every process one run of a stage started (stage_run).
STAGE_ENV = "SPECFLEET_STAGE"
# How often end_processes looks whether what it asked to end has ended.
_END_STEP_S = 0.2


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


def same_process(pid: int, starttime: Optional[int]) -> bool:
    """`pid` still runs and is the process that had `starttime` (not a reuse of its pid)."""
    stat = proc_stat(pid)
    return stat is not None and stat[0] not in ("Z", "X") and stat[2] == starttime


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


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _environ_has(pid: int, entry: bytes) -> bool:
    try:
        return entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:  # gone, or not ours to read: then not ours to signal either
        return False


def marked_processes(marker: str, env: str = STAGE_ENV) -> list[int]:
    """Live processes anywhere on the host whose environment carries env=marker."""
    entry = f"{env}={marker}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        pid = int(proc.name) if proc.name.isdigit() else 0
        if pid and _environ_has(pid, entry) and process_alive(pid):
            found.append(pid)
    return sorted(found)


def marked_members(pgid: int, marker: str) -> list[int]:
    """Live processes of the group whose environment carries OWNER_ENV=marker."""
    entry = f"{OWNER_ENV}={marker}".encode()
    return [pid for pid in group_members(pgid) if _environ_has(pid, entry)]


def record_members(record: dict[str, Any]) -> list[int]:
    """The live processes of a recorded server (vllm_server's NAME.server.json)."""
    if record.get("boot_id") and record["boot_id"] != boot_id():
        return []
    pgid = int(record["pgid"])
    if record.get("marker"):
        return marked_members(pgid, str(record["marker"]))
    # A record without a marker was written when a server had its own process group.
    leader = proc_stat(pgid)
    started = record.get("starttime")
    if leader is not None and started is not None and leader[2] != int(started):
        return []
    return group_members(pgid)


def signal_pids(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def kill_group(pgid: int, grace_s: float = DEFAULT_GRACE_S, leader_only: bool = False) -> bool:
    """SIGTERM the group, SIGKILL what is left after grace_s. True if anything was signalled.
    With `leader_only`, the grace waits for the group's leader (pid == pgid) alone: what it
    leaves behind, such as multiprocessing's resource tracker (which ignores SIGTERM), is
    killed as soon as it has exited."""
    if not group_alive(pgid):
        return False
    signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not (process_alive(pgid) if leader_only else group_alive(pgid)):
            break
        time.sleep(0.2)
    if not group_alive(pgid):
        return True
    signal_group(pgid, signal.SIGKILL)
    deadline = time.monotonic() + KILL_WAIT_S
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return True


def stage_processes(pgid: int, marker: Optional[str]) -> tuple[list[int], list[int]]:
    """(the group's live members, the live marked processes outside the group)."""
    members = group_members(pgid)
    if not marker:
        return members, []
    inside = set(members)
    return members, [pid for pid in marked_processes(marker) if pid not in inside]


def _session_leader(pid: int) -> bool:
    try:
        return os.getsid(pid) == pid
    except OSError:
        return False


def _kill_everything(pgid: int, marker: Optional[str]) -> None:
    """SIGKILL the group, then each marked process with its own process group (a torchrun
    rank leads one, with its data-loader workers)."""
    signal_group(pgid, signal.SIGKILL)
    for pid in stage_processes(pgid, marker)[1]:
        with contextlib.suppress(OSError):
            signal_group(os.getpgid(pid), signal.SIGKILL)
        signal_pids([pid], signal.SIGKILL)


def end_processes(
    pgid: int,
    marker: Optional[str],
    grace_s: float = DEFAULT_GRACE_S,
    asked: bool = False,
) -> bool:
    """End a stage's processes: its group `pgid` and every process marked with `marker`.

    SIGTERM the group (unless `asked`: the caller already did): a torchrun in it sends its
    ranks SIGTERM, waits for them, then kills them (its own shutdown). Marked processes left
    without a live group (ranks whose torchrun was killed) are sent SIGTERM once, so they can
    still save. Whatever is alive after `grace_s` is killed (_kill_everything). True if
    anything was running."""
    members, outside = stage_processes(pgid, marker)
    if not members and not outside:
        return False
    if not asked:
        signal_group(pgid, signal.SIGTERM)
    orphans_asked = False
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        members, outside = stage_processes(pgid, marker)
        if not members and not outside:
            return True
        if not members and not orphans_asked:
            # Their torchrun is gone and cannot end them: ask the ranks (the leaders of their
            # sessions) themselves, once; a second signal would cut their checkpoint save short.
            signal_pids([pid for pid in outside if _session_leader(pid)], signal.SIGTERM)
            orphans_asked = True
        time.sleep(_END_STEP_S)
    _kill_everything(pgid, marker)
    deadline = time.monotonic() + KILL_WAIT_S
    while any(stage_processes(pgid, marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return True


def end_stage(record: dict[str, Any]) -> bool:
    """End a recorded stage (stage_run's NAME.pid): its supervisor first, so that it can no
    longer write the stage's files, then the stage's process group and every process it marked,
    within the stage's stop grace (end_processes). True if anything was still running."""
    ended = False
    supervisor = int(record.get("supervisor") or 0)
    if supervisor and process_alive(supervisor):
        with contextlib.suppress(ProcessLookupError):
            os.kill(supervisor, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while process_alive(supervisor) and time.monotonic() < deadline:
            time.sleep(0.05)
        ended = True
    grace = float(record.get("stop_grace_s") or DEFAULT_GRACE_S)
    return end_processes(int(record["pgid"]), record.get("marker"), grace) or ended


def servers_of_group(run_dir: Path, pgid: int) -> dict[str, list[int]]:
    """The servers recorded in run_dir that live in process group `pgid`: name -> live pids."""
    found = {}
    for path in sorted(Path(run_dir).glob(f"*{SERVER_RECORD}")):
        record = read_json(path)
        if record is not None and record.get("pgid") == pgid:
            found[path.name[: -len(SERVER_RECORD)]] = record_members(record)
    return found


def forget_dead_servers(run_dir: Path, pgid: int) -> list[str]:
    """Remove the records of the servers of group `pgid` that no longer run (their stage
    ended); return their names."""
    forgotten = []
    for name, members in servers_of_group(run_dir, pgid).items():
        if not members:
            with contextlib.suppress(FileNotFoundError):
                (Path(run_dir) / f"{name}{SERVER_RECORD}").unlink()
            forgotten.append(name)
    return forgotten


def read_json(path: Path) -> Optional[dict[str, Any]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
