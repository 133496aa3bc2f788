"""Tests for specfleet_helpers.host.stage_run with real detached bash scripts.

Every stage here is a real process group started by the helper; the tests poll it the way
the stage role does and check, with signal 0, that nothing it started is left behind.
Processes that died but were not reaped (zombies) count as gone: their parent may be an
init that does not reap orphans.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procutil import pid_alive, wait_until
from specfleet_helpers.host import host_lock, stage_run

REPO_ROOT = Path(__file__).resolve().parents[2]
HELPERS = REPO_ROOT / "python_helpers"
ISO_UTC = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")


def read_pid(path: Path, timeout: float = 10.0) -> int:
    assert wait_until(lambda: path.is_file() and path.read_text().strip(), timeout), (
        f"{path} was never written"
    )
    return int(path.read_text().strip())


class Stage:
    """One stage name under tmp_path, with its script, log and run dir."""

    def __init__(self, tmp_path: Path, name: str) -> None:
        self.name = name
        self.tmp = tmp_path
        self.run_dir = tmp_path / "run"
        self.log = tmp_path / "logs" / f"{name}.log"
        self.script = tmp_path / f"{name}.sh"

    def write(self, body: str, script: Path | None = None) -> Path:
        path = script or self.script
        path.write_text("set -u\n" + body)
        return path

    def start_cli(self, timeout_s: float = 60, script: Path | None = None, *extra: str) -> dict:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "specfleet_helpers.host.stage_run",
                "start",
                f"--name={self.name}",
                f"--run-dir={self.run_dir}",
                f"--log={self.log}",
                f"--script={script or self.script}",
                f"--timeout={timeout_s}",
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=10,
            env={**os.environ, "PYTHONPATH": str(HELPERS)},
            check=True,
        )
        return json.loads(proc.stdout)

    def status(self, tail: int = 40) -> dict:
        return stage_run.status(self.log, self.run_dir, self.name, tail)

    def wait_finished(self, timeout: float = 20.0) -> dict:
        result: dict = {}

        def finished() -> bool:
            result.update(self.status(tail=3))
            return result["state"] == "finished"

        assert wait_until(finished, timeout), f"stage did not finish: {result}"
        return result


@pytest.fixture
def stages(tmp_path):
    """Stage factory; stops whatever a test left running."""
    made: list[Stage] = []

    def make(name: str) -> Stage:
        stage = Stage(tmp_path, name)
        made.append(stage)
        return stage

    yield make
    for stage in made:
        stage_run.stop(stage.run_dir, stage.name)


def test_exit_code_step_and_tail_of_a_finished_stage(stages):
    stage = stages("build")
    # The sleep keeps the script alive until start() has read its pid.
    stage.write(
        'echo "==> step one"\n'
        "sleep 1\n"
        "echo working\n"
        'echo "==> step two"\n'
        "printf '\\033[32mcoloured\\033[0m\\n'\n"
        "echo line-a\n"
        "echo line-b\n"
        "exit 3\n"
    )
    started = stage_run.start(stage.script, stage.log, stage.run_dir, stage.name, 60)
    assert started["name"] == "build"
    assert started["started"] is True
    assert started["stopped_stale"] is False
    assert isinstance(started["pid"], int)

    result = stage.wait_finished()
    assert result["rc"] == 3
    assert result["timed_out"] is False
    assert result["step"] == "step two"
    assert result["tail"] == ["coloured", "line-a", "line-b"]
    assert ISO_UTC.match(result["started"])
    assert ISO_UTC.match(result["ended"])
    assert result["ended"] >= result["started"]
    assert result["elapsed_s"] >= 0
    assert not pid_alive(started["pid"])
    # The helper's own header lines come first in the log.
    log = stage.log.read_text().splitlines()
    assert log[0].startswith("==> specfleet: stage 'build' started ")
    assert log[1] == f"==> re-run by hand: bash {shlex.quote(str(stage.script))}"
    # The run dir keeps only the status once the stage ended.
    assert not (stage.run_dir / "build.pid").exists()
    assert (stage.run_dir / "build.status.json").is_file()


def test_running_status_shows_step_and_last_line(stages):
    stage = stages("serve")
    stage.write('echo "==> loading model"\necho "weights 10%"\ntouch "$0.ready"\nexec sleep 30\n')
    stage.start_cli()
    ready = Path(f"{stage.script}.ready")
    assert wait_until(ready.exists, 10)
    running = stage.status()
    assert running["state"] == "running"
    assert running["step"] == "loading model"
    assert running["last_line"] == "weights 10%"
    assert running["elapsed_s"] >= 0
    assert stage_run.stop(stage.run_dir, stage.name) == {"name": "serve", "stopped": True}


def test_status_wait_reports_the_end_as_soon_as_it_comes(stages):
    stage = stages("convert")
    stage.write('touch "$0.ready"\nsleep 1\necho done\n')
    stage.start_cli()
    assert wait_until(Path(f"{stage.script}.ready").exists, 10)
    t0 = time.monotonic()
    result = stage_run.status(stage.log, stage.run_dir, stage.name, 5, wait_s=30)
    waited = time.monotonic() - t0
    assert result["state"] == "finished" and result["rc"] == 0
    # Seen within a poll step of the end, not after the whole 30 s.
    assert waited < 5, waited


def test_status_wait_answers_running_once_the_wait_is_over(stages):
    stage = stages("train")
    stage.write('touch "$0.ready"\nexec sleep 30\n')
    stage.start_cli()
    assert wait_until(Path(f"{stage.script}.ready").exists, 10)
    t0 = time.monotonic()
    result = stage_run.status(stage.log, stage.run_dir, stage.name, 5, wait_s=0.6)
    assert result["state"] == "running"
    assert 0.5 <= time.monotonic() - t0 < 5


def test_timeout_stops_the_script_and_its_children(stages):
    stage = stages("slow")
    child_pid_file = stage.tmp / "child.pid"
    stage.write(f'sleep 300 &\necho $! > "{child_pid_file}"\necho "==> waiting"\nwait\n')
    started = stage.start_cli(timeout_s=1)
    child = read_pid(child_pid_file)
    assert pid_alive(child)

    result = stage.wait_finished(timeout=20)
    assert result["rc"] == 124
    assert result["timed_out"] is True
    assert "exceeded its timeout of 1s" in result["step"]
    assert wait_until(lambda: not pid_alive(child), 5), "the script's child survived the timeout"
    assert not pid_alive(started["pid"])


def test_stop_ends_the_whole_process_group(stages):
    stage = stages("train")
    child_pid_file = stage.tmp / "child.pid"
    stage.write(f'sleep 300 &\necho $! > "{child_pid_file}"\necho "==> epoch 1"\nwait\n')
    started = stage.start_cli()
    child = read_pid(child_pid_file)
    assert stage.status()["state"] == "running"

    assert stage_run.stop(stage.run_dir, stage.name) == {"name": "train", "stopped": True}
    assert wait_until(lambda: not pid_alive(child), 5)
    assert wait_until(lambda: not pid_alive(started["pid"]), 5)
    result = stage.wait_finished()
    assert result["rc"] != 0
    assert result["timed_out"] is False
    # Nothing left to stop.
    assert stage_run.stop(stage.run_dir, stage.name) == {"name": "train", "stopped": False}


def test_stop_all_ends_every_stage_of_the_run_dir_at_once(stages):
    """What an interrupted run left: a stage and a server started ahead of the next one."""
    first, second = stages("hidden_states_early"), stages("hidden_states")
    children = []
    for stage in (first, second):
        pid_file = stage.tmp / f"{stage.name}.child"
        stage.write(f'sleep 300 &\necho $! > "{pid_file}"\nwait\n')
        stage.start_cli()
        children.append(read_pid(pid_file))
    assert first.run_dir == second.run_dir
    lock = first.run_dir / "lock.json"
    assert host_lock.acquire(lock, "another-run", {"pid": "1"}, end_abandoned=False)["acquired"]
    # Another run holds the lock: the interrupted run stops nothing of that run's.
    assert stage_run.stop_all(first.run_dir, lock, "this-run") == {"stopped": [], "not_ours": True}
    assert all(pid_alive(pid) for pid in children)
    lock.unlink()
    assert host_lock.acquire(lock, "this-run", {"pid": "2"}, end_abandoned=False)["acquired"]
    done = stage_run.main(
        ["stop-all", f"--run-dir={first.run_dir}", f"--lock={lock}", "--token=this-run"]
    )
    assert done == 0
    assert wait_until(lambda: not any(pid_alive(pid) for pid in children), 5)
    assert first.wait_finished()["rc"] != 0 and second.wait_finished()["rc"] != 0
    assert stage_run.stop_all(first.run_dir) == {"stopped": []}


def test_restart_stops_a_stale_run_of_the_same_stage(stages):
    stage = stages("convert")
    child_pid_file = stage.tmp / "child.pid"
    stage.write(f'sleep 300 &\necho $! > "{child_pid_file}"\necho "==> old run"\nwait\n')
    stale = stage.start_cli()
    stale_child = read_pid(child_pid_file)
    assert pid_alive(stale["pid"])

    done = stage.tmp / "fresh.done"
    fresh_script = stage.write(
        f'echo "==> new run"\ntouch "{done}"\nexit 0\n', script=stage.tmp / "fresh.sh"
    )
    fresh = stage.start_cli(script=fresh_script)
    assert fresh["stopped_stale"] is True
    assert fresh["pid"] != stale["pid"]
    assert wait_until(lambda: not pid_alive(stale["pid"]), 5)
    assert wait_until(lambda: not pid_alive(stale_child), 5)
    assert wait_until(done.exists, 10)
    # The new run starts a fresh log. Its status is not checked here: start() does not wait
    # for the stale run's supervisor, which can still write its end into the new run's files.
    log = stage.log.read_text()
    assert "==> new run" in log
    assert "old run" not in log


def test_status_of_a_never_started_stage_is_lost(tmp_path):
    result = stage_run.status(tmp_path / "logs" / "x.log", tmp_path / "run", "x", 10)
    assert result == {"name": "x", "state": "lost", "rc": None, "step": "", "tail": []}
    assert stage_run.stop(tmp_path / "run", "x") == {"name": "x", "stopped": False}


def test_cli_start_returns_at_once_without_holding_stdout(stages):
    stage = stages("long")
    stage.write('echo "==> sleeping"\nexec sleep 30\n')
    begin = time.monotonic()
    # capture_output: if the detached stage kept the pipe open, this would block for 30 s.
    started = stage.start_cli()
    assert time.monotonic() - begin < 5
    assert started["started"] is True
    assert pid_alive(started["pid"])
    assert stage.status()["state"] == "running"
    assert stage_run.stop(stage.run_dir, stage.name)["stopped"] is True
    assert wait_until(lambda: not pid_alive(started["pid"]), 5)


def test_cli_start_withdraws_the_stamp_before_the_script_runs(stages):
    stage = stages("withdrawn")
    stamp = stage.tmp / "state" / "withdrawn.json"
    stamp.parent.mkdir()
    stamp.write_text('{"stage": "withdrawn"}')
    seen = stage.tmp / "seen"
    stage.write(f"test -e {stamp} && echo present > {seen} || echo absent > {seen}\n")
    stage.start_cli(60, None, f"--withdraw={stamp}", f"--withdraw={stage.tmp / 'never-there.json'}")
    assert stage.wait_finished()["rc"] == 0
    assert not stamp.exists() and seen.read_text().strip() == "absent"


def test_cli_rejects_a_missing_script(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "specfleet_helpers.host.stage_run",
            "start",
            "--name=x",
            f"--run-dir={tmp_path / 'run'}",
            f"--log={tmp_path / 'x.log'}",
            f"--script={tmp_path / 'missing.sh'}",
            "--timeout=5",
        ],
        capture_output=True,
        text=True,
        timeout=10,
        env={**os.environ, "PYTHONPATH": str(HELPERS)},
    )
    assert proc.returncode == 2
    assert "does not exist" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_tail_lines_and_current_step(tmp_path):
    log = tmp_path / "x.log"
    assert stage_run.tail_lines(log, 5) == []
    assert stage_run.current_step(log) == ""
    log.write_text("==> first\n\x1b[1mbold\x1b[0m\n\nprogress 10%\rprogress 50%\n==> second\nend\n")
    assert stage_run.tail_lines(log, 2) == ["==> second", "end"]
    assert stage_run.tail_lines(log, 0) == []
    assert stage_run.tail_lines(log, 100)[:2] == ["==> first", "bold"]
    assert stage_run.current_step(log) == "second"


def server_script(stage: Stage, port: int, then: str) -> None:
    """A stage script that starts a server the way hidden_states.sh and serve.sh do (the
    vllm_server CLI from inside the script), then runs `then`."""
    stage.write(
        f"export PYTHONPATH={shlex.quote(str(HELPERS))}\n"
        f"{shlex.quote(sys.executable)} -m specfleet_helpers.host.vllm_server start --name srv"
        f" --run-dir {shlex.quote(str(stage.run_dir))}"
        f" --log {shlex.quote(str(stage.tmp / 'srv.log'))} --port {port} -- sleep 300\n"
        'echo "==> server up"\n' + then
    )


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_pid(stage: Stage) -> int:
    record = stage.run_dir / "srv.server.json"
    assert wait_until(record.is_file, 20), stage.log.read_text()
    return json.loads(record.read_text())["pid"]


@pytest.mark.parametrize("ending", ["fails", "stop", "timeout"])
def test_the_end_of_a_stage_ends_the_server_it_started(stages, ending: str):
    """One owner per process: the server a stage script started lives in the stage's process
    group, so however the stage ends (the script fails without stopping it, stage_run stop,
    the timeout) its server ends with it and its record is forgotten; no trap needed."""
    stage = stages("hidden_states")
    server_script(stage, free_port(), "exit 7\n" if ending == "fails" else "sleep 300\n")
    started = stage_run.start(
        stage.script, stage.log, stage.run_dir, stage.name, 3 if ending == "timeout" else 60
    )
    server = server_pid(stage)
    if ending == "stop":
        assert stage_run.stop(stage.run_dir, stage.name)["stopped"] is True
    result = stage.wait_finished(timeout=30)
    assert result["rc"] == {"fails": 7, "timeout": 124}.get(ending, result["rc"]) != 0
    # The stage is reported finished only once its server is gone (its port is free then).
    assert not pid_alive(server)
    assert not (stage.run_dir / "srv.server.json").exists()
    assert not pid_alive(started["pid"])


def test_a_stage_that_ends_between_the_two_reads_of_a_poll_is_finished_not_lost(
    stages, monkeypatch
):
    """The supervisor writes NAME.status.json, then removes NAME.pid. A poll that read the
    status (absent) just before and the pid record (gone) just after must not call the stage
    lost: seen under load, it failed a serve stage that had ended with rc 0."""
    stage = stages("serve")
    stage.write("exit 0\n")
    stage_run.start(stage.script, stage.log, stage.run_dir, stage.name, 60)
    stage.wait_finished()
    real = stage_run.read_json
    reads: list[str] = []

    def racing(path: Path):
        reads.append(path.name)
        # The first status read happens just before the supervisor wrote it.
        return None if reads.count("serve.status.json") == 1 else real(path)

    monkeypatch.setattr(stage_run, "read_json", racing)
    result = stage_run.status(stage.log, stage.run_dir, stage.name, 5)
    assert result["state"] == "finished" and result["rc"] == 0, result


@pytest.mark.parametrize("ending", ["stops it", "fails"])
def test_a_server_started_ahead_of_its_stage_is_taken_over_and_ends_with_it(stages, ending: str):
    """hidden_states' early start: a job of its own starts the server and holds it; the stage
    adopts it (same command), and its stop, or its EXIT trap when it fails, ends both the
    server and the job that held it."""
    port = free_port()
    server = (
        f"{shlex.quote(sys.executable)} -m specfleet_helpers.host.vllm_server start --name srv"
        f" --run-dir {{run}} --log {{run}}/srv.log --port {port} {{adopt}} -- sleep 300"
    )
    helper = f"{shlex.quote(sys.executable)} -m specfleet_helpers.host.vllm_server"
    early, stage = stages("hidden_states_early"), stages("hidden_states")
    run = shlex.quote(str(stage.run_dir))
    env = f"export PYTHONPATH={shlex.quote(str(HELPERS))}\n"
    early.write(
        env + server.format(run=run, adopt="") + "\necho '==> held'\n"
        f"{helper} hold --name srv --run-dir {run}\n"
    )
    stage_run.start(early.script, early.log, early.run_dir, early.name, 60)
    held = server_pid(early)
    assert wait_until(lambda: "==> held" in early.log.read_text(), 20), early.log.read_text()
    stage.write(
        env
        + f"trap '{helper} stop --name srv --run-dir {run} >/dev/null' EXIT\n"
        + server.format(run=run, adopt="--adopt")
        + f" > {run}/adopted.json\n"
        + (f"{helper} stop --name srv --run-dir {run}\n" if ending == "stops it" else "exit 3\n")
    )
    stage_run.start(stage.script, stage.log, stage.run_dir, stage.name, 60)
    result = stage.wait_finished(timeout=30)
    assert result["rc"] == (0 if ending == "stops it" else 3), stage.log.read_text()
    adopted = json.loads((stage.run_dir / "adopted.json").read_text())
    assert adopted["adopted"] is True and adopted["pid"] == held
    assert not pid_alive(held)
    job = early.wait_finished(timeout=30)
    assert job["rc"] == 0, early.log.read_text()
    assert not (stage.run_dir / "srv.server.json").exists()


# ----------------------------------------------------------------------------- ranks in sessions

# A stand-in for torchrun as it treats its ranks (torch.distributed.elastic): each rank is
# started with start_new_session=True, so it is not in the stage's process group; on SIGTERM it
# sends its ranks SIGTERM, waits for them, kills what is left after 30 s, and exits. A rank
# saves for SAVE_S seconds when asked to stop (speculators' graceful-shutdown checkpoint), or
# ignores SIGTERM with "ignore". Each rank writes its pid, then "saved" when its save ends.
FAKE_TORCHRUN = r"""
import os, signal, subprocess, sys, time
out, ranks, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
RANK = '''
import os, signal, sys, time
out, rank, mode = sys.argv[1], sys.argv[2], sys.argv[3]
def save(*_):
    time.sleep(float(os.environ.get("SAVE_S", "1")))
    open(f"{out}/rank{rank}.saved", "w").close()
    sys.exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN if mode == "ignore" else save)
open(f"{out}/rank{rank}.pid", "w").write(str(os.getpid()))
while True:
    time.sleep(0.1)
'''
children = [
    subprocess.Popen([sys.executable, "-c", RANK, out, str(r), mode], start_new_session=True)
    for r in range(ranks)
]
def shutdown(*_):
    for child in children:
        child.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(c.poll() is None for c in children):
        time.sleep(0.1)
    for child in children:
        if child.poll() is None:
            child.kill()
    sys.exit(143)
signal.signal(signal.SIGTERM, shutdown)
open(f"{out}/torchrun.pid", "w").write(str(os.getpid()))
for child in children:
    child.wait()
"""


def start_ranks(stage: Stage, ranks: int = 2, mode: str = "save", **start: object) -> list[int]:
    """A stage running the fake torchrun; returns the ranks' pids once they all run."""
    (stage.tmp / "torchrun.py").write_text(FAKE_TORCHRUN)
    stage.write(
        f'echo "==> torchrun --nproc_per_node={ranks}"\n'
        f'"{sys.executable}" "{stage.tmp / "torchrun.py"}" "{stage.tmp}" {ranks} {mode}\n'
    )
    stage_run.start(stage.script, stage.log, stage.run_dir, stage.name, **start)
    return [read_pid(stage.tmp / f"rank{r}.pid") for r in range(ranks)]


def test_stop_lets_torchrun_end_its_ranks_and_their_save_complete(stages):
    stage = stages("train")
    ranks = start_ranks(stage, timeout_s=60, stop_grace_s=20)
    # The ranks are outside the stage's process group: ending the group alone would miss them.
    record = json.loads((stage.run_dir / "train.pid").read_text())
    assert all(os.getpgid(pid) == pid != record["pgid"] for pid in ranks)
    assert record["stop_grace_s"] == 20 and record["marker"].startswith("train:")

    assert stage_run.stop(stage.run_dir, stage.name) == {"name": "train", "stopped": True}
    # stop returns once the supervisor recorded the end: torchrun's shutdown ran, every rank
    # saved (torchrun asked each once), nothing of the stage is left.
    assert not any(pid_alive(pid) for pid in ranks)
    assert sorted(p.name for p in stage.tmp.glob("rank*.saved")) == ["rank0.saved", "rank1.saved"]
    result = stage.status()
    assert result["state"] == "finished" and result["rc"] != 0


def test_a_timeout_ends_ranks_that_ignore_sigterm_after_the_stop_grace(stages):
    stage = stages("train")
    ranks = start_ranks(stage, mode="ignore", timeout_s=2, stop_grace_s=3)
    t0 = time.monotonic()
    result = stage.wait_finished(timeout=30)
    took = time.monotonic() - t0
    assert result["rc"] == 124 and result["timed_out"] is True
    # Killed with their sessions once the grace ran out, before the stage was reported over
    # (torchrun itself would have waited 30 s for them).
    assert not any(pid_alive(pid) for pid in ranks)
    assert took < 2 + 3 + 10, took
    assert not list(stage.tmp.glob("rank*.saved"))


def test_ranks_whose_torchrun_was_killed_are_asked_to_save_then_ended(stages):
    """SIGKILL of the run (the playbook, the supervisor, torchrun) leaves the ranks orphaned;
    the next run ends the stage from its record, as a lock takeover does (procs.end_stage)."""
    stage = stages("train")
    ranks = start_ranks(stage, timeout_s=60, stop_grace_s=20)
    record = json.loads((stage.run_dir / "train.pid").read_text())
    torchrun = read_pid(stage.tmp / "torchrun.pid")
    os.kill(record["supervisor"], signal.SIGKILL)
    os.kill(torchrun, signal.SIGKILL)
    assert wait_until(lambda: not pid_alive(torchrun), 5)
    assert all(pid_alive(pid) for pid in ranks), "the ranks live on without their torchrun"

    from specfleet_helpers.host import procs

    assert procs.end_stage(record) is True
    assert not any(pid_alive(pid) for pid in ranks)
    assert sorted(p.name for p in stage.tmp.glob("rank*.saved")) == ["rank0.saved", "rank1.saved"]


def test_a_service_the_stage_deploys_is_not_the_stages(stages, tmp_path):
    """The mark is inherited, so whatever must outlive its stage (the serve stage's service)
    is started without it (service._child_env), and the stage's end leaves it running."""
    from specfleet_helpers.host import procs

    stage = stages("serve")
    survivor = tmp_path / "survivor.pid"
    marked_env = tmp_path / "marked.env"
    code = (
        "import os, subprocess, sys; from specfleet_helpers.host import service; "
        "p = subprocess.Popen(['sleep', '300'], env=service._child_env(), start_new_session=True); "
        f"open({str(survivor)!r}, 'w').write(str(p.pid)); "
        f"open({str(marked_env)!r}, 'w').write(os.environ.get({procs.STAGE_ENV!r}, ''))"
    )
    stage.write(f'PYTHONPATH={HELPERS} "{sys.executable}" -c "{code}"\n')
    stage_run.start(stage.script, stage.log, stage.run_dir, stage.name, 60)
    assert stage.wait_finished()["rc"] == 0
    pid = read_pid(survivor)
    try:
        assert marked_env.read_text().startswith("serve:")  # the script itself was marked
        assert pid_alive(pid)
        assert procs.STAGE_ENV.encode() not in Path(f"/proc/{pid}/environ").read_bytes()
    finally:
        os.kill(pid, signal.SIGKILL)
