"""Start one vLLM server for a stage, wait until it is healthy, report on it, stop it. Used by
the hidden_states and serve stages.

The server belongs to the stage that starts it: it runs in the caller's process group (the
stage script's, which stage_run gave the stage), so ending the stage's group ends the server
with it, whoever ends the stage (its supervisor when the script ends or times out,
``stage_run stop``, a run taking over an abandoned host lock). No trap or second stop path is
needed for that; ``stop`` is for a stage that is done with its server and goes on.

``start`` refuses a port that something else holds (exit 3, naming the owner when it is
visible), then runs the server command with stdin from /dev/null and stdout/stderr to a log
file, marked by an environment variable (procs.OWNER_ENV) that its child processes inherit,
records it in RUN_DIR/NAME.server.json and returns at once. ``wait`` polls GET /health
until it answers 200 and fails fast, with the log tail, as soon as the server's processes
are gone. ``watch`` guards a client that uses the server (e.g. ``speculators
generate-offline-data``): should the server die, stop answering /health, or the client
outlast its timeout, it stops the client and fails with the server's log tail, instead of
leaving the client retrying against a dead server.
``stop`` ends exactly the server's marked processes (SIGTERM, then SIGKILL after a grace
period) and nothing else, not the stage script that shares their group; it is idempotent.

A server may also be started ahead of its stage, so that its slow start overlaps earlier
stages: a job of its own (stage_run) runs ``start``, ``wait`` and ``hold`` (which returns once
the server's processes are gone, so the job lives exactly as long as the server). The stage
then runs ``start --adopt`` with the same command: a live, healthy-or-starting server recorded
under the name with exactly that command, host and port is used as it is; any other is
stopped and a new one started. A server taken over that way is not in the stage's process
group, so the stage stops it itself (``stop``, from an EXIT trap too).

Liveness is judged from /proc, ignoring zombies: on hosts whose init does not reap
orphans, a dead server can linger as a zombie and must not count as running.

Keep API keys out of the server's argv (it shows in ps, in the log header and in the state
file): vLLM reads ``VLLM_API_KEY`` from its environment. Values after ``--api-key`` are
redacted in everything this helper writes or prints anyway.

Standard library only. Exit codes: 0 ok, 1 failure (server died or timed out; for
``watch`` also: the client was stopped), 2 bad input, 3 port already in use.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Optional

from specfleet_helpers.files import tail_lines, write_json_atomic
from specfleet_helpers.host import npu_memory, procs
from specfleet_helpers.host.host_probe import port_free, port_owner
from specfleet_helpers.host.procs import proc_stat, read_json

DEFAULT_HOST = "127.0.0.1"
DEFAULT_GRACE_S = 15.0
TAIL_LINES = 60
HEALTH_REQUEST_TIMEOUT_S = 2.0
POLL_INTERVAL_S = 0.5
# watch: seconds between /health probes, how long /health may fail before the server counts
# as hung (a busy server still answers /health: its API process serves it), and the grace
# between SIGTERM and SIGKILL of the client. Each probe is a line in the server's access log;
# the tail watch shows leaves those lines out.
WATCH_HEALTH_EVERY_S = 15.0
WATCH_UNHEALTHY_AFTER_S = 60.0
WATCH_CLIENT_GRACE_S = 10.0
SECRET_FLAGS = ("--api-key", "--api_key")

EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2
EXIT_PORT_BUSY = 3

# Servers started through the Python API are children of the calling process; keep their
# Popen objects so they can be reaped (the CLI exits at once, so init adopts them there).
_CHILDREN: dict[int, subprocess.Popen] = {}


class ServerError(Exception):
    """A server could not be started, or died, or never became healthy."""

    exit_code = EXIT_FAILURE

    def __init__(self, message: str, tail: Optional[list[str]] = None) -> None:
        super().__init__(message)
        self.tail = tail or []


class BadInput(ServerError):
    exit_code = EXIT_BAD_INPUT


class PortInUse(ServerError):
    exit_code = EXIT_PORT_BUSY


STATE_SUFFIX = procs.SERVER_RECORD


def state_path(run_dir: Path, name: str) -> Path:
    return Path(run_dir) / f"{name}{STATE_SUFFIX}"


def redact(argv: list[str]) -> list[str]:
    """The argv with the values of secret flags (``--api-key``) replaced by ``***``."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append("***")
            hide_next = False
        elif arg in SECRET_FLAGS:
            out.append(arg)
            hide_next = True
        elif arg.startswith(tuple(f"{flag}=" for flag in SECRET_FLAGS)):
            out.append(arg.split("=", 1)[0] + "=***")
        else:
            out.append(arg)
    return out


def server_members(state: dict[str, Any]) -> list[int]:
    """Pids of the recorded server's live (non-zombie) processes."""
    _reap_children()
    return procs.record_members(state)


def _reap_children() -> None:
    for pid, proc in list(_CHILDREN.items()):
        if proc.poll() is not None:
            del _CHILDREN[pid]


def _is_ours(state: dict[str, Any]) -> bool:
    """Whether the recorded main process can still be ours: same boot, and (if it still
    exists) the process we started, not a later one that reused the pid."""
    if state.get("boot_id") and state["boot_id"] != procs.boot_id():
        return False
    main = proc_stat(int(state["pid"]))
    if main is not None and state.get("starttime") is not None:
        return main[2] == int(state["starttime"])
    return True


_live_members = server_members


def _connect_host(host: str) -> str:
    """Address to reach a server bound to `host` from this machine."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "::1"
    return host


def _url(host: str, port: int, path: str) -> str:
    host = _connect_host(host)
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}{path}"


# Loopback requests must not go through an HTTP proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def health_ok(host: str, port: int, timeout: float = HEALTH_REQUEST_TIMEOUT_S) -> bool:
    """One GET /health; True on HTTP 200."""
    try:
        with _OPENER.open(_url(host, port, "/health"), timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError):
        return False


def _port_message(host: str, port: int) -> str:
    owner = port_owner(port)
    text = f"port {port} on {host} is already in use"
    if owner and owner.get("pid"):
        text += f" by pid {owner['pid']} ({owner.get('cmdline') or '?'})"
    elif owner:
        text += " (owner not visible to this user)"
    return text + "; stop that process or choose another port"


def start_server(
    name: str,
    run_dir: Path,
    log: Path,
    port: int,
    argv: list[str],
    host: str = DEFAULT_HOST,
    env: Optional[dict[str, str]] = None,
    cwd: Optional[Path] = None,
    adopt: bool = False,
    npu_memory_wait: Optional[Callable[[], dict[str, Any]]] = None,
) -> dict[str, Any]:
    """Start `argv` in the caller's process group, marked as this server, and record it;
    return at once.

    A server recorded under the same name that is still running (left by an interrupted
    run) is stopped first, unless `adopt` is set and it runs exactly this command on this
    host and port (started ahead of its stage): that one is kept, and reported as adopted.
    Then, on an NPU host, `npu_memory_wait` (npu_memory.wait for the server's share) waits
    until the devices have the memory free: after the stale server is stopped, whose memory
    it would otherwise wait for in vain, and not for an adopted one, which holds it.
    Raises PortInUse if anything else holds the port, BadInput for an empty argv or a
    missing executable, ValueError when the memory stays short.
    """
    if not argv:
        raise BadInput("no server command given (put it after --)")
    if not 0 < port < 65536:
        raise BadInput(f"port {port} is out of range")
    run_dir = Path(run_dir)
    log = Path(log)
    run_dir.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)

    stopped_stale = False
    stale = read_json(state_path(run_dir, name))
    if adopt and stale is not None and _adoptable(stale, argv, host, port):
        return {
            "name": name,
            "started": False,
            "adopted": True,
            "pid": stale["pid"],
            "pgid": stale["pgid"],
            "host": host,
            "port": port,
            "log": stale["log"],
            "up_s": round(time.time() - float(stale["started"]), 1),
            "stopped_stale": False,
        }
    if stale is not None:
        stopped_stale = stop_server(name, run_dir)["stopped"]
    waited = None
    if npu_memory_wait is not None:
        try:
            waited = npu_memory_wait()
        except (ValueError, OSError, subprocess.SubprocessError) as exc:
            raise ServerError(f"server '{name}' not started: {exc}") from exc

    if not port_free(host, port):
        raise PortInUse(_port_message(host, port))

    shown = redact(argv)
    marker = f"{name}.{secrets.token_hex(8)}"
    with log.open("wb") as out:
        header = (
            f"==> specfleet: server '{name}' starting {time.strftime('%Y-%m-%d %H:%M:%S')} "
            f"on {host}:{port}\n==> command: {json.dumps(shown)}\n"
        )
        out.write(header.encode())
        out.flush()
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {}), procs.OWNER_ENV: marker},
                cwd=str(cwd) if cwd else None,
                close_fds=True,
            )
        except (FileNotFoundError, PermissionError) as exc:
            raise BadInput(f"cannot run {argv[0]!r}: {exc.strerror or exc}") from exc
    _CHILDREN[proc.pid] = proc
    stat = proc_stat(proc.pid)
    pgid = os.getpgrp()  # the child's too: it is forked in our group and stays there
    state = {
        "name": name,
        "pid": proc.pid,
        "pgid": pgid,
        "marker": marker,
        "host": host,
        "port": port,
        "argv": shown,
        "log": str(log.absolute()),
        "started": time.time(),
        "boot_id": procs.boot_id(),
        "starttime": stat[2] if stat else None,
    }
    write_json_atomic(state_path(run_dir, name), state)
    return {
        "name": name,
        "started": True,
        "pid": proc.pid,
        "pgid": pgid,
        "host": host,
        "port": port,
        "log": state["log"],
        "stopped_stale": stopped_stale,
        **({"npu_memory": waited} if waited is not None else {}),
    }


def _adoptable(state: dict[str, Any], argv: list[str], host: str, port: int) -> bool:
    """Whether the recorded server runs exactly `argv` on `host`:`port` and still lives."""
    return (
        state.get("argv") == redact(argv)
        and state.get("host") == host
        and int(state.get("port", -1)) == port
        and _leader_alive(state)
    )


def hold(name: str, run_dir: Path, interval: float = POLL_INTERVAL_S) -> dict[str, Any]:
    """Return once the recorded server's processes are gone (stopped, crashed or ended with
    their group); at once when none is recorded."""
    state = read_json(state_path(Path(run_dir), name))
    began = time.monotonic()
    while state is not None and _live_members(state):
        time.sleep(interval)
    return {"name": name, "held_s": round(time.monotonic() - began, 1)}


def _require_state(name: str, run_dir: Path) -> dict[str, Any]:
    state = read_json(state_path(run_dir, name))
    if state is None:
        raise BadInput(f"no server '{name}' recorded in {run_dir} (start it first)")
    return state


def wait_healthy(
    name: str,
    run_dir: Path,
    timeout: float,
    interval: float = POLL_INTERVAL_S,
    tail: int = TAIL_LINES,
) -> dict[str, Any]:
    """Poll /health until 200. Raises ServerError (with the log tail) as soon as the
    server's processes are gone, or when `timeout` seconds pass."""
    state = _require_state(name, Path(run_dir))
    host, port = state["host"], int(state["port"])
    log = Path(state["log"])
    began = time.monotonic()
    deadline = began + timeout
    while True:
        if not _live_members(state):
            # It may have answered and exited in between; the log tells what happened.
            raise ServerError(
                f"server '{name}' exited before becoming healthy "
                f"({time.monotonic() - began:.1f}s into the wait); see {log}",
                tail_lines(log, tail),
            )
        if health_ok(host, port):
            now = time.time()
            return {
                "name": name,
                "healthy": True,
                "seconds": round(time.monotonic() - began, 1),
                "since_start_s": round(now - float(state["started"]), 1),
                "url": _url(host, port, ""),
            }
        if time.monotonic() >= deadline:
            raise ServerError(
                f"server '{name}' did not answer 200 on {_url(host, port, '/health')} "
                f"within {timeout:.0f}s; see {log}",
                tail_lines(log, tail),
            )
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))


def _leader_alive(state: dict[str, Any]) -> bool:
    """Whether the server's main process (the command start ran: vLLM's API server) still
    runs. Its other processes (vLLM's engine core) cannot serve without it."""
    return _is_ours(state) and procs.process_alive(int(state["pid"]))


def _stop_client(pid: int, starttime: int, grace_s: float) -> bool:
    """SIGTERM one process, SIGKILL it after `grace_s`. True if it had to be signalled."""
    if not procs.same_process(pid, starttime):
        return False
    for signum, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            return True
        deadline = time.monotonic() + wait_s
        while procs.same_process(pid, starttime) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not procs.same_process(pid, starttime):
            break
    return True


def watch(
    name: str,
    run_dir: Path,
    client_pid: int,
    timeout: Optional[float] = None,
    interval: float = POLL_INTERVAL_S,
    tail: int = TAIL_LINES,
    unhealthy_after_s: float = WATCH_UNHEALTHY_AFTER_S,
    health_every_s: float = WATCH_HEALTH_EVERY_S,
    client_grace_s: float = WATCH_CLIENT_GRACE_S,
) -> dict[str, Any]:
    """Watch the recorded server while process `client_pid` uses it; return once the client
    has exited (its exit status is for the caller to collect: it is not our child).

    Raises ServerError with the server's log tail, after stopping the client (SIGTERM, SIGKILL
    after `client_grace_s`), when the server's main process dies, when /health has failed for
    `unhealthy_after_s` seconds (0: never probe), or when `timeout` seconds pass. A client that
    exits after the server died (it noticed first) raises too: the server's death is the cause.
    The server itself is left to ``stop``.
    """
    state = _require_state(name, Path(run_dir))
    host, port = state["host"], int(state["port"])
    log = Path(state["log"])
    began = time.monotonic()
    client = proc_stat(client_pid)
    if client is None or client[0] in ("Z", "X"):
        return {"name": name, "client_pid": client_pid, "client_exited": True, "seconds": 0.0}
    client_start = client[2]
    last_healthy = next_probe = began
    problem = ""
    try:
        while True:
            elapsed = time.monotonic() - began
            client_done = not procs.same_process(client_pid, client_start)
            if not _leader_alive(state):
                problem = (
                    f"server '{name}' (pid {state['pid']}) died while pid {client_pid} used it, "
                    f"{elapsed:.1f}s into the watch"
                )
                break
            if client_done:
                return {
                    "name": name,
                    "client_pid": client_pid,
                    "client_exited": True,
                    "seconds": round(elapsed, 1),
                }
            now = time.monotonic()
            if unhealthy_after_s > 0 and now >= next_probe:
                next_probe = now + health_every_s
                if health_ok(host, port):
                    last_healthy = now
                elif now - last_healthy >= unhealthy_after_s:
                    problem = (
                        f"server '{name}' (pid {state['pid']}) has not answered "
                        f"{_url(host, port, '/health')} for {now - last_healthy:.0f}s"
                    )
                    break
            if timeout is not None and elapsed >= timeout:
                problem = f"pid {client_pid} still used server '{name}' after {timeout:.0f}s"
                break
            time.sleep(interval)
    finally:
        # Also when the watch itself is interrupted: the client must not outlive its guard.
        stopped = _stop_client(client_pid, client_start, client_grace_s)
    if stopped:
        problem += f"; stopped pid {client_pid}"
    raise ServerError(f"{problem}; server log: {log}", _tail_without_probes(log, tail))


def _tail_without_probes(log: Path, count: int) -> list[str]:
    """The log's last `count` lines, without the access-log lines of /health probes."""
    lines = [line for line in tail_lines(log, 100_000) if '"GET /health HTTP/' not in line]
    return lines[-count:] if count > 0 else []


def stop_server(name: str, run_dir: Path, grace_s: float = DEFAULT_GRACE_S) -> dict[str, Any]:
    """SIGTERM the server's processes, SIGKILL what is left after `grace_s`, forget the
    server. Idempotent: with no server recorded, or one already gone, it only cleans up."""
    path = state_path(Path(run_dir), name)
    state = read_json(path)
    result: dict[str, Any] = {"name": name, "stopped": False, "killed": False, "seconds": 0.0}
    if state is None:
        if path.exists():
            path.unlink()
        return result
    began = time.monotonic()
    members = _live_members(state)
    if members:
        result["stopped"] = True
        procs.signal_pids(members, signal.SIGTERM)
        deadline = began + grace_s
        while _live_members(state) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = _live_members(state)
        if left:
            result["killed"] = True
            procs.signal_pids(left, signal.SIGKILL)
            kill_deadline = time.monotonic() + 10
            while _live_members(state) and time.monotonic() < kill_deadline:
                time.sleep(0.1)
    left = _live_members(state)
    if left:
        raise ServerError(f"server '{name}': processes {left} survived SIGKILL")
    _reap_children()
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    result["seconds"] = round(time.monotonic() - began, 1)
    return result


def server_status(name: str, run_dir: Path, tail: int = 0) -> dict[str, Any]:
    """Whether the recorded server runs, its processes, and one /health probe."""
    state = read_json(state_path(Path(run_dir), name))
    if state is None:
        return {"name": name, "recorded": False, "running": False, "healthy": False}
    members = _live_members(state)
    result: dict[str, Any] = {
        "name": name,
        "recorded": True,
        "running": bool(members),
        "healthy": bool(members) and health_ok(state["host"], int(state["port"])),
        "pid": state["pid"],
        "pgid": state["pgid"],
        "processes": members,
        "host": state["host"],
        "port": state["port"],
        "argv": state["argv"],
        "log": state["log"],
        "uptime_s": round(time.time() - float(state["started"]), 1),
    }
    if tail:
        result["tail"] = tail_lines(Path(state["log"]), tail)
    return result


def _split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """Helper options before the first ``--``, the server command after it."""
    if "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1 :]
    return argv, []


def _parse_env(items: list[str]) -> dict[str, str]:
    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise BadInput(f"--env {item!r} is not NAME=VALUE")
        env[key] = value
    return env


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m specfleet_helpers.host.vllm_server",
        description=(
            "Start, wait for, inspect or stop one vLLM server (any HTTP server with a "
            "GET /health) of a stage, recorded in RUN_DIR/NAME.server.json. It runs in the "
            "caller's process group, so ending the stage's group ends it too. "
            "Prints one JSON line. Exit codes: 0 ok, 1 failed (died, timed out), 2 bad "
            "input, 3 port in use."
        ),
        epilog=(
            "example: python -m specfleet_helpers.host.vllm_server start --name serve "
            "--run-dir RUN --log RUN/serve.log --port 8000 -- "
            "python -m vllm.entrypoints.openai.api_server --model M --port 8000"
        ),
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--name", required=True, help="server name, e.g. hidden_states or serve")
        p.add_argument("--run-dir", required=True, type=Path, help="where NAME.server.json is")

    p = sub.add_parser(
        "start",
        help="start the command after -- in the background, return at once",
        description=(
            "Start the server command given after -- in the caller's process group, output "
            "to --log, and return at once. Refuses (exit 3) when the port is already held."
        ),
    )
    common(p)
    p.add_argument("--log", required=True, type=Path, help="file for the server's output")
    p.add_argument("--port", required=True, type=int, help="port the server will listen on")
    p.add_argument("--host", default=DEFAULT_HOST, help="address it binds (default %(default)s)")
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment variable for the server (repeat); no secrets here",
    )
    p.add_argument("--cwd", type=Path, help="working directory of the server")
    p.add_argument(
        "--adopt",
        action="store_true",
        help="keep a live server recorded under --name that runs exactly this command on "
        "this host and port (one started ahead of its stage) instead of replacing it",
    )
    p.add_argument(
        "--npu-memory",
        type=float,
        metavar="SHARE",
        help="on an NPU host: first wait until the devices have SHARE of their memory free "
        "(vllm-ascend refuses to start below it), after a stale server was stopped",
    )
    p.add_argument(
        "--npu-devices",
        type=npu_memory.parse_devices,
        default=None,
        help="logical device ids the wait watches (all: every device; default all)",
    )
    p.add_argument(
        "--npu-memory-timeout", type=float, default=180.0, help="seconds the wait takes at most"
    )

    p = sub.add_parser(
        "wait",
        help="poll GET /health until 200; fail fast if the server dies",
        description=(
            "Poll GET /health until it answers 200. Fails (exit 1, with the log tail) as soon "
            "as the server's processes are gone, or at --timeout."
        ),
    )
    common(p)
    p.add_argument("--timeout", required=True, type=float, help="seconds to wait at most")
    p.add_argument("--tail", type=int, default=TAIL_LINES, help="log lines shown on failure")

    p = sub.add_parser(
        "watch",
        help="guard a client of the server: stop it and fail if the server dies",
        description=(
            "Return (exit 0) once process --pid has exited. If the server dies first, stops "
            "answering /health for --unhealthy-after seconds, or --timeout passes, stop the "
            "client (SIGTERM, SIGKILL after --client-grace) and fail (exit 1) with the "
            "server's log tail. Collect the client's own exit status with `wait PID`."
        ),
    )
    common(p)
    p.add_argument("--pid", required=True, type=int, help="the client process to guard")
    p.add_argument("--timeout", type=float, help="seconds the client may run (default: no limit)")
    p.add_argument(
        "--unhealthy-after",
        type=float,
        default=WATCH_UNHEALTHY_AFTER_S,
        help="seconds /health may fail before the server counts as hung; 0: never probe "
        "(default %(default)s)",
    )
    p.add_argument(
        "--client-grace",
        type=float,
        default=WATCH_CLIENT_GRACE_S,
        help="seconds between SIGTERM and SIGKILL of the client (default %(default)s)",
    )
    p.add_argument("--tail", type=int, default=TAIL_LINES, help="log lines shown on failure")

    p = sub.add_parser("stop", help="end the server's processes (idempotent)")
    common(p)
    p.add_argument(
        "--grace",
        type=float,
        default=DEFAULT_GRACE_S,
        help="seconds between SIGTERM and SIGKILL (default %(default)s)",
    )

    p = sub.add_parser(
        "hold",
        help="return once the server's processes are gone",
        description=(
            "Block while the server recorded under --name runs; return (exit 0) once its "
            "processes are gone. A job that started a server ahead of its stage ends with it."
        ),
    )
    common(p)

    p = sub.add_parser("status", help="is it running, is it healthy")
    common(p)
    p.add_argument("--tail", type=int, default=0, help="log lines to include")
    return parser


def _exit_on_signal(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, command = _split_command(argv)
    parser = build_parser()
    args = parser.parse_args(own)
    if command and args.command != "start":
        parser.error("only start takes a command after --")
    try:
        if args.command == "start":
            result = start_server(
                args.name,
                args.run_dir,
                args.log,
                args.port,
                command,
                host=args.host,
                env=_parse_env(args.env),
                cwd=args.cwd,
                adopt=args.adopt,
                npu_memory_wait=(
                    (
                        lambda: npu_memory.wait(
                            args.npu_memory,
                            args.npu_devices,
                            args.npu_memory_timeout,
                            npu_memory.read_chips,
                        )
                    )
                    if args.npu_memory is not None
                    else None
                ),
            )
        elif args.command == "wait":
            try:
                result = wait_healthy(args.name, args.run_dir, args.timeout, tail=args.tail)
            except ServerError as exc:
                if isinstance(exc, BadInput):
                    raise
                error = str(exc)
                if exc.tail:
                    error += "\nlast log lines:\n" + "\n".join(exc.tail)
                print(json.dumps({"name": args.name, "healthy": False, "error": error}))
                print(f"error: {exc}", file=sys.stderr)
                for line in exc.tail:
                    print(f"  | {line}", file=sys.stderr)
                return exc.exit_code
        elif args.command == "watch":
            # Ended by the stage's supervisor (SIGTERM) or Ctrl-C: stop the client first.
            signal.signal(signal.SIGTERM, _exit_on_signal)
            try:
                result = watch(
                    args.name,
                    args.run_dir,
                    args.pid,
                    timeout=args.timeout,
                    tail=args.tail,
                    unhealthy_after_s=args.unhealthy_after,
                    client_grace_s=args.client_grace,
                )
            except KeyboardInterrupt:  # Ctrl-C on a script run by hand; the client is stopped
                return 130
            except ServerError as exc:
                if isinstance(exc, BadInput):
                    raise
                # One short JSON line, then the tail as lines of their own: a stage log shows it.
                print(json.dumps({"name": args.name, "ok": False, "error": str(exc)}), flush=True)
                print(f"error: {exc}", file=sys.stderr)
                if exc.tail:
                    print(f"--- last {len(exc.tail)} lines of the server log ---", file=sys.stderr)
                for line in exc.tail:
                    print(f"  | {line}", file=sys.stderr)
                return exc.exit_code
        elif args.command == "stop":
            result = stop_server(args.name, args.run_dir, grace_s=args.grace)
        elif args.command == "hold":
            result = hold(args.name, args.run_dir)
        else:
            result = server_status(args.name, args.run_dir, tail=args.tail)
    except ServerError as exc:
        print(json.dumps({"name": args.name, "error": str(exc)}))
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
