"""serve_mode service under systemd, for real: a host whose init is systemd (scripts/test-images'
systemd image, run with `podman run --systemd=always`), the service helper run on it as the
serve stage runs it. `--manager auto` picks systemd there; the unit restarts a killed server,
is enabled so a reboot (a restart of the host's container) starts it again, reads the API key
from a root-only file outside the work root, and `stop` removes it.

A small HTTP server (tests/fixtures/fake_service_server.py) stands in for vLLM: what is under
test is the unit and its supervision, not the model server. Skips without podman or the image
(`scripts/test-images build systemd`), unless SPECFLEET_REQUIRE_CONTAINERS=1 (CI), where it fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from siteruns import free_port

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
IMAGE = "localhost/specfleet-test/systemd:bookworm"
HELPERS = "/opt/specfleet/python_helpers"
FAKE_SERVER = "/opt/specfleet/fake_service_server.py"
# The work root on the host's own filesystem (not /tmp: systemd mounts a fresh tmpfs there).
ROOT = "/srv/specfleet"
KEY = "k3y-for-the-systemd-test"


def podman(*args: str, check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=check, **kw)


def image_ready() -> bool:
    return (
        bool(shutil.which("podman"))
        and podman("image", "exists", IMAGE, check=False).returncode == 0
    )


if not image_ready():
    if os.environ.get("SPECFLEET_REQUIRE_CONTAINERS") == "1":
        pytest.fail(f"{IMAGE} is missing (scripts/test-images build systemd)", pytrace=False)
    pytest.skip(
        f"needs podman and {IMAGE} (scripts/test-images build systemd)", allow_module_level=True
    )


def get(port: int, path: str) -> str:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
        return resp.read().decode()


def until(what: str, check: Callable[[], Any], timeout_s: float = 60) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


class SystemdHost:
    def __init__(self) -> None:
        self.name = f"specfleet-systemd-{uuid.uuid4().hex[:8]}"
        self.port = free_port()

    def start(self) -> None:
        podman(
            "run", "--detach", "--name", self.name, "--systemd=always", "--network=host",
            # systemd as PID 1 under podman on this machine (FIELD-NOTES): runc, and limits
            # systemd accepts.
            "--runtime=runc", "--ulimit=nofile=1024:1024", "--ulimit=nproc=4096:4096",
            f"--volume={REPO / 'python_helpers'}:{HELPERS}:ro",
            f"--volume={REPO / 'tests' / 'fixtures' / 'fake_service_server.py'}:{FAKE_SERVER}:ro",
            IMAGE,
        )  # fmt: skip
        self.wait_booted()

    def wait_booted(self) -> None:
        def booted() -> bool:
            out = self.exec("systemctl", "is-system-running", check=False).stdout.strip()
            return out in ("running", "degraded")

        until("systemd to finish booting", booted)

    def exec(self, *argv: str, check: bool = True, env: dict[str, str] | None = None):
        flags = [f"--env={k}={v}" for k, v in (env or {}).items()]
        return podman("exec", *flags, self.name, *argv, check=check)

    def service(self, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
        out = self.exec(
            "env", f"PYTHONPATH={HELPERS}", "PYTHONDONTWRITEBYTECODE=1", "python3.11",
            "-m", "specfleet_helpers.host.service", *args,
            "--name", "serve", "--run-dir", f"{ROOT}/run",
            check=False, env=env,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def systemd_host() -> Iterator[SystemdHost]:
    host = SystemdHost()
    try:
        host.start()
        yield host
    finally:
        podman("rm", "--force", "--time", "2", host.name, check=False)


def test_the_unit_restarts_the_server_and_starts_it_again_after_a_reboot(systemd_host):
    host = systemd_host
    launcher = f"{ROOT}/run/serve.service.sh"
    host.exec("mkdir", "-p", f"{ROOT}/run", f"{ROOT}/logs")
    host.exec(
        "sh", "-c",
        f"printf '#!/usr/bin/env bash\\nexec python3.11 {FAKE_SERVER} {host.port}\\n' > {launcher}",
    )  # fmt: skip
    deployed = host.service(
        "deploy", "--launcher", launcher, "--log", f"{ROOT}/logs/serve.service.log",
        "--port", str(host.port), "--pass-env", "VLLM_API_KEY", "--restart-delay-s", "1",
        env={"VLLM_API_KEY": KEY},
    )  # fmt: skip
    assert deployed["manager"] == "systemd", deployed
    first = host.service("wait", "--timeout", "60")
    assert first["unit"] == "specfleet-serve.service" and first["enabled"], first
    assert get(host.port, "/env") == KEY
    # The key is in a root-only file outside the work root, and nowhere under it.
    mode = host.exec("stat", "-c", "%a %U", "/etc/specfleet/serve.env").stdout.split()
    assert mode == ["600", "root"], mode
    leaked = host.exec("grep", "-rl", KEY, ROOT, check=False)
    assert leaked.stdout == "", leaked.stdout
    unit = host.exec("systemctl", "cat", "specfleet-serve.service").stdout
    assert "Restart=always" in unit and "EnvironmentFile=/etc/specfleet/serve.env" in unit
    assert KEY not in unit

    # The server is killed: systemd starts it again after RestartSec.
    host.exec("kill", "-9", str(first["main_pid"]))
    # The helper the dead server left ignores SIGTERM: systemd kills it after TimeoutStopSec
    # (30 s), then restarts the server after RestartSec.
    again = until(
        "the unit to restart the server",
        lambda: (
            (now := host.service("status")).get("healthy")
            and now["main_pid"] != first["main_pid"]
            and now
        ),
        timeout_s=120,
    )
    assert again["restarts"] == 1, again
    assert "specfleet supervisor" not in host.exec("ps", "-eo", "args").stdout

    # A reboot: the enabled unit starts with the system, the same launcher, the same key.
    podman("restart", "--time", "5", host.name)
    host.wait_booted()
    back = until(
        "the unit to start at boot", lambda: (s := host.service("status")).get("healthy") and s
    )
    assert back["launcher_sha256"] == first["launcher_sha256"] and back["launcher_unchanged"]
    assert get(host.port, "/env") == KEY

    # stop-serving: stopped, disabled, unit and key file removed; nothing comes back at boot.
    stopped = host.service("stop")
    assert stopped["stopped"] and stopped["removed"], stopped
    assert (
        host.exec(
            "test", "-e", "/etc/systemd/system/specfleet-serve.service", check=False
        ).returncode
        == 1
    )
    assert host.exec("test", "-e", "/etc/specfleet/serve.env", check=False).returncode == 1
    podman("restart", "--time", "5", host.name)
    host.wait_booted()
    time.sleep(2)
    assert not host.service("status")["deployed"]
    with pytest.raises(OSError):
        get(host.port, "/health")
