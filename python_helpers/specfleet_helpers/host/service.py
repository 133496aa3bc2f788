"""A server left running after the stage that deployed it (serve_mode: service), under a
supervisor that brings it back when it dies.

Two supervisors, chosen per host (``--manager auto``):

``systemd``
    a unit ``specfleet-NAME.service`` in /etc/systemd/system, where systemd is the running init
    and this runs as root: ``Restart=always`` restarts the server after a crash, ``enable``
    starts it again after a reboot, and ``systemctl status`` / ``journalctl`` work as for any
    service.
``specfleet``
    elsewhere (containers, hosts without systemd, a user without root): this module's own
    supervisor (``supervise``), a detached process that restarts the server whenever it exits,
    after ``--restart-delay-s``. On a host it does not survive a reboot; the next run's check
    finds the server gone and deploys it again. In specfleet's stage container (container
    runtime) it does: the container has a restart policy, and its command runs ``boot`` first,
    which starts the supervisor of every service recorded in the run directory again.

Either way the server's command is a launcher script the serve stage writes (ending in
``exec``), so both supervisors run exactly the same thing; what is deployed is identified by
the launcher's sha256, kept in RUN_DIR/NAME.service.json with the supervisor's details.
Secrets (``--pass-env VLLM_API_KEY``) never go into the launcher, the unit, this record or
anywhere under the work root: systemd reads them from /etc/specfleet/NAME.env (mode 0600, root
only; ``EnvironmentFile=``), specfleet's supervisor holds them in its own environment (readable
by its user only) and hands them to each restart. In the stage container they are also kept in
that file, in the container's own filesystem (not a mount), for ``boot`` after a restart.

The service's processes are not the deploying stage's: the supervisor starts in a session of
its own (or in systemd's cgroup), so the stage runner ending the stage's process group leaves
it running, which is the point.

Standard library only. Exit codes: 0 ok, 1 failure (the server did not come up, a command of
the supervisor failed), 2 bad input.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

from specfleet_helpers.files import tail_lines, write_json_atomic
from specfleet_helpers.host import procs
from specfleet_helpers.host.host_probe import port_free, port_owner
from specfleet_helpers.host.procs import proc_stat, read_json
from specfleet_helpers.host.vllm_server import health_ok

MANAGERS = ("auto", "systemd", "specfleet")
# Set in specfleet's stage container (container.INSIDE_ENV): services there are restored by
# `boot` when the container starts again.
INSIDE_CONTAINER_ENV = "SPECFLEET_CONTAINER"
# Secrets a server may be given (--pass-env); those not asked for never reach a service.
SECRET_ENV = ("VLLM_API_KEY",)
RECORD_SUFFIX = ".service.json"
UNIT_DIR = Path("/etc/systemd/system")
DEFAULT_RESTART_DELAY_S = 5.0
STOP_GRACE_S = 30.0
POLL_INTERVAL_S = 1.0
TAIL_LINES = 40

EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2


class ServiceError(Exception):
    exit_code = EXIT_FAILURE


class BadInput(ServiceError):
    exit_code = EXIT_BAD_INPUT


def record_path(run_dir: Path, name: str) -> Path:
    return Path(run_dir) / f"{name}{RECORD_SUFFIX}"


def main_record_path(run_dir: Path, name: str) -> Path:
    """The specfleet supervisor's own record of the server process it runs (its only writer)."""
    return Path(run_dir) / f"{name}.service.main.json"


SECRETS_DIR = Path("/etc/specfleet")


def env_file(name: str, secrets_dir: Path = SECRETS_DIR) -> Path:
    """Where systemd reads the service's secrets from (root only, outside the work root)."""
    return Path(secrets_dir) / f"{name}.env"


def unit_name(name: str) -> str:
    return f"specfleet-{name}.service"


def sha256_file(path: Path) -> Optional[str]:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def systemd_usable() -> bool:
    """systemd is the running init (its runtime directory exists) and we may add units."""
    return (
        Path("/run/systemd/system").is_dir()
        and os.geteuid() == 0
        and bool(shutil.which("systemctl"))
    )


def choose_manager(wanted: str) -> str:
    if wanted not in MANAGERS:
        raise BadInput(f"--manager is {wanted!r}, expected one of {', '.join(MANAGERS)}")
    if wanted == "auto":
        return "systemd" if systemd_usable() else "specfleet"
    if wanted == "systemd" and not systemd_usable():
        raise BadInput(
            "--manager systemd: systemd is not the running init here, or this user is not root "
            "(units go to /etc/systemd/system); use --manager auto or specfleet"
        )
    return wanted


# --- systemd -------------------------------------------------------------------------------


def render_unit(
    name: str,
    launcher: Path,
    log: Path,
    description: str,
    restart_delay_s: float,
    environment_file: Optional[Path] = None,
) -> str:
    # KillMode=mixed: SIGTERM to the server alone (vLLM's API server shuts its engine processes
    # down itself), then SIGKILL to whatever of the unit is left after TimeoutStopSec, the order
    # the specfleet supervisor stops in. After a crash a leftover that ignores SIGTERM (vLLM's
    # resource tracker does) holds the restart until TimeoutStopSec.
    return (
        "# Written by specfleet (python -m specfleet_helpers.host.service);\n"
        "# redeployed by the serve stage.\n"
        "[Unit]\n"
        f"Description={description}\n"
        "After=network-online.target\n"
        "Wants=network-online.target\n"
        "StartLimitIntervalSec=0\n"
        "\n"
        "[Service]\n"
        "Type=simple\n"
        "KillMode=mixed\n"
        + (f"EnvironmentFile={environment_file}\n" if environment_file else "")
        + f"ExecStart=/bin/bash {launcher}\n"
        "Restart=always\n"
        f"RestartSec={restart_delay_s:g}\n"
        f"TimeoutStopSec={STOP_GRACE_S:g}\n"
        f"StandardOutput=append:{log}\n"
        "StandardError=inherit\n"
        "\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )


def _systemctl(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["systemctl", *args], capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise ServiceError(
            f"systemctl {' '.join(args)} failed: {(proc.stderr or proc.stdout).strip()}"
        )
    return proc


def systemd_show(unit: str) -> dict[str, str]:
    out = _systemctl(
        "show",
        unit,
        "-p",
        "ActiveState",
        "-p",
        "SubState",
        "-p",
        "MainPID",
        "-p",
        "NRestarts",
        "-p",
        "LoadState",
        "-p",
        "UnitFileState",
        check=False,
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


# --- the specfleet supervisor --------------------------------------------------------------


def _child_env(drop: tuple[str, ...] = ()) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in drop}
    # The service is nobody's stage server and outlives the stage that deploys it: no marker
    # of either may reach it, or the end of that stage would end the service too.
    env.pop(procs.OWNER_ENV, None)
    env.pop(procs.STAGE_ENV, None)
    return env


def _log_line(log: Path, text: str) -> None:
    with log.open("a") as out:
        out.write(f"==> specfleet supervisor {time.strftime('%Y-%m-%d %H:%M:%S')}: {text}\n")


def supervise(name: str, run_dir: Path, launcher: Path, log: Path, restart_delay_s: float) -> int:
    """Run the launcher, and again whenever it exits, until SIGTERM. The server runs in a
    session (so a process group) of its own, ended whole on restart and on stop."""
    record = main_record_path(run_dir, name)
    stopping = False
    child: Optional[subprocess.Popen[bytes]] = None

    def on_term(_signum: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    restarts = 0
    while not stopping:
        with log.open("ab") as out:
            child = subprocess.Popen(
                ["/bin/bash", str(launcher)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=_child_env(),
                start_new_session=True,
                close_fds=True,
            )
        stat = proc_stat(child.pid)
        write_json_atomic(
            record,
            {
                "supervisor_pid": os.getpid(),
                "main_pid": child.pid,
                "main_starttime": stat[2] if stat else None,
                "restarts": restarts,
                "main_started": time.time(),
            },
        )
        while not stopping and child.poll() is None:
            time.sleep(0.5)
        if stopping:
            break
        # What the launcher left behind (engine processes of a server that crashed) goes with it.
        procs.kill_group(child.pid, grace_s=5.0, leader_only=True)
        restarts += 1
        _log_line(
            log,
            f"the server exited with code {child.returncode}; "
            f"restart {restarts} in {restart_delay_s:g} s",
        )
        deadline = time.monotonic() + restart_delay_s
        while not stopping and time.monotonic() < deadline:
            time.sleep(0.2)
    if child is not None:
        procs.kill_group(child.pid, grace_s=STOP_GRACE_S, leader_only=True)
    _log_line(log, "stopped")
    return 0


def _supervisor_alive(state: dict[str, Any]) -> bool:
    pid = state.get("supervisor_pid")
    return (
        bool(pid)
        and state.get("boot_id") == procs.boot_id()
        and procs.same_process(int(pid), state.get("supervisor_starttime"))
    )


def _main_state(run_dir: Path, name: str, state: dict[str, Any]) -> dict[str, Any]:
    """The supervisor's record of its server, when it is this deployment's supervisor's."""
    main = read_json(main_record_path(run_dir, name)) or {}
    return main if main.get("supervisor_pid") == state.get("supervisor_pid") else {}


def _main_alive(main: dict[str, Any], state: dict[str, Any]) -> bool:
    pid = main.get("main_pid")
    return (
        bool(pid)
        and state.get("boot_id") == procs.boot_id()
        and procs.same_process(int(pid), main.get("main_starttime"))
    )


def _start_supervisor(
    name: str,
    run_dir: Path,
    launcher: Path,
    log: Path,
    restart_delay_s: float,
    drop: tuple[str, ...] = (),
) -> dict[str, Any]:
    argv = [
        sys.executable,
        "-m",
        "specfleet_helpers.host.service",
        "supervise",
        "--name",
        name,
        "--run-dir",
        str(run_dir),
        "--launcher",
        str(launcher),
        "--log",
        str(log),
        "--restart-delay-s",
        str(restart_delay_s),
    ]
    with log.open("ab") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=_child_env(drop),
            start_new_session=True,
            close_fds=True,
        )
    stat = proc_stat(proc.pid)
    return {"supervisor_pid": proc.pid, "supervisor_starttime": stat[2] if stat else None}


# --- deploy / status / wait / stop -----------------------------------------------------------


def _read_env_file(path: Path) -> dict[str, str]:
    """What _write_env_file wrote (KEY="json string" lines)."""
    values = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key] = json.loads(value)
    return values


def _in_stage_container() -> bool:
    return bool(os.environ.get(INSIDE_CONTAINER_ENV)) and os.geteuid() == 0


def _write_env_file(path: Path, names: list[str]) -> bool:
    values = {n: os.environ[n] for n in names if os.environ.get(n)}
    if not values:
        path.unlink(missing_ok=True)
        return False
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        for key, value in values.items():
            out.write(f"{key}={json.dumps(value)}\n")
    os.replace(tmp, path)
    return True


def deploy(
    name: str,
    run_dir: Path,
    launcher: Path,
    log: Path,
    manager: str = "auto",
    host: str = "127.0.0.1",
    port: Optional[int] = None,
    description: str = "",
    pass_env: Optional[list[str]] = None,
    restart_delay_s: float = DEFAULT_RESTART_DELAY_S,
    unit_dir: Path = UNIT_DIR,
    secrets_dir: Path = SECRETS_DIR,
) -> dict[str, Any]:
    """Stop what runs under the name, then start the launcher under the chosen supervisor and
    record it. Refuses a port that something else holds once the old server is stopped."""
    run_dir, launcher, log = (
        Path(run_dir).absolute(),
        Path(launcher).absolute(),
        Path(log).absolute(),
    )
    if not launcher.is_file():
        raise BadInput(f"--launcher {launcher}: no such file")
    chosen = choose_manager(manager)
    run_dir.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    previous = stop(name, run_dir, remove=False)
    if port is not None and not port_free(host, port):
        owner = port_owner(port) or {}
        raise ServiceError(
            f"port {port} on {host} is in use by pid {owner.get('pid') or '?'} "
            f"({owner.get('cmdline') or 'owner not visible'}), "
            f"expected free for the '{name}' service; "
            "stop that process or choose another port"
        )
    state: dict[str, Any] = {
        "name": name,
        "manager": chosen,
        "launcher": str(launcher),
        "launcher_sha256": sha256_file(launcher),
        "log": str(log),
        "host": host,
        "port": port,
        "deployed_at": time.time(),
        "boot_id": procs.boot_id(),
    }
    _log_line(log, f"deploying {launcher} under {chosen}")
    if chosen == "systemd":
        unit = unit_name(name)
        unit_path = Path(unit_dir) / unit
        secrets = env_file(name, secrets_dir)
        has_env = _write_env_file(secrets, pass_env or [])
        state["environment_file"] = str(secrets) if has_env else None
        text = render_unit(
            name,
            launcher,
            log,
            description or f"specfleet {name}",
            restart_delay_s,
            secrets if has_env else None,
        )
        tmp = unit_path.with_name(unit_path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, unit_path)
        _systemctl("daemon-reload")
        _systemctl("enable", unit)
        _systemctl("restart", unit)
        shown = systemd_show(unit)
        state.update(
            unit=unit, unit_path=str(unit_path), restarts_at_deploy=int(shown.get("NRestarts") or 0)
        )
        write_json_atomic(record_path(run_dir, name), state)
    else:
        main_record_path(run_dir, name).unlink(missing_ok=True)
        # Only the secrets asked for reach the supervisor's environment (which it hands on).
        unasked = tuple(n for n in SECRET_ENV if n not in (pass_env or []))
        state["restart_delay_s"] = restart_delay_s
        if _in_stage_container():
            # `boot` starts the supervisor again when the container restarts, without Ansible.
            secrets = env_file(name, secrets_dir)
            state["environment_file"] = (
                str(secrets) if _write_env_file(secrets, pass_env or []) else None
            )
            state["restored_by_boot"] = True
        state.update(_start_supervisor(name, run_dir, launcher, log, restart_delay_s, unasked))
        write_json_atomic(record_path(run_dir, name), state)
    return {**status(name, run_dir), "replaced": previous.get("stopped", False)}


def restore(name: str, run_dir: Path) -> dict[str, Any]:
    """Start the supervisor of a deployed specfleet-managed service again when it is not
    running (its container restarted, the host rebooted), with the launcher it was deployed
    with: the deployment stays the same (launcher sha256), only the pids are new."""
    run_dir = Path(run_dir).absolute()
    state = read_json(record_path(run_dir, name))
    if state is None:
        raise BadInput(f"no service '{name}' deployed in {run_dir}")
    if state.get("manager") != "specfleet":
        return {"name": name, "restored": False, "why": f"managed by {state.get('manager')}"}
    if _supervisor_alive(state):
        return {"name": name, "restored": False, "why": "running"}
    launcher, log = Path(state["launcher"]), Path(state["log"])
    if sha256_file(launcher) != state.get("launcher_sha256"):
        # Not what was checked: the next serve run redeploys it.
        return {"name": name, "restored": False, "why": f"{launcher} changed or is gone"}
    secrets: dict[str, str] = {}
    if state.get("environment_file"):
        try:
            secrets = _read_env_file(Path(state["environment_file"]))
        except (OSError, ValueError):
            return {"name": name, "restored": False, "why": "its secrets file is gone"}
    main_record_path(run_dir, name).unlink(missing_ok=True)
    _log_line(log, "restoring the service after a restart of its container or host")
    os.environ.update(secrets)
    try:
        unasked = tuple(n for n in SECRET_ENV if n not in secrets)
        started = _start_supervisor(
            name,
            run_dir,
            launcher,
            log,
            float(state.get("restart_delay_s") or DEFAULT_RESTART_DELAY_S),
            unasked,
        )
    finally:
        for key in secrets:
            os.environ.pop(key, None)
    state.update(started, boot_id=procs.boot_id(), restored_at=time.time())
    write_json_atomic(record_path(run_dir, name), state)
    return {"name": name, "restored": True, **started}


def boot(run_dir: Path) -> list[dict[str, Any]]:
    """restore() every service recorded in run_dir that asked for it (deployed in the stage
    container): the stage container's command runs this when it starts."""
    results = []
    for path in sorted(Path(run_dir).glob(f"*{RECORD_SUFFIX}")):
        state = read_json(path) or {}
        if not state.get("restored_by_boot") or not state.get("name"):
            continue
        try:
            results.append(restore(state["name"], run_dir))
        except (OSError, ServiceError) as exc:
            results.append({"name": state["name"], "restored": False, "why": str(exc)})
    return results


def status(name: str, run_dir: Path) -> dict[str, Any]:
    """What runs under the name: {deployed, manager, running, main_pid, restarts, launcher_*}.
    `running` means the supervisor is up and the server process is alive (it may still be
    starting: `healthy` is for /health)."""
    state = read_json(record_path(Path(run_dir), name))
    if state is None:
        return {"name": name, "deployed": False, "running": False}
    out: dict[str, Any] = {
        "name": name,
        "deployed": True,
        "manager": state.get("manager"),
        "launcher": state.get("launcher"),
        "launcher_sha256": state.get("launcher_sha256"),
        "launcher_unchanged": sha256_file(Path(state.get("launcher", "")))
        == state.get("launcher_sha256"),
        "host": state.get("host"),
        "port": state.get("port"),
        "log": state.get("log"),
    }
    if state.get("manager") == "systemd":
        shown = systemd_show(state["unit"])
        main_pid = int(shown.get("MainPID") or 0)
        restarts = int(shown.get("NRestarts") or 0) - int(state.get("restarts_at_deploy") or 0)
        out.update(
            unit=state["unit"],
            active_state=shown.get("ActiveState"),
            sub_state=shown.get("SubState"),
            enabled=shown.get("UnitFileState") == "enabled",
            running=shown.get("ActiveState") == "active"
            and shown.get("SubState") == "running"
            and main_pid > 0,
            main_pid=main_pid or None,
            restarts=max(restarts, 0),
        )
    else:
        supervisor = _supervisor_alive(state)
        main = _main_state(Path(run_dir), name, state)
        alive = supervisor and _main_alive(main, state)
        out.update(
            supervisor_pid=state.get("supervisor_pid") if supervisor else None,
            running=alive,
            main_pid=main.get("main_pid") if alive else None,
            restarts=int(main.get("restarts") or 0),
        )
    if out.get("port"):
        out["healthy"] = bool(out["running"]) and health_ok(out["host"], int(out["port"]))
    return out


def wait(name: str, run_dir: Path, timeout: float, tail: int = TAIL_LINES) -> dict[str, Any]:
    """Poll /health until 200. Fails with the log tail when the server exits (the supervisor
    counts a restart) or the timeout passes: a server that dies while starting would only die
    again."""
    began = time.monotonic()
    first = status(name, run_dir)
    if not first["deployed"]:
        raise BadInput(f"no service '{name}' deployed in {run_dir}")
    if not first.get("port"):
        raise BadInput(f"the service '{name}' was deployed without --port: nothing to wait for")
    while True:
        now = status(name, run_dir)
        if now.get("healthy"):
            return {**now, "waited_s": round(time.monotonic() - began, 1)}
        if (
            now.get("restarts", 0) > first.get("restarts", 0)
            or (now["manager"] == "specfleet" and not now.get("supervisor_pid"))
            or (now["manager"] == "systemd" and now.get("active_state") == "failed")
        ):
            why = "the server exited while starting (its supervisor restarted it)"
            break
        if time.monotonic() - began > timeout:
            why = f"no answer on /health within {timeout:g} s"
            break
        time.sleep(POLL_INTERVAL_S)
    log = Path(now.get("log") or "")
    lines = tail_lines(log, tail) if log.is_file() else []
    raise ServiceError(
        f"service '{name}' ({now['manager']}): {why}. Last lines of {log}:\n" + "\n".join(lines)
    )


def stop(
    name: str, run_dir: Path, remove: bool = True, unit_dir: Optional[Path] = None
) -> dict[str, Any]:
    """Stop the server and its supervisor; with `remove`, also disable and delete the unit,
    the env file and the record. Idempotent."""
    run_dir = Path(run_dir)
    state = read_json(record_path(run_dir, name))
    if state is None:
        return {"name": name, "stopped": False, "removed": remove}
    stopped = False
    if state.get("manager") == "systemd":
        unit = state["unit"]
        if systemd_usable():
            stopped = systemd_show(unit).get("ActiveState") in ("active", "activating", "reloading")
            _systemctl("stop", unit, check=False)
            if remove:
                _systemctl("disable", unit, check=False)
                Path(state.get("unit_path") or Path(unit_dir or UNIT_DIR) / unit).unlink(
                    missing_ok=True
                )
                _systemctl("daemon-reload", check=False)
    else:
        if _supervisor_alive(state):
            stopped = True
            os.kill(int(state["supervisor_pid"]), signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_S + 10
            while _supervisor_alive(state) and time.monotonic() < deadline:
                time.sleep(0.2)
            if _supervisor_alive(state):
                os.kill(int(state["supervisor_pid"]), signal.SIGKILL)
        # A server whose supervisor was killed outright is still stopped.
        main = _main_state(run_dir, name, state)
        if _main_alive(main, state):
            stopped = True
            procs.kill_group(int(main["main_pid"]), grace_s=STOP_GRACE_S, leader_only=True)
        main_record_path(run_dir, name).unlink(missing_ok=True)
    if remove:
        if state.get("environment_file"):
            Path(state["environment_file"]).unlink(missing_ok=True)
        record_path(run_dir, name).unlink(missing_ok=True)
    return {"name": name, "stopped": stopped, "removed": remove, "manager": state.get("manager")}


# --- CLI -------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m specfleet_helpers.host.service",
        description="Deploy a server as a supervised service (systemd unit, or specfleet's own "
        "supervisor where systemd is not usable), report on it, wait for it, stop it.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--name", required=True, help="service name (unit specfleet-NAME.service)")
        p.add_argument(
            "--run-dir", type=Path, required=True, help="where NAME.service.json is kept"
        )

    p = sub.add_parser(
        "deploy", help="(re)start the launcher under its supervisor; prints its status"
    )
    common(p)
    p.add_argument("--launcher", type=Path, required=True, help="bash script that execs the server")
    p.add_argument("--log", type=Path, required=True, help="the server's log (appended)")
    p.add_argument("--manager", default="auto", choices=MANAGERS)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument(
        "--port", type=int, help="the server's port: must be free once the old server stopped"
    )
    p.add_argument("--description", default="")
    p.add_argument(
        "--pass-env",
        action="append",
        default=[],
        metavar="VAR",
        help="environment variable for the server, kept in a 0600 file (e.g. VLLM_API_KEY)",
    )
    p.add_argument("--restart-delay-s", type=float, default=DEFAULT_RESTART_DELAY_S)
    p.add_argument("--unit-dir", type=Path, default=UNIT_DIR, help=argparse.SUPPRESS)

    p = sub.add_parser("status", help="is it deployed, running, healthy; its pid and restarts")
    common(p)

    p = sub.add_parser(
        "wait", help="until /health answers; fail with the log tail if the server exits"
    )
    common(p)
    p.add_argument("--timeout", type=float, required=True)

    p = sub.add_parser(
        "stop", help="stop it and remove its unit or supervisor and record (idempotent)"
    )
    common(p)
    p.add_argument("--keep", action="store_true", help="stop only: keep the unit and the record")

    p = sub.add_parser(
        "boot",
        help="start again the supervisors of the services deployed in specfleet's stage "
        "container (its command runs this when the container starts)",
    )
    p.add_argument("--run-dir", type=Path, required=True, help="where the records are kept")

    p = sub.add_parser("supervise", help=argparse.SUPPRESS)
    common(p)
    p.add_argument("--launcher", type=Path, required=True)
    p.add_argument("--log", type=Path, required=True)
    p.add_argument("--restart-delay-s", type=float, default=DEFAULT_RESTART_DELAY_S)
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "supervise":
            return supervise(args.name, args.run_dir, args.launcher, args.log, args.restart_delay_s)
        if args.command == "boot":
            for line in boot(args.run_dir):
                print(json.dumps(line, sort_keys=True))
            return 0
        if args.command == "deploy":
            result = deploy(
                args.name,
                args.run_dir,
                args.launcher,
                args.log,
                args.manager,
                args.host,
                args.port,
                args.description,
                args.pass_env,
                args.restart_delay_s,
                args.unit_dir,
            )
        elif args.command == "status":
            result = status(args.name, args.run_dir)
        elif args.command == "wait":
            result = wait(args.name, args.run_dir, args.timeout)
        else:
            result = stop(args.name, args.run_dir, remove=not args.keep)
    except ServiceError as exc:
        print(f"service {args.command}: {exc}", file=sys.stderr)
        return exc.exit_code
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
