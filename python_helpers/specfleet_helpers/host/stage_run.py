"""Run one pipeline stage's script detached from Ansible, with a timeout, and report on it.

Ansible starts a stage with ``start`` (returns at once) and polls ``status`` until the
stage has finished, so a long stage never holds an SSH session open and every poll can
show progress. The stage script runs in its own process group, and everything it starts
stays there (its vLLM server too: see vllm_server) or, when it starts a session of its own
(torchrun's ranks), carries the stage's mark in its environment (procs.STAGE_ENV): the group
and the marked processes are the stage. ``stop``, a timeout, and the end of the script
(whatever it left running) end exactly those and nothing else on the host, through the
supervisor: SIGTERM first (torchrun then ends its ranks, which save a checkpoint), SIGKILL
once the stage's stop grace (``--stop-grace``) is over (procs.end_processes). The supervisor
also forgets the records of the servers that went with the group (procs).

Files, for a stage NAME under RUN_DIR:
  NAME.pid          pid and process group of the running script, its supervisor, the mark
                    of its processes and its stop grace
  NAME.status.json  written when the script ends: rc, timed_out, start/end times

Progress: the last log line that starts with ``==>`` is reported as the current step,
so scripts announce their steps with ``echo "==> ..."``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Optional

from specfleet_helpers.files import tail_lines, write_json_atomic
from specfleet_helpers.host import host_lock, procs
from specfleet_helpers.host.procs import (
    DEFAULT_GRACE_S,
    group_alive,
    process_alive,
    read_json,
)

STEP_PREFIX = "==>"
# How long a stage that is stopped (or timed out) gets from SIGTERM to SIGKILL, unless its
# declaration gives it more (train: torchrun's own shutdown and the ranks' checkpoint save).
STOP_GRACE_S = DEFAULT_GRACE_S
# What the script left running when it ended (its vLLM server after a failure, say) gets this
# long after SIGTERM: a vLLM server shuts down cleanly within it.
LEFTOVER_GRACE_S = 5.0
# How long `stop` waits for the supervisor beyond the stop grace before ending the stage itself.
_STOP_MARGIN_S = 10.0


# How often a --wait status looks again: ends are seen within this, at a few stat() calls.
_WAIT_STEP_S = 0.25


def _paths(run_dir: Path, name: str) -> dict[str, Path]:
    return {
        "pid": run_dir / f"{name}{procs.STAGE_RECORD}",
        "status": run_dir / f"{name}.status.json",
    }


def current_step(log: Path) -> str:
    for line in reversed(tail_lines(log, 1_000_000)):
        if line.startswith(STEP_PREFIX):
            return line[len(STEP_PREFIX) :].strip()
    return ""


def _supervise(
    script: Path, log: Path, run_dir: Path, name: str, timeout_s: float, stop_grace_s: float
) -> None:
    """Body of the detached supervisor: run the script, enforce the timeout, record the end."""
    paths = _paths(run_dir, name)
    started = time.time()
    marker = f"{name}:{os.getpid()}:{started:.6f}"
    with open(log, "ab", buffering=0) as out, open(os.devnull, "rb") as devnull:
        pid = os.fork()
        if pid == 0:  # the stage script: its own process group, so it can be ended as a whole
            os.setpgid(0, 0)
            os.dup2(devnull.fileno(), 0)
            os.dup2(out.fileno(), 1)
            os.dup2(out.fileno(), 2)
            # Inherited by everything the stage starts, in its group or in a session of its own.
            os.environ[procs.STAGE_ENV] = marker
            try:
                os.execvp("bash", ["bash", str(script)])
            finally:
                os._exit(127)  # only reached when bash itself could not be started
        try:
            os.setpgid(pid, pid)
        except OSError:
            pass  # the child already did it
        write_json_atomic(
            paths["pid"],
            {
                "pid": pid,
                "pgid": pid,
                "supervisor": os.getpid(),
                "started": started,
                "marker": marker,
                "stop_grace_s": stop_grace_s,
            },
        )
        # When the stage was asked to end (a signal to the supervisor, or its timeout): the
        # grace runs from then, for the script and for whatever it started.
        stopping: list[float] = []

        def begin_stop() -> None:
            if not stopping:
                stopping.append(time.monotonic())
                procs.signal_group(pid, signal.SIGTERM)

        def forward(signum: int, _frame: Any) -> None:
            begin_stop()

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        timed_out = False
        killed = False
        deadline = time.monotonic() + timeout_s
        status = 0
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if not stopping and time.monotonic() > deadline:
                timed_out = True
                msg = (
                    f"\n==> specfleet: stage '{name}' exceeded its timeout of "
                    f"{timeout_s:.0f}s; stopping it\n"
                )
                out.write(msg.encode())
                begin_stop()
            if stopping and not killed and time.monotonic() > stopping[0] + stop_grace_s:
                procs.end_processes(pid, marker, grace_s=0, asked=True)  # the grace is over
                killed = True
            time.sleep(0.5)
        # What the script started and left running (its server after a failure, torchrun's
        # ranks, a stray child) is the stage's: end it, and only then tell Ansible the stage is
        # over, so the next stage finds the ports and the memory free.
        if stopping:
            left = max(0.0, stopping[0] + stop_grace_s - time.monotonic())
            procs.end_processes(pid, marker, grace_s=left, asked=True)
        else:
            procs.end_processes(pid, marker, grace_s=LEFTOVER_GRACE_S)
        procs.forget_dead_servers(run_dir, pid)
    rc = os.waitstatus_to_exitcode(status)
    if rc < 0:  # killed by a signal: report it the way a shell does (143 for SIGTERM)
        rc = 128 - rc
    ended = time.time()
    write_json_atomic(
        paths["status"],
        {
            "name": name,
            "rc": 124 if timed_out else rc,
            "timed_out": timed_out,
            "stopped": bool(stopping) and not timed_out,
            "started": started,
            "ended": ended,
            "duration_s": round(ended - started, 1),
        },
    )
    try:
        paths["pid"].unlink()
    except OSError:
        pass


def start(
    script: Path,
    log: Path,
    run_dir: Path,
    name: str,
    timeout_s: float,
    stop_grace_s: float = STOP_GRACE_S,
) -> dict[str, Any]:
    """Start the stage detached; first end a stale run of it (left by a killed playbook)."""
    paths = _paths(run_dir, name)
    run_dir.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    stale = read_json(paths["pid"])
    stopped_stale = procs.end_stage(stale) if stale else False
    if stale:
        procs.forget_dead_servers(run_dir, int(stale["pgid"]))
    for path in paths.values():
        if path.exists():
            path.unlink()
    with log.open("w") as fh:
        fh.write(f"==> specfleet: stage '{name}' started {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        fh.write(f"==> re-run by hand: bash {shlex.quote(str(script))}\n")

    pid = os.fork()
    if pid == 0:
        os.setsid()  # detach from Ansible's session: the stage outlives this SSH command
        if os.fork() != 0:
            os._exit(0)
        # Let go of Ansible's pipes, or the SSH command would wait for the stage to end.
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        try:
            _supervise(script, log, run_dir, name, timeout_s, stop_grace_s)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    deadline = time.monotonic() + 10
    while not paths["pid"].exists() and not paths["status"].exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"stage '{name}' did not start within 10s; see {log}")
        time.sleep(0.05)
    info = read_json(paths["pid"]) or {}
    return {"name": name, "started": True, "pid": info.get("pid"), "stopped_stale": stopped_stale}


def status(log: Path, run_dir: Path, name: str, tail: int, wait_s: float = 0.0) -> dict[str, Any]:
    """The stage's state. With ``wait_s``, a running stage is watched for up to that long and
    its end is reported as soon as it comes: Ansible polls with a short delay between calls
    instead of sleeping a fixed interval past a stage that already ended."""
    deadline = time.monotonic() + wait_s
    while True:
        result = _status_now(log, run_dir, name, tail)
        if result["state"] != "running" or time.monotonic() >= deadline:
            return result
        time.sleep(min(_WAIT_STEP_S, max(0.0, deadline - time.monotonic())))


def _finished(name: str, done: dict[str, Any], log: Path, tail: int) -> dict[str, Any]:
    return {
        "name": name,
        "state": "finished",
        "rc": done["rc"],
        "timed_out": done["timed_out"],
        "elapsed_s": done["duration_s"],
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(done["started"])),
        "ended": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(done["ended"])),
        "step": current_step(log),
        "tail": tail_lines(log, tail),
    }


def _status_now(log: Path, run_dir: Path, name: str, tail: int) -> dict[str, Any]:
    paths = _paths(run_dir, name)
    done = read_json(paths["status"])
    if done is not None:
        return _finished(name, done, log, tail)
    running = read_json(paths["pid"])
    if running is not None and (
        group_alive(int(running["pgid"])) or process_alive(int(running.get("supervisor") or 0))
    ):
        return {
            "name": name,
            "state": "running",
            "elapsed_s": round(time.time() - float(running["started"]), 1),
            "step": current_step(log),
            "last_line": (tail_lines(log, 1) or [""])[0][:200],
        }
    # The supervisor writes the status, then removes the pid record: a stage that ended
    # between the two reads above has its status now (a loaded host makes that window real).
    done = read_json(paths["status"])
    if done is not None:
        return _finished(name, done, log, tail)
    # Neither running nor finished: the supervisor was killed (e.g. the host rebooted),
    # or the stage was never started.
    return {
        "name": name,
        "state": "lost",
        "rc": None,
        "step": current_step(log),
        "tail": tail_lines(log, tail),
    }


def stop(run_dir: Path, name: str) -> dict[str, Any]:
    """Stop the stage as its timeout would: its supervisor ends the script and everything it
    started (SIGTERM, then SIGKILL after the stage's stop grace) and records the end. A stage
    whose supervisor is gone, or does not finish in time, is ended here (procs.end_stage)."""
    info = read_json(_paths(run_dir, name)["pid"])
    if not info:
        return {"name": name, "stopped": False}
    supervisor = int(info.get("supervisor") or 0)
    grace = float(info.get("stop_grace_s") or STOP_GRACE_S)
    stopped = False
    if supervisor and process_alive(supervisor):
        os.kill(supervisor, signal.SIGTERM)
        stopped = True
        deadline = time.monotonic() + grace + _STOP_MARGIN_S
        while process_alive(supervisor) and time.monotonic() < deadline:
            time.sleep(0.2)
    if process_alive(supervisor) or group_alive(int(info["pgid"])):
        stopped = procs.end_stage(info) or stopped
    procs.forget_dead_servers(run_dir, int(info["pgid"]))
    return {"name": name, "stopped": stopped}


def stop_all(
    run_dir: Path, lock: Optional[Path] = None, token: Optional[str] = None
) -> dict[str, Any]:
    """Stop every stage recorded under run_dir at once, each as `stop` does (its supervisor,
    its grace): what an interrupted run left running. Names the ones that were running.

    With `lock` and `token`, only while that run holds the host lock: a run interrupted while
    it waited for another run's lock stops nothing of that run's."""
    if lock is not None and host_lock.read(lock).get("token") != token:
        return {"stopped": [], "not_ours": True}
    names = sorted(
        path.name[: -len(procs.STAGE_RECORD)] for path in run_dir.glob(f"*{procs.STAGE_RECORD}")
    )
    with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
        results = list(pool.map(lambda name: stop(run_dir, name), names))
    return {"stopped": [r["name"] for r in results if r["stopped"]]}


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specfleet_helpers.host.stage_run",
        description="Start, poll or stop a specfleet stage script detached from Ansible.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for cmd, text in (
        ("start", "start the script detached and return at once"),
        ("status", "print the stage's state as JSON: running (with progress), finished, lost"),
        ("stop", "end the stage's process group"),
        ("stop-all", "stop every stage recorded under --run-dir (an interrupted run's work)"),
    ):
        p = sub.add_parser(cmd, help=text)
        if cmd != "stop-all":
            p.add_argument("--name", required=True, help="stage name, e.g. train")
        p.add_argument("--run-dir", required=True, type=Path, help="<root>/run")
        if cmd == "stop-all":
            p.add_argument(
                "--lock", type=Path, help="stop only while the run of --token holds this lock"
            )
            p.add_argument("--token", help="the run's token for --lock")
        if cmd in ("start", "status"):
            p.add_argument("--log", required=True, type=Path, help="<root>/logs/<stage>.log")
        if cmd == "start":
            p.add_argument("--script", required=True, type=Path, help="the stage's bash script")
            p.add_argument(
                "--timeout", required=True, type=float, help="seconds before the stage is stopped"
            )
            p.add_argument(
                "--stop-grace",
                type=float,
                default=STOP_GRACE_S,
                help="seconds a stopped stage gets from SIGTERM to SIGKILL (default %(default)s)",
            )
            p.add_argument(
                "--withdraw",
                type=Path,
                action="append",
                default=[],
                metavar="FILE",
                help="remove FILE (the stage's stamp) before the script starts, so that a stage"
                " interrupted part-way leaves no stamp vouching for half-written artifacts"
                " (repeatable)",
            )
        if cmd == "status":
            p.add_argument(
                "--tail", type=int, default=40, help="log lines to include once finished"
            )
            p.add_argument(
                "--lock", type=Path, help="host lock to keep fresh while the stage runs (host_lock)"
            )
            p.add_argument("--lock-token", help="this run's token for --lock")
            p.add_argument(
                "--wait",
                type=float,
                default=0.0,
                help="seconds to watch a running stage before answering (early when it ends)",
            )
    args = parser.parse_args(argv)
    if args.command == "start":
        if not args.script.is_file():
            parser.error(f"--script {args.script} does not exist")
        for stamp in args.withdraw:
            stamp.unlink(missing_ok=True)
        result = start(
            args.script, args.log, args.run_dir, args.name, args.timeout, args.stop_grace
        )
    elif args.command == "status":
        if args.lock and args.lock_token:
            # Each poll is the run's heartbeat: a lock whose run stopped polling goes stale.
            held = host_lock.heartbeat(args.lock, args.lock_token)
            if not held["held"]:
                print(held.get("message", f"host lock {args.lock} lost"), file=sys.stderr)
        result = status(args.log, args.run_dir, args.name, args.tail, args.wait)
    elif args.command == "stop-all":
        if (args.lock is None) != (args.token is None):
            parser.error("stop-all: --lock and --token go together")
        result = stop_all(args.run_dir, args.lock, args.token)
    else:
        result = stop(args.run_dir, args.name)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
