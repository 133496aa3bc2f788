"""Tests for specfleet_helpers.host.vllm_server (and the argv builder of hidden_states_connector).

Fast tests start a real but fake "server": a small Python HTTP server answering GET
/health, started detached by the helper's CLI, with a child process of its own so that
stopping the whole process group can be checked with signal 0. Processes that died but
were not reaped (zombies) count as gone: the host's init may not reap orphans.

One slow test (SPECFLEET_SLOW_TESTS=1) starts real vLLM CPU with a tiny synthesized Qwen3
and the CPU hidden-states connector, and checks that hidden-state files appear.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from procutil import pid_alive, wait_until
from specfleet_helpers.cpu.hidden_states_connector import (
    aux_layer_ids,
    hidden_states_server_argv,
    kv_transfer_config,
)
from specfleet_helpers.host import vllm_server

REPO_ROOT = Path(__file__).resolve().parents[2]
HELPERS = REPO_ROOT / "python_helpers"
CPU_VENV_PYTHON = REPO_ROOT / ".work" / "local" / "venv" / "bin" / "python"

FAKE_SERVER = r"""
import http.server, os, signal, subprocess, sys, time

port, child_file, delay, ignore_term = sys.argv[1:5]
port, delay = int(port), float(delay)
if ignore_term == "1":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen(["sleep", "300"])
with open(child_file + ".tmp", "w") as fh:
    fh.write(str(child.pid))
os.replace(child_file + ".tmp", child_file)
print("fake server: loading", flush=True)
time.sleep(delay)

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass

server = http.server.HTTPServer(("127.0.0.1", port), Handler)
print(f"fake server: listening on {port}", flush=True)
server.serve_forever()
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "specfleet_helpers.host.vllm_server", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(HELPERS)},
    )


class Fake:
    """One fake server under tmp_path: its script, port, run dir, log and child pid file."""

    def __init__(self, tmp_path: Path, name: str = "serve") -> None:
        self.name = name
        self.port = free_port()
        self.run_dir = tmp_path / "run"
        self.log = tmp_path / "logs" / f"{name}.log"
        self.script = tmp_path / "fake_server.py"
        self.script.write_text(FAKE_SERVER)
        self.child_file = tmp_path / f"{name}.child"

    def argv(self, delay: float = 0.0, ignore_term: bool = False) -> list[str]:
        return [
            sys.executable,
            str(self.script),
            str(self.port),
            str(self.child_file),
            str(delay),
            "1" if ignore_term else "0",
        ]

    def start(self, *argv: str, adopt: bool = False) -> subprocess.CompletedProcess:
        command = list(argv) or self.argv()
        return cli(
            "start",
            f"--name={self.name}",
            f"--run-dir={self.run_dir}",
            f"--log={self.log}",
            f"--port={self.port}",
            *(["--adopt"] if adopt else []),
            "--",
            *command,
            timeout=20,  # also proves start does not hold our stdout open
        )

    def wait(self, timeout: float = 60) -> subprocess.CompletedProcess:
        return cli(
            "wait", f"--name={self.name}", f"--run-dir={self.run_dir}", f"--timeout={timeout}"
        )

    def stop(self, grace: float = 15) -> subprocess.CompletedProcess:
        return cli("stop", f"--name={self.name}", f"--run-dir={self.run_dir}", f"--grace={grace}")

    def child_pid(self) -> int:
        assert wait_until(self.child_file.is_file, 10), "fake server never wrote its child pid"
        return int(self.child_file.read_text())

    @property
    def state_file(self) -> Path:
        return self.run_dir / f"{self.name}.server.json"


@pytest.fixture
def fakes(tmp_path):
    made: list[Fake] = []

    def make(name: str = "serve") -> Fake:
        fake = Fake(tmp_path, name)
        made.append(fake)
        return fake

    yield make
    for fake in made:
        vllm_server.stop_server(fake.name, fake.run_dir, grace_s=2)


def test_start_wait_status_stop(fakes):
    fake = fakes()
    began = time.monotonic()
    started = fake.start(*fake.argv(delay=1.5))
    assert started.returncode == 0, started.stderr
    assert time.monotonic() - began < 15
    info = json.loads(started.stdout)
    assert info["started"] is True
    assert info["port"] == fake.port
    assert info["host"] == "127.0.0.1"
    # One owner per process: the server stays in the caller's process group (a stage
    # script's), so ending that group ends the server too.
    assert info["pgid"] == os.getpgrp() != info["pid"]
    assert info["stopped_stale"] is False
    state = json.loads(fake.state_file.read_text())
    assert {"pid", "pgid", "marker", "port", "host", "argv", "started"} <= set(state)
    assert state["argv"] == fake.argv(delay=1.5)
    assert os.getpgid(state["pid"]) == os.getpgrp()  # the caller's process group
    assert os.getsid(state["pid"]) == os.getsid(0)  # and its session

    waited = fake.wait()
    assert waited.returncode == 0, waited.stderr
    healthy = json.loads(waited.stdout)
    assert healthy["healthy"] is True
    assert healthy["seconds"] >= 0
    with urllib.request.urlopen(f"http://127.0.0.1:{fake.port}/health", timeout=5) as resp:
        assert resp.status == 200

    status = cli("status", f"--name={fake.name}", f"--run-dir={fake.run_dir}", "--tail=5")
    report = json.loads(status.stdout)
    assert report["running"] is True
    assert report["healthy"] is True
    assert set(report["processes"]) >= {state["pid"], fake.child_pid()}
    assert any("listening" in line for line in report["tail"])
    log_lines = fake.log.read_text().splitlines()
    assert log_lines[0].startswith("==> specfleet: server 'serve' starting ")

    child = fake.child_pid()
    stopped = fake.stop()
    assert stopped.returncode == 0, stopped.stderr
    assert json.loads(stopped.stdout)["stopped"] is True
    assert not pid_alive(state["pid"])
    assert not pid_alive(child)
    assert not fake.state_file.exists()
    gone = json.loads(cli("status", f"--name={fake.name}", f"--run-dir={fake.run_dir}").stdout)
    assert gone == {"name": "serve", "recorded": False, "running": False, "healthy": False}


def test_port_held_by_someone_else_is_refused_with_exit_3(fakes):
    fake = fakes()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", fake.port))
        holder.listen(1)
        proc = fake.start()
    assert proc.returncode == 3
    assert str(fake.port) in proc.stderr
    assert f"pid {os.getpid()}" in proc.stderr  # the owner, visible: this test process
    assert len(proc.stderr.strip().splitlines()) == 1
    assert str(fake.port) in json.loads(proc.stdout)["error"]
    assert not fake.state_file.exists()
    assert not fake.child_file.exists()  # nothing was started


def test_wait_fails_fast_with_the_log_tail_when_the_server_dies(fakes):
    fake = fakes()
    crash = [
        sys.executable,
        "-c",
        "import sys, time; print('loading weights'); print('ValueError: bad flag --foo'); "
        "sys.stdout.flush(); time.sleep(0.5); sys.exit(1)",
    ]
    assert fake.start(*crash).returncode == 0
    began = time.monotonic()
    proc = fake.wait(timeout=120)
    elapsed = time.monotonic() - began
    assert proc.returncode == 1
    assert elapsed < 10, f"wait took {elapsed:.1f}s to notice the death"
    out = json.loads(proc.stdout)
    assert out["healthy"] is False
    assert "exited before becoming healthy" in out["error"]
    assert "ValueError: bad flag --foo" in out["error"]
    assert "ValueError: bad flag --foo" in proc.stderr
    # stop after a death only cleans up
    stopped = json.loads(fake.stop().stdout)
    assert stopped["stopped"] is False
    assert not fake.state_file.exists()


def test_wait_times_out_when_never_healthy(fakes):
    fake = fakes()
    assert fake.start(*fake.argv(delay=300)).returncode == 0
    began = time.monotonic()
    proc = fake.wait(timeout=2)
    assert proc.returncode == 1
    assert time.monotonic() - began < 10
    error = json.loads(proc.stdout)["error"]
    assert "did not answer 200" in error
    assert "fake server: loading" in error


def test_stop_kills_the_whole_group_even_if_it_ignores_sigterm(fakes):
    fake = fakes()
    assert fake.start(*fake.argv(ignore_term=True)).returncode == 0
    assert fake.wait().returncode == 0
    pid = json.loads(fake.state_file.read_text())["pid"]
    child = fake.child_pid()
    assert pid_alive(pid) and pid_alive(child)

    result = vllm_server.stop_server(fake.name, fake.run_dir, grace_s=1)
    assert result["stopped"] is True
    assert result["killed"] is True  # the server ignored SIGTERM; the sleep child did not
    assert not pid_alive(pid)
    assert not pid_alive(child)


def test_stop_is_idempotent_and_touches_nothing_else(fakes, tmp_path):
    fake = fakes()
    never = cli("stop", "--name=nothing", f"--run-dir={tmp_path / 'empty'}")
    assert never.returncode == 0
    assert json.loads(never.stdout)["stopped"] is False

    bystander = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        assert fake.start().returncode == 0
        assert fake.wait().returncode == 0
        assert json.loads(fake.stop().stdout)["stopped"] is True
        again = fake.stop()
        assert again.returncode == 0
        assert json.loads(again.stdout)["stopped"] is False
        assert pid_alive(bystander.pid)
    finally:
        bystander.kill()
        bystander.wait()


def test_restart_under_the_same_name_stops_the_old_server(fakes):
    fake = fakes()
    assert fake.start().returncode == 0
    assert fake.wait().returncode == 0
    old = json.loads(fake.state_file.read_text())["pid"]
    again = fake.start()
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["stopped_stale"] is True
    assert not pid_alive(old)
    assert fake.wait().returncode == 0


def test_adopt_keeps_a_live_server_with_the_same_command_and_replaces_any_other(fakes):
    fake = fakes()
    assert fake.start().returncode == 0
    assert fake.wait().returncode == 0
    early = json.loads(fake.state_file.read_text())["pid"]
    adopted = fake.start(*fake.argv(), adopt=True)
    assert adopted.returncode == 0, adopted.stderr
    out = json.loads(adopted.stdout)
    assert out["adopted"] is True and out["started"] is False and out["pid"] == early
    assert pid_alive(early)
    # Another command (here: another delay argument) is not the server asked for.
    other = fake.start(*fake.argv(delay=0.1), adopt=True)
    assert other.returncode == 0, other.stderr
    replaced = json.loads(other.stdout)
    assert replaced["started"] is True and replaced["stopped_stale"] is True
    assert not pid_alive(early)
    assert fake.wait().returncode == 0


def test_adopt_of_a_dead_server_starts_a_new_one(fakes):
    fake = fakes()
    assert fake.start().returncode == 0
    assert fake.wait().returncode == 0
    state = json.loads(fake.state_file.read_text())
    os.kill(state["pid"], signal.SIGKILL)
    assert wait_until(lambda: not pid_alive(state["pid"]), 10)
    again = fake.start(*fake.argv(), adopt=True)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["started"] is True
    assert fake.wait().returncode == 0


def test_the_npu_memory_wait_comes_after_the_stale_server_stopped_and_not_for_an_adopted_one(
    fakes,
):
    """On an NPU host a start waits for the devices' memory: after it stopped a stale server of
    its name (whose memory the wait would otherwise wait for in vain), never for one it adopts
    (which holds the memory the stage needs); memory that stays short fails the start."""
    fake = fakes()
    seen: list[bool] = []

    def wait_after_stale() -> dict:
        seen.append(pid_alive(early))
        return {"free": True, "waited_s": 0.0}

    assert fake.start().returncode == 0
    assert fake.wait().returncode == 0
    early = json.loads(fake.state_file.read_text())["pid"]
    adopted = vllm_server.start_server(
        fake.name, fake.run_dir, fake.log, fake.port, fake.argv(), adopt=True,
        npu_memory_wait=wait_after_stale,
    )  # fmt: skip
    assert adopted["adopted"] is True and seen == []
    started = vllm_server.start_server(
        fake.name, fake.run_dir, fake.log, fake.port, fake.argv(delay=0.1),
        npu_memory_wait=wait_after_stale,
    )  # fmt: skip
    assert started["stopped_stale"] is True and seen == [False]
    assert started["npu_memory"] == {"free": True, "waited_s": 0.0}

    def short() -> dict:
        raise ValueError("device 0: 30000 of 32768 MB used")

    with pytest.raises(vllm_server.ServerError, match="not started: device 0: 30000"):
        vllm_server.start_server(
            "other", fake.run_dir, fake.log, fake.port + 1, fake.argv(), npu_memory_wait=short
        )
    assert not (fake.run_dir / "other.server.json").exists()


def test_start_takes_the_npu_memory_options():
    parser = vllm_server.build_parser()
    args = parser.parse_args(
        ["start", "--name=x", "--run-dir=r", "--log=l", "--port=1", "--npu-memory=0.85",
         "--npu-devices=0,1", "--npu-memory-timeout=30", "--npu-devices=2"]
    )  # fmt: skip
    assert (args.npu_memory, args.npu_devices, args.npu_memory_timeout) == (0.85, {2}, 30.0)


def test_hold_returns_once_the_server_is_gone(fakes):
    fake = fakes()
    assert cli("hold", "--name=none", f"--run-dir={fake.run_dir}").returncode == 0
    assert fake.start().returncode == 0
    assert fake.wait().returncode == 0
    holder = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "specfleet_helpers.host.vllm_server",
            "hold",
            f"--name={fake.name}",
            f"--run-dir={fake.run_dir}",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(HELPERS)},
    )
    time.sleep(1.0)
    assert holder.poll() is None, "hold returned while the server still ran"
    assert fake.stop(grace=5).returncode == 0
    assert holder.wait(timeout=20) == 0
    assert json.loads(holder.stdout.read())["held_s"] >= 1.0


def test_python_api_and_secret_redaction(fakes):
    fake = fakes()
    argv = [*fake.argv(), "--api-key", "s3cret", "--api-key=other"]
    info = vllm_server.start_server(fake.name, fake.run_dir, fake.log, fake.port, argv)
    assert info["started"] is True
    healthy = vllm_server.wait_healthy(fake.name, fake.run_dir, timeout=60)
    assert healthy["healthy"] is True
    recorded = fake.state_file.read_text() + fake.log.read_text()
    assert "s3cret" not in recorded and "other" not in recorded
    assert json.loads(fake.state_file.read_text())["argv"][-3:] == [
        "--api-key",
        "***",
        "--api-key=***",
    ]
    with pytest.raises(vllm_server.PortInUse, match=str(fake.port)):
        vllm_server.start_server("other", fake.run_dir, fake.log, fake.port, fake.argv())
    result = vllm_server.stop_server(fake.name, fake.run_dir)
    assert result["stopped"] is True
    assert not pid_alive(info["pid"])  # reaped by the API although it was our child


def test_bad_input():
    empty = cli("start", "--name=x", "--run-dir=/nonexistent-run", "--log=x", "--port=1")
    assert empty.returncode == 2
    assert "no server command" in empty.stderr
    missing = cli("wait", "--name=x", "--run-dir=/nonexistent-run", "--timeout=1")
    assert missing.returncode == 2
    assert "no server 'x'" in missing.stderr
    help_text = cli("--help")
    assert help_text.returncode == 0
    assert "start" in help_text.stdout and "exit" in help_text.stdout.lower()


def test_start_with_a_missing_executable_is_bad_input(tmp_path):
    proc = cli(
        "start", "--name=x", f"--run-dir={tmp_path}", f"--log={tmp_path / 'x.log'}",
        f"--port={free_port()}", "--", str(tmp_path / "no-such-binary"),
    )  # fmt: skip
    assert proc.returncode == 2
    assert "no-such-binary" in proc.stderr


# ---------------------------------------------------------------- watch (a client of the server)


def watch_cli(fake: Fake, client: subprocess.Popen, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "specfleet_helpers.host.vllm_server", "watch", f"--name={fake.name}",
         f"--run-dir={fake.run_dir}", f"--pid={client.pid}", "--client-grace=2", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(HELPERS)},
    )  # fmt: skip


@pytest.fixture
def clients():
    """Stand-ins for generate-offline-data: children of this test, killed at the end."""
    made: list[subprocess.Popen] = []

    def make(seconds: float = 300) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])
        made.append(proc)
        return proc

    yield make
    for proc in made:
        proc.kill()
        proc.wait()


def test_watch_returns_when_the_client_exits_and_leaves_the_server(fakes, clients):
    fake = fakes()
    assert fake.start().returncode == 0
    assert fake.wait().returncode == 0
    client = clients(1.5)
    began = time.monotonic()
    out, err = watch_cli(fake, client).communicate(timeout=30)
    assert time.monotonic() - began < 10
    result = json.loads(out)
    assert result["client_exited"] is True and result["client_pid"] == client.pid, err
    assert client.wait(timeout=5) == 0  # its own exit status, for the caller to collect
    assert json.loads(fake.stop().stdout)["stopped"] is True  # the server was left running


def test_watch_stops_the_client_and_fails_with_the_log_tail_when_the_server_dies(fakes, clients):
    fake = fakes()
    assert fake.start().returncode == 0
    assert fake.wait().returncode == 0
    client = clients()
    watcher = watch_cli(fake, client, "--tail=5")
    time.sleep(3.0)
    assert watcher.poll() is None and client.poll() is None
    server_pid = json.loads(fake.state_file.read_text())["pid"]
    os.kill(server_pid, 9)
    began = time.monotonic()
    out, err = watcher.communicate(timeout=30)
    noticed = time.monotonic() - began
    assert watcher.returncode == 1, err
    assert noticed < 5, f"watch took {noticed:.1f}s to notice the death"
    assert client.wait(timeout=5) == -15  # SIGTERM: stopped, not left retrying
    assert json.loads(out)["ok"] is False
    assert f"server 'serve' (pid {server_pid}) died while pid {client.pid} used it" in err
    assert f"stopped pid {client.pid}" in err
    assert "--- last " in err and "  | fake server: listening" in err  # the server's log tail
    # the rest of its group (the fake's child) is for stop, as in a stage's EXIT trap
    assert pid_alive(fake.child_pid())
    assert json.loads(fake.stop().stdout)["stopped"] is True
    assert not pid_alive(fake.child_pid())


def test_watch_enforces_its_timeout_and_a_hung_server(fakes, clients):
    fake = fakes()
    assert fake.start().returncode == 0
    assert fake.wait().returncode == 0
    client = clients()
    _out, err = watch_cli(fake, client, "--timeout=1").communicate(timeout=30)
    assert "still used server 'serve' after 1s" in err and f"stopped pid {client.pid}" in err
    assert client.wait(timeout=5) == -15

    hung = fakes("hung")
    assert hung.start(*hung.argv(delay=300)).returncode == 0  # alive, never answers /health
    client = clients()
    with pytest.raises(vllm_server.ServerError, match=r"has not answered .*/health for 1s"):
        vllm_server.watch(
            hung.name, hung.run_dir, client.pid, unhealthy_after_s=1, health_every_s=0.2,
            client_grace_s=2,
        )  # fmt: skip
    assert client.wait(timeout=5) == -15


def test_watch_interrupted_stops_the_client_too(fakes, clients):
    fake = fakes()
    assert fake.start().returncode == 0
    assert fake.wait().returncode == 0
    client = clients()
    watcher = watch_cli(fake, client)
    time.sleep(3.0)  # past its start-up (imports): now it is watching
    assert watcher.poll() is None
    watcher.terminate()  # what the stage supervisor sends the script's process group
    watcher.communicate(timeout=30)
    assert watcher.returncode == 128 + 15
    assert client.wait(timeout=5) == -15


def test_watch_of_a_finished_client_returns_at_once(fakes, clients):
    fake = fakes()
    assert fake.start().returncode == 0
    client = clients(0)
    client.wait()
    result = vllm_server.watch(fake.name, fake.run_dir, client.pid)
    assert result["client_exited"] is True
    missing = cli("watch", "--name=x", "--run-dir=/nonexistent-run", f"--pid={client.pid}")
    assert missing.returncode == 2 and "no server 'x'" in missing.stderr


def test_watch_tail_leaves_out_its_own_health_probes(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(
        "loading\n"
        'INFO:     127.0.0.1:5 - "GET /health HTTP/1.1" 200 OK\n'
        "ERROR engine died\n"
        'INFO:     127.0.0.1:6 - "GET /health HTTP/1.1" 200 OK\n'
    )
    assert vllm_server._tail_without_probes(log, 5) == ["loading", "ERROR engine died"]
    assert vllm_server._tail_without_probes(log, 1) == ["ERROR engine died"]


# ---------------------------------------------------------------- hidden-states argv


def test_aux_layer_ids_validation():
    assert aux_layer_ids([2, 18, 34], 36) == [2, 18, 34, 36]
    assert aux_layer_ids([1, 2, 3], 6) == [1, 2, 3, 6]
    with pytest.raises(ValueError, match=r"duplicate target layer ids: \[2\]"):
        aux_layer_ids([2, 2, 3], 6)
    with pytest.raises(ValueError, match=r"\[6, 9\] are not in \[0, 6\)"):
        aux_layer_ids([1, 6, 9], 6)
    with pytest.raises(ValueError, match=r"\[-1\]"):
        aux_layer_ids([-1], 6)
    with pytest.raises(ValueError, match="no target layer ids"):
        aux_layer_ids([], 6)


def test_hidden_states_argv_cpu_and_npu():
    cpu = hidden_states_server_argv(
        "py", "/m", 8001, "127.0.0.1", [1, 2, 3], 6, "/hs", 256, 0.9, cpu=True,
        extra=["--max-num-seqs", "8"],
    )  # fmt: skip
    assert cpu[:5] == ["py", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"]
    assert "--gpu-memory-utilization" not in cpu
    assert cpu[-2:] == ["--max-num-seqs", "8"]
    spec = json.loads(cpu[cpu.index("--speculative-config") + 1])
    assert spec == {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3, 6]}},
    }
    kv = json.loads(cpu[cpu.index("--kv-transfer-config") + 1])
    assert kv == kv_transfer_config("/hs", cpu=True)
    assert kv["kv_connector"] == "CPUHiddenStatesConnector"
    assert kv["kv_connector_module_path"] == "specfleet_helpers.cpu.hidden_states_connector"
    assert kv["kv_connector_extra_config"] == {"shared_storage_path": "/hs"}
    for flag in ("--enforce-eager", "--no-enable-chunked-prefill"):
        assert flag in cpu
    assert cpu[cpu.index("--api-server-count") + 1] == "1"
    assert cpu[cpu.index("--max-model-len") + 1] == "256"
    assert cpu[cpu.index("--host") + 1] == "127.0.0.1"
    assert cpu[cpu.index("--port") + 1] == "8001"
    assert cpu[cpu.index("--worker-extension-cls") + 1] == (
        "specfleet_helpers.cpu.hidden_states_connector.CPUWorkerExtension"
    )

    npu = hidden_states_server_argv(
        "python3", "/m", 8000, "127.0.0.1", [2, 18, 34], 36, "/hs", 4096, 0.9, cpu=False
    )
    assert npu[:5] == ["python3", "-m", "vllm.entrypoints.cli.main", "serve", "/m"]
    assert npu[npu.index("--gpu-memory-utilization") + 1] == "0.9"
    assert "--worker-extension-cls" not in npu
    kv = json.loads(npu[npu.index("--kv-transfer-config") + 1])
    assert kv == {
        "kv_connector": "ExampleHiddenStatesConnector",
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": "/hs"},
    }
    with pytest.raises(ValueError, match="36"):
        hidden_states_server_argv("p", "/m", 1, "h", [2, 36], 36, "/hs", 1, None, cpu=False)


def test_connector_module_help_works_without_vllm():
    # The controller's Python (this one) has no vllm: --help must not import it.
    proc = subprocess.run(
        [sys.executable, "-m", "specfleet_helpers.cpu.hidden_states_connector", "--path", "/hs"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(HELPERS)},
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == kv_transfer_config("/hs", cpu=True)
    help_text = subprocess.run(
        [sys.executable, "-m", "specfleet_helpers.cpu.hidden_states_connector", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(HELPERS)},
    )
    assert help_text.returncode == 0
    assert "pin_memory" in help_text.stdout


def test_amx_permission_helpers(tmp_path):
    from specfleet_helpers.cpu import hidden_states_connector

    with_amx = tmp_path / "cpuinfo-amx"
    with_amx.write_text("processor\t: 0\nflags\t\t: fpu avx512f amx_bf16 amx_tile amx_int8\n")
    without = tmp_path / "cpuinfo-plain"
    without.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f\n")
    assert hidden_states_connector._cpu_has_amx(str(with_amx)) is True
    assert hidden_states_connector._cpu_has_amx(str(without)) is False
    assert hidden_states_connector._cpu_has_amx(str(tmp_path / "missing")) is False
    # The worker extension needs neither torch nor vLLM; loading it asks for AMX (harmless
    # elsewhere), in a child process so this one is untouched.
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from specfleet_helpers.cpu import hidden_states_connector as m; "
            "cls = m.CPUWorkerExtension; "
            "print(cls.__module__, cls.__qualname__, m.request_amx_permission())",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(HELPERS)},
    )
    assert proc.returncode == 0, proc.stderr
    module, name, granted = proc.stdout.split()
    assert (module, name) == ("specfleet_helpers.cpu.hidden_states_connector", "CPUWorkerExtension")
    assert granted in ("None", "True")  # None: no AMX on this CPU


# ---------------------------------------------------------------- real vLLM CPU (slow)

BUILD_TINY_QWEN3 = r"""
import glob, os, sys
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

out = sys.argv[1]
specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
pattern = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
tok.pre_tokenizer = pre_tokenizers.Sequence([
    pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
])
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(
    vocab_size=1000, min_frequency=2, special_tokens=specials,
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
)
tok.train(sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "*.py")))[:60], trainer)
fast = PreTrainedTokenizerFast(
    tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
    additional_special_tokens=["<|im_start|>", "<|im_end|>"], model_max_length=4096,
)
fast.chat_template = (
    "{%- for m in messages %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] "
    "+ '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
torch.manual_seed(0)
config = Qwen3Config(
    vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=6,
    num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=2048,
    tie_word_embeddings=False, bos_token_id=0, eos_token_id=2, pad_token_id=0,
    dtype="bfloat16",
)
config.architectures = ["Qwen3ForCausalLM"]
Qwen3ForCausalLM(config).to(torch.bfloat16).save_pretrained(out)
fast.save_pretrained(out)
"""


def build_tiny_verifier(python: Path, out: Path) -> None:
    """The shared builder when it exists and works, else the recipe above."""
    env = {**os.environ, "PYTHONPATH": str(HELPERS)}
    if (HELPERS / "specfleet_helpers" / "cpu" / "tiny_models.py").is_file():
        proc = subprocess.run(
            [str(python), "-m", "specfleet_helpers.cpu.tiny_models", "verifier", "--out", str(out)],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        if proc.returncode == 0 and (out / "config.json").is_file():
            return
    script = out.parent / "build_tiny_qwen3.py"
    script.write_text(BUILD_TINY_QWEN3)
    subprocess.run([str(python), str(script), str(out)], check=True, timeout=300, env=env)


def read_safetensors(path: Path) -> tuple[dict, bytes]:
    """Header (name -> dtype, shape, offsets) and data of a safetensors file, stdlib only."""
    raw = path.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + size])
    header.pop("__metadata__", None)
    return header, raw[8 + size :]


def post_json(url: str, body: dict, timeout: float = 120) -> dict:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with opener.open(req, timeout=timeout) as resp:
        return json.loads(resp.read())


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("SPECFLEET_SLOW_TESTS") != "1", reason="set SPECFLEET_SLOW_TESTS=1 (~2 min)"
)
@pytest.mark.skipif(not CPU_VENV_PYTHON.exists(), reason="no CPU-profile venv under .work/local")
def test_real_vllm_cpu_hidden_states_server(tmp_path):
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    model = tmp_path / "tiny-qwen3"
    build_tiny_verifier(CPU_VENV_PYTHON, model)
    timings["build_model_s"] = round(time.monotonic() - t0, 1)
    config = json.loads((model / "config.json").read_text())
    num_layers, hidden = config["num_hidden_layers"], config["hidden_size"]

    hs_dir = tmp_path / "hs"
    port = free_port()
    argv = hidden_states_server_argv(
        str(CPU_VENV_PYTHON), str(model), port, "127.0.0.1", [1, 2, 3], num_layers,
        str(hs_dir), 256, 0.9, cpu=True, extra=["--max-num-seqs", "8"],
    )  # fmt: skip
    run_dir, log = tmp_path / "run", tmp_path / "logs" / "hidden_states.log"
    env = {"PYTHONPATH": str(HELPERS), "VLLM_CPU_KVCACHE_SPACE": "1"}
    vllm_server.start_server("hidden_states", run_dir, log, port, argv, env=env)
    try:
        healthy = vllm_server.wait_healthy("hidden_states", run_dir, timeout=300)
        timings["healthy_s"] = healthy["seconds"]
        record = json.loads((run_dir / "hidden_states.server.json").read_text())
        members = vllm_server.server_members(record)
        assert len(members) >= 2, "expected the API server and its engine core process"

        prompts = [[1, 100 + i, 200 + i, 300 + i, 400, 500, 2][: 4 + i] for i in range(3)]
        t2 = time.monotonic()
        answers = [
            post_json(
                f"http://127.0.0.1:{port}/v1/completions",
                {"model": str(model), "prompt": ids, "max_tokens": 1},
            )
            for ids in prompts
        ]
        timings["requests_s"] = round(time.monotonic() - t2, 2)
        for answer in answers:
            assert answer["choices"][0]["finish_reason"] == "length"
        # The connector names each file after the request id and says where in the answer.
        paths = [(a.get("kv_transfer_params") or {}).get("hidden_states_path") for a in answers]
        assert all(paths), answers

        def written() -> list[Path]:
            return sorted(hs_dir.glob("*.safetensors"))

        assert wait_until(lambda: len(written()) == 3, 30), f"files: {written()}"
        assert sorted(Path(p) for p in paths) == written()
        seen = []
        for path in written():
            lock = Path(f"{path}.lock")
            if lock.exists():  # the writer holds LOCK_EX until the file is complete
                import fcntl

                with lock.open() as fh:
                    fcntl.flock(fh, fcntl.LOCK_SH)
            header, data = read_safetensors(path)
            assert set(header) == {"hidden_states", "token_ids"}
            ids_meta = header["token_ids"]
            assert ids_meta["dtype"] == "I64"
            start, end = ids_meta["data_offsets"]
            token_ids = list(struct.unpack(f"<{(end - start) // 8}q", data[start:end]))
            hs_meta = header["hidden_states"]
            assert hs_meta["shape"] == [len(token_ids), 4, hidden]  # layers 1, 2, 3, last
            assert hs_meta["dtype"] == "BF16"
            seen.append(token_ids)
        assert sorted(seen) == sorted(prompts)
    finally:
        t3 = time.monotonic()
        stopped = vllm_server.stop_server("hidden_states", run_dir)
        timings["stop_s"] = round(time.monotonic() - t3, 1)
    timings["total_s"] = round(time.monotonic() - t0, 1)
    print("timings", json.dumps(timings))
    assert stopped["stopped"] is True
    assert vllm_server.server_members(record) == []
    assert not any(pid_alive(pid) for pid in members)
    assert vllm_server.health_ok("127.0.0.1", port) is False
    assert "pin_memory" not in log.read_text()
