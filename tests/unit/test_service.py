"""Tests for specfleet_helpers.host.service: a server left running under a supervisor.

The specfleet supervisor is exercised for real: the launcher execs a small Python HTTP server
(GET /health, GET /env answers the API key it sees), with a child that ignores SIGTERM as
vLLM's multiprocessing resource tracker does. systemd cannot run here as init; its unit text
is checked here and the unit runs for real in the systemd test host of the integration tests
(tests/integration/test_systemd_service.py); `boot` in the stage container, for real, in
tests/integration/test_container_runtime.py.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import time
import urllib.request
from pathlib import Path

import pytest
from procutil import HELPERS, pid_alive, run_helper, wait_until
from specfleet_helpers.host import host_probe, service

# A small HTTP server standing in for vLLM (tests/fixtures/fake_service_server.py).
FAKE_SERVER = (
    Path(__file__).resolve().parents[1] / "fixtures" / "fake_service_server.py"
).read_text()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get(port: int, path: str) -> str:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
        return resp.read().decode()


@pytest.fixture
def layout(tmp_path: Path):
    port = free_port()
    server = tmp_path / "fake_server.py"
    server.write_text(FAKE_SERVER)
    launcher = tmp_path / "serve.service.sh"
    env_file = tmp_path / "run" / "serve.service.env"
    launcher.write_text(
        "#!/usr/bin/env bash\nset -euo pipefail\n"
        f"if [ -f {env_file} ]; then set -a; . {env_file}; set +a; fi\n"
        f"exec python3 {server} {port}\n"
    )
    run = tmp_path / "run"
    yield {"port": port, "launcher": launcher, "run": run, "log": tmp_path / "serve.log"}
    service.stop("serve", run)


def deploy(layout, *extra: str):
    return run_helper(
        "specfleet_helpers.host.service",
        "deploy",
        "--name=serve",
        f"--run-dir={layout['run']}",
        f"--launcher={layout['launcher']}",
        f"--log={layout['log']}",
        "--manager=specfleet",
        f"--port={layout['port']}",
        "--restart-delay-s=0.5",
        *extra,
    )


def test_deploy_serves_after_the_deploying_process_ends_and_comes_back_after_a_kill(layout):
    done = deploy(layout)
    assert done.returncode == 0, done.stderr
    deployed = json.loads(done.stdout)
    assert deployed["manager"] == "specfleet" and deployed["deployed"]
    # The deploying process (run_helper's interpreter) has exited: the server must not go with it.
    up = service.wait("serve", layout["run"], timeout=30)
    assert up["healthy"] and up["running"] and up["restarts"] == 0
    first = up["main_pid"]

    os.kill(first, signal.SIGKILL)
    assert wait_until(
        lambda: (
            service.status("serve", layout["run"]).get("healthy")
            and service.status("serve", layout["run"])["main_pid"] != first
        ),
        timeout=20,
    )
    now = service.status("serve", layout["run"])
    assert now["restarts"] == 1 and now["launcher_unchanged"]
    assert "restart 1 in 0.5 s" in layout["log"].read_text()


def test_stop_ends_every_process_without_waiting_out_the_grace_and_is_idempotent(layout):
    assert deploy(layout).returncode == 0
    up = service.wait("serve", layout["run"], timeout=30)
    supervisor, main = up["supervisor_pid"], up["main_pid"]
    began = time.monotonic()
    stopped = service.stop("serve", layout["run"])
    # The SIGTERM-ignoring helper is killed once the server itself has exited.
    assert time.monotonic() - began < 10
    assert stopped["stopped"] and stopped["removed"]
    assert not pid_alive(supervisor) and not pid_alive(main)
    assert host_probe.port_free("127.0.0.1", layout["port"])
    assert not service.record_path(layout["run"], "serve").exists()
    assert service.status("serve", layout["run"]) == {
        "name": "serve",
        "deployed": False,
        "running": False,
    }
    assert service.stop("serve", layout["run"])["stopped"] is False


def test_redeploy_replaces_the_running_server(layout):
    assert deploy(layout).returncode == 0
    first = service.wait("serve", layout["run"], timeout=30)
    again = deploy(layout)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["replaced"] is True
    second = service.wait("serve", layout["run"], timeout=30)
    assert second["supervisor_pid"] != first["supervisor_pid"]
    assert not pid_alive(first["supervisor_pid"]) and not pid_alive(first["main_pid"])


def test_the_api_key_reaches_the_server_and_no_file(layout):
    os.environ["VLLM_API_KEY"] = "s3cret-key"
    try:
        done = deploy(layout, "--pass-env=VLLM_API_KEY")
    finally:
        del os.environ["VLLM_API_KEY"]
    assert done.returncode == 0, done.stderr
    up = service.wait("serve", layout["run"], timeout=30)
    assert get(layout["port"], "/env") == "s3cret-key"
    # specfleet's supervisor holds it in its environment (its user only), for every restart.
    environ = Path(f"/proc/{up['supervisor_pid']}/environ").read_bytes()
    assert b"VLLM_API_KEY=s3cret-key" in environ
    written = [
        p
        for p in layout["run"].parent.rglob("*")
        if p.is_file() and b"s3cret-key" in p.read_bytes()
    ]
    assert written == [] and "s3cret-key" not in done.stdout
    # Not asked for (no --pass-env): the key in the deploying environment does not reach it.
    os.environ["VLLM_API_KEY"] = "s3cret-key"
    try:
        unasked = deploy(layout)
    finally:
        del os.environ["VLLM_API_KEY"]
    assert unasked.returncode == 0, unasked.stderr
    other = service.wait("serve", layout["run"], timeout=30)
    assert b"VLLM_API_KEY" not in Path(f"/proc/{other['supervisor_pid']}/environ").read_bytes()
    assert get(layout["port"], "/env") == ""


def test_systemd_reads_the_key_from_a_root_only_file_outside_the_work_root(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "s3cret-key")
    secrets = service.env_file("serve", tmp_path / "etc")
    assert service._write_env_file(secrets, ["VLLM_API_KEY"])
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o600
    assert stat.S_IMODE(secrets.parent.stat().st_mode) == 0o700
    assert secrets.read_text() == 'VLLM_API_KEY="s3cret-key"\n'
    unit = service.render_unit("serve", Path("/srv/l.sh"), Path("/srv/l.log"), "d", 5, secrets)
    assert f"EnvironmentFile={secrets}" in unit.splitlines() and "s3cret-key" not in unit


def test_a_busy_port_is_refused_naming_it(layout):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", layout["port"]))
        sock.listen()
        done = deploy(layout)
    assert done.returncode == 1
    assert f"port {layout['port']} on 127.0.0.1 is in use by pid {os.getpid()}" in done.stderr
    assert not service.status("serve", layout["run"])["deployed"]


def test_wait_fails_fast_with_the_log_tail_when_the_server_exits_while_starting(layout):
    layout["launcher"].write_text("#!/usr/bin/env bash\necho 'boom: no such model' >&2\nexit 3\n")
    assert deploy(layout).returncode == 0
    began = time.monotonic()
    with pytest.raises(service.ServiceError) as raised:
        service.wait("serve", layout["run"], timeout=60)
    assert time.monotonic() - began < 20
    assert "exited while starting" in str(raised.value) and "boom: no such model" in str(
        raised.value
    )


def test_a_changed_launcher_shows_in_the_status(layout):
    assert deploy(layout).returncode == 0
    service.wait("serve", layout["run"], timeout=30)
    layout["launcher"].write_text(layout["launcher"].read_text() + "# edited by hand\n")
    assert service.status("serve", layout["run"])["launcher_unchanged"] is False


def test_the_port_probe_knows_the_services_own_server(layout):
    layout["launcher"].write_text(
        layout["launcher"]
        .read_text()
        .replace("exec python3", "export SPECFLEET_SERVICE=serve\nexec python3")
    )
    assert deploy(layout).returncode == 0
    service.wait("serve", layout["run"], timeout=30)
    owner = host_probe.port_owner(layout["port"])
    assert owner and owner["service"] == "serve"


def test_systemd_is_refused_where_it_is_not_usable(monkeypatch):
    monkeypatch.setattr(service, "systemd_usable", lambda: False)
    assert service.choose_manager("auto") == "specfleet"
    with pytest.raises(
        service.BadInput, match="--manager systemd: systemd is not the running init"
    ):
        service.choose_manager("systemd")
    monkeypatch.setattr(service, "systemd_usable", lambda: True)
    assert service.choose_manager("auto") == "systemd"


def test_the_unit_restarts_always_and_starts_at_boot():
    text = service.render_unit(
        "serve", Path("/srv/run/serve.service.sh"), Path("/srv/logs/serve.log"), "d", 5
    )
    lines = text.splitlines()
    for line in (
        "ExecStart=/bin/bash /srv/run/serve.service.sh",
        "Restart=always",
        "KillMode=mixed",
        "RestartSec=5",
        "StartLimitIntervalSec=0",
        "StandardOutput=append:/srv/logs/serve.log",
        "WantedBy=multi-user.target",
    ):
        assert line in lines, line


def test_help_names_every_command():
    done = run_helper("specfleet_helpers.host.service", "--help")
    assert done.returncode == 0
    for command in ("deploy", "status", "wait", "stop"):
        assert command in done.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="the stage container's services run as root")
def test_boot_brings_back_what_was_deployed_in_the_stage_container(layout, tmp_path, monkeypatch):
    """In specfleet's stage container the supervisor goes down with the container; the
    container's command runs `boot` when the engine starts it again, which starts the same
    deployment (same launcher, same secret) without any specfleet run."""
    monkeypatch.setenv(service.INSIDE_CONTAINER_ENV, "specfleet")
    monkeypatch.setenv("PYTHONPATH", str(HELPERS))
    monkeypatch.setenv("VLLM_API_KEY", "k3y-in-the-container")
    secrets = tmp_path / "etc-specfleet"
    service.deploy(
        "serve", layout["run"], layout["launcher"], layout["log"], manager="specfleet",
        port=layout["port"], pass_env=["VLLM_API_KEY"], restart_delay_s=0.5, secrets_dir=secrets,
    )  # fmt: skip
    monkeypatch.delenv("VLLM_API_KEY")
    first = service.wait("serve", layout["run"], timeout=30)
    kept = secrets / "serve.env"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert service.boot(layout["run"]) == [{"name": "serve", "restored": False, "why": "running"}]

    # The container stops: every process in it ends at once.
    os.kill(first["supervisor_pid"], signal.SIGKILL)
    os.killpg(first["main_pid"], signal.SIGKILL)
    # deploy() ran in this process, so the supervisor is its child: reap it, or it stays a
    # zombie that still looks like the same process (a container's init reaps it there).
    os.waitpid(first["supervisor_pid"], 0)
    assert wait_until(lambda: not service.status("serve", layout["run"])["running"], timeout=10)

    restored = service.boot(layout["run"])
    assert [r["restored"] for r in restored] == [True], restored
    back = service.wait("serve", layout["run"], timeout=30)
    assert back["supervisor_pid"] != first["supervisor_pid"]
    assert back["launcher_sha256"] == first["launcher_sha256"] and back["launcher_unchanged"]
    assert get(layout["port"], "/env") == "k3y-in-the-container"
    assert "restoring the service" in layout["log"].read_text()
    # A launcher changed meanwhile is not what was checked: boot leaves it to the next run.
    service.stop("serve", layout["run"], remove=False)
    layout["launcher"].write_text(layout["launcher"].read_text() + "# changed\n")
    assert service.boot(layout["run"])[0]["restored"] is False
    service.stop("serve", layout["run"])
    assert not kept.exists(), "stop removes the secret"


def test_boot_leaves_services_deployed_on_the_host_alone(layout, monkeypatch):
    monkeypatch.delenv(service.INSIDE_CONTAINER_ENV, raising=False)
    assert deploy(layout).returncode == 0
    up = service.wait("serve", layout["run"], timeout=30)
    service.stop("serve", layout["run"], remove=False)
    assert service.boot(layout["run"]) == []
    assert not pid_alive(up["supervisor_pid"])
