"""Tests for specfleet_helpers.host.host_lock with real files and real processes.

The command line runs the way Ansible runs it (``python -m specfleet_helpers.host.host_lock``),
under a directory whose name has spaces; the race test starts several processes at the
same instant against one lock file.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from specfleet_helpers.host import host_lock

REPO_ROOT = Path(__file__).resolve().parents[2]
HELPERS = REPO_ROOT / "python_helpers"
ISO_UTC = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")
OWNER = {"controller": "ctl1", "pid": 1234, "user": "root", "playbook": "site.yml"}


def cli(*args: object, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "specfleet_helpers.host.host_lock", *(str(a) for a in args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(HELPERS)},
    )


def output(proc: subprocess.CompletedProcess) -> dict:
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, f"expected one JSON line, got {proc.stdout!r} (stderr {proc.stderr!r})"
    return json.loads(lines[0])


def acquire_cli(lock: Path, token: str, *extra: object, owner: dict | None = None):
    return cli(
        "acquire", "--lock", lock, "--token", token, "--owner", json.dumps(owner or OWNER), *extra
    )


def on_disk(lock: Path) -> dict:
    return json.loads(lock.read_text())


def age_heartbeat(lock: Path, seconds: float) -> None:
    """Make the lock's heartbeat `seconds` old, as if its run stopped refreshing it."""
    data = on_disk(lock)
    data["heartbeat_epoch"] -= seconds
    lock.write_text(json.dumps(data))


@pytest.fixture
def lock(tmp_path: Path) -> Path:
    run_dir = tmp_path / "specfleet root" / "run dir"
    run_dir.mkdir(parents=True)
    return run_dir / "lock.json"


def test_create_refresh_release(lock: Path):
    before = time.time()
    first = acquire_cli(lock, "run-a")
    assert first.returncode == 0, first.stderr
    assert output(first) == {"acquired": True, "changed": True, "broke": None}
    data = on_disk(lock)
    assert data["token"] == "run-a"
    assert data["owner"] == OWNER
    assert ISO_UTC.match(data["acquired"]) and ISO_UTC.match(data["heartbeat"])
    assert before <= data["heartbeat_epoch"] <= time.time()
    assert not list(lock.parent.glob("*.tmp")), "temporary files are cleaned up"

    time.sleep(0.05)
    again = acquire_cli(lock, "run-a", owner={"controller": "other"})
    assert again.returncode == 0, again.stderr
    assert output(again) == {"acquired": True, "changed": False, "broke": None}
    refreshed = on_disk(lock)
    assert refreshed["heartbeat_epoch"] > data["heartbeat_epoch"]
    assert refreshed["acquired"] == data["acquired"]
    assert refreshed["owner"] == OWNER, "the run's owner record is kept"

    read = cli("read", "--lock", lock)
    assert read.returncode == 0
    assert output(read) == refreshed

    released = cli("release", "--lock", lock, "--token", "run-a")
    assert released.returncode == 0, released.stderr
    assert output(released) == {"released": True, "stopped": []}
    assert not lock.exists()

    again = cli("release", "--lock", lock, "--token", "run-a")
    assert again.returncode == 0
    assert output(again) == {"released": False, "holder": None}
    assert output(cli("read", "--lock", lock)) == {}


def test_second_token_is_refused_naming_the_holder(lock: Path):
    assert acquire_cli(lock, "run-a").returncode == 0
    held = on_disk(lock)

    refused = acquire_cli(lock, "run-b", owner={"controller": "ctl2", "pid": 99})
    assert refused.returncode == 4
    result = output(refused)
    assert result["acquired"] is False
    assert result["holder"]["token"] == "run-a"
    assert result["holder"]["owner"] == OWNER
    assert 0 <= result["holder"]["heartbeat_age_s"] < 30
    assert on_disk(lock) == held, "a refused acquire leaves the lock alone"

    message = refused.stderr.strip()
    assert len(message.splitlines()) == 1
    assert (
        f"host lock {lock} is held by run run-a (owner: controller ctl1, pid 1234, user root,"
        f" playbook site.yml, started {held['acquired']}), last heartbeat " in message
    )
    assert re.search(r"last heartbeat \d+ s ago\. ", message)
    assert "raise specfleet_lock_wait_s" in message
    assert message.endswith(f"if that run is dead, remove {lock}.")


def test_waiter_gets_the_lock_once_the_holder_releases_it(lock: Path):
    assert host_lock.acquire(lock, "run-a", OWNER)["acquired"]
    started = time.monotonic()
    waiter = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "specfleet_helpers.host.host_lock",
            "acquire",
            "--lock",
            str(lock),
            "--token",
            "run-b",
            "--owner",
            json.dumps({"controller": "ctl2"}),
            "--wait-s",
            "20",
            "--poll-s",
            "0.1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(HELPERS)},
    )
    releaser = threading.Timer(1.0, host_lock.release, args=(lock, "run-a"))
    releaser.start()
    try:
        time.sleep(0.7)
        assert waiter.poll() is None, "the waiter must still be waiting while run-a holds it"
        stdout, stderr = waiter.communicate(timeout=30)
    finally:
        releaser.join()
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()
    elapsed = time.monotonic() - started
    assert waiter.returncode == 0, stderr
    assert stdout.count("\n") == 1, "nothing is printed while waiting"
    assert json.loads(stdout) == {"acquired": True, "changed": True, "broke": None}
    assert 1.0 <= elapsed < 15, elapsed
    assert on_disk(lock)["token"] == "run-b"


def test_wait_runs_out(lock: Path):
    assert host_lock.acquire(lock, "run-a", OWNER)["acquired"]
    started = time.monotonic()
    refused = acquire_cli(lock, "run-b", "--wait-s", "1.2", "--poll-s", "0.2")
    elapsed = time.monotonic() - started
    assert refused.returncode == 4
    assert output(refused)["holder"]["token"] == "run-a"
    assert elapsed >= 1.2
    assert on_disk(lock)["token"] == "run-a"


def test_stale_heartbeat_is_taken_over(lock: Path):
    assert acquire_cli(lock, "run-a").returncode == 0
    age_heartbeat(lock, 1234)
    stale = on_disk(lock)

    # Not yet stale by a longer limit.
    assert acquire_cli(lock, "run-b", "--stale-after-s", "2000").returncode == 4

    took = acquire_cli(lock, "run-b", "--stale-after-s", "900", owner={"controller": "ctl2"})
    assert took.returncode == 0, took.stderr
    result = output(took)
    assert result["acquired"] is True and result["changed"] is True
    broke = result["broke"]
    assert broke["token"] == "run-a"
    assert broke["owner"] == OWNER
    assert broke["heartbeat"] == stale["heartbeat"]
    assert re.fullmatch(r"heartbeat 123[45] s old", broke["why"]), broke["why"]
    data = on_disk(lock)
    assert data["token"] == "run-b" and data["owner"] == {"controller": "ctl2"}
    assert time.time() - data["heartbeat_epoch"] < 30


def test_break_token_takes_over_only_that_run(lock: Path):
    assert acquire_cli(lock, "run-a").returncode == 0

    wrong = acquire_cli(lock, "run-b", "--break-token", "run-x")
    assert wrong.returncode == 4, "a break token of another run breaks nothing"
    assert on_disk(lock)["token"] == "run-a"

    took = acquire_cli(lock, "run-b", "--break-token", "run-a")
    assert took.returncode == 0, took.stderr
    broke = output(took)["broke"]
    assert broke["token"] == "run-a" and broke["owner"] == OWNER
    assert broke["why"] == "owner process gone"
    assert on_disk(lock)["token"] == "run-b"


@pytest.mark.parametrize(
    "content",
    [
        "",
        '{"token": "run-a", "owner": {"contr',
        "[]",
        '{"owner": {}, "heartbeat_epoch": 1}',
        '{"token": "run-a", "heartbeat_epoch": "yesterday"}',
    ],
    ids=["empty", "cut-off", "not-an-object", "no-token", "no-heartbeat"],
)
def test_unreadable_lock_is_taken_over(lock: Path, content: str):
    lock.write_text(content)
    took = acquire_cli(lock, "run-b")
    assert took.returncode == 0, took.stderr
    assert output(took)["broke"] == {
        "token": None,
        "owner": None,
        "heartbeat": None,
        "why": "unreadable lock file",
        "stopped": [],
    }
    assert on_disk(lock)["token"] == "run-b"
    assert output(cli("read", "--lock", lock))["token"] == "run-b"


def test_read_of_unreadable_lock_is_empty(lock: Path):
    lock.write_text("{not json")
    read = cli("read", "--lock", lock)
    assert read.returncode == 0
    assert output(read) == {}


def test_release_never_removes_another_runs_lock(lock: Path):
    assert acquire_cli(lock, "run-a").returncode == 0
    held = lock.read_bytes()
    released = cli("release", "--lock", lock, "--token", "run-b")
    assert released.returncode == 0, released.stderr
    result = output(released)
    assert result["released"] is False
    assert result["holder"]["token"] == "run-a"
    assert lock.read_bytes() == held


def test_heartbeat_refreshes_our_lock(lock: Path):
    assert acquire_cli(lock, "run-a").returncode == 0
    before = on_disk(lock)
    time.sleep(0.05)
    beat = cli("heartbeat", "--lock", lock, "--token", "run-a")
    assert beat.returncode == 0, beat.stderr
    assert output(beat) == {"held": True}
    after = on_disk(lock)
    assert after["heartbeat_epoch"] > before["heartbeat_epoch"]
    assert {k: v for k, v in after.items() if not k.startswith("heartbeat")} == {
        k: v for k, v in before.items() if not k.startswith("heartbeat")
    }
    assert host_lock.heartbeat(lock, "run-a") == {"held": True}


def test_heartbeat_on_a_lost_lock_exits_4_and_changes_nothing(lock: Path):
    assert acquire_cli(lock, "run-a").returncode == 0
    assert acquire_cli(lock, "run-b", "--break-token", "run-a").returncode == 0
    taken = lock.read_bytes()
    mtime = lock.stat().st_mtime_ns

    lost = cli("heartbeat", "--lock", lock, "--token", "run-a")
    assert lost.returncode == 4
    result = output(lost)
    assert result["held"] is False
    assert result["holder"]["token"] == "run-b"
    assert lost.stderr.startswith(
        f"host_lock: lock lost: host lock {lock} is now held by run run-b (owner: "
    )
    assert lock.read_bytes() == taken and lock.stat().st_mtime_ns == mtime

    lock.unlink()
    gone = cli("heartbeat", "--lock", lock, "--token", "run-b")
    assert gone.returncode == 4
    assert output(gone)["held"] is False and output(gone)["holder"] is None
    assert "lock lost" in gone.stderr and "no longer exists" in gone.stderr
    assert not lock.exists(), "a heartbeat never recreates a lost lock"


def test_heartbeat_of_a_foreign_or_absent_lock_only_reads(tmp_path: Path):
    """Cheap enough for every stage poll: no guard file, no write, when the lock is not ours."""
    lock = tmp_path / "lock.json"
    assert host_lock.heartbeat(lock, "run-a")["held"] is False
    lock.write_text(json.dumps({"token": "run-b", "heartbeat_epoch": time.time()}))
    assert host_lock.heartbeat(lock, "run-a")["held"] is False
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lock.json"]


def test_missing_directory_fails_clearly(tmp_path: Path):
    lock = tmp_path / "no such root" / "run" / "lock.json"
    failed = acquire_cli(lock, "run-a")
    assert failed.returncode == 1
    assert output(failed) == {
        "acquired": False,
        "changed": False,
        "error": f"cannot take host lock {lock}: its directory {lock.parent} does not exist",
    }
    assert failed.stderr.strip() == f"host_lock: {output(failed)['error']}"
    assert not lock.parent.exists(), "the directory is not created"


def test_bad_owner_is_a_usage_error(lock: Path):
    for owner in ("not json", "[1, 2]"):
        bad = cli("acquire", "--lock", lock, "--token", "run-a", "--owner", owner)
        assert bad.returncode == 2
        assert "--owner" in bad.stderr
    assert not lock.exists()


@pytest.mark.parametrize("command", [[], ["acquire"], ["heartbeat"], ["release"], ["read"]])
def test_help(command: list[str]):
    shown = cli(*command, "--help")
    assert shown.returncode == 0
    assert shown.stdout.startswith("usage: python -m specfleet_helpers.host.host_lock")


def _contend(lock: str, token: str, go, results) -> None:
    go.wait()
    results.put((token, host_lock.acquire(lock, token, {"contender": token})))


@pytest.mark.parametrize("contenders", [2, 4])
@pytest.mark.parametrize("found", ["absent", "stale"])
def test_concurrent_acquirers_exactly_one_wins(tmp_path: Path, contenders: int, found: str):
    """Whether they create the lock or take over a stale one, exactly one contender wins."""
    ctx = multiprocessing.get_context("fork")
    for round_no in range(10):
        run_dir = tmp_path / f"round {round_no}"
        run_dir.mkdir()
        lock = run_dir / "lock.json"
        if found == "stale":
            assert host_lock.acquire(lock, "run-dead", OWNER)["acquired"]
            age_heartbeat(lock, 3600)
        go = ctx.Event()
        results = ctx.Queue()
        procs = [
            ctx.Process(target=_contend, args=(str(lock), f"run-{i}", go, results))
            for i in range(contenders)
        ]
        for proc in procs:
            proc.start()
        time.sleep(0.2)  # every contender is waiting on the event
        go.set()
        outcomes = dict(results.get(timeout=30) for _ in procs)
        for proc in procs:
            proc.join(timeout=30)
            assert proc.exitcode == 0
        winners = [token for token, result in outcomes.items() if result["acquired"]]
        assert len(winners) == 1, outcomes
        assert on_disk(lock)["token"] == winners[0]
        for token, result in outcomes.items():
            if token != winners[0]:
                assert result["holder"]["token"] == winners[0]


def test_concurrent_cli_acquirers_exactly_one_wins(lock: Path):
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "specfleet_helpers.host.host_lock",
                "acquire",
                "--lock",
                str(lock),
                "--token",
                token,
                "--owner",
                "{}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(HELPERS)},
        )
        for token in ("run-a", "run-b", "run-c")
    ]
    codes = []
    for proc in procs:
        proc.communicate(timeout=30)
        codes.append(proc.returncode)
    assert sorted(codes) == [0, 4, 4]
    winner = ("run-a", "run-b", "run-c")[codes.index(0)]
    assert on_disk(lock)["token"] == winner


def test_taking_over_stops_what_the_abandoned_run_left_running(lock: Path):
    """A dead run's detached stage and the server it started hold ports and memory the new run
    needs: the run that takes the lock over stops them, through the stage's recorded process
    group only (the server lives in it), and forgets the server's record."""
    import socket

    from procutil import pid_alive, wait_until
    from specfleet_helpers.host import stage_run

    run_dir = lock.parent
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    script = run_dir / "slow.sh"
    # The way the hidden_states and serve scripts start their server: from inside the stage.
    script.write_text(
        f"export PYTHONPATH={shlex.quote(str(HELPERS))}\n"
        f"{shlex.quote(sys.executable)} -m specfleet_helpers.host.vllm_server start --name fake"
        f" --run-dir {shlex.quote(str(run_dir))} --log {shlex.quote(str(run_dir / 'fake.log'))}"
        f" --port {port} -- sleep 300\n"
        "echo '==> working'\nsleep 300\n"
    )
    stage = stage_run.start(script, run_dir / "slow.log", run_dir, "slow", 600)
    record = run_dir / "fake.server.json"
    assert wait_until(record.is_file, 20), (run_dir / "slow.log").read_text()
    server = json.loads(record.read_text())
    assert server["pgid"] == stage["pid"]  # the server is the stage's: in its process group
    bystander = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        assert acquire_cli(lock, "run-a").returncode == 0
        kept = acquire_cli(lock, "run-b", "--break-token", "run-a", "--keep-abandoned")
        assert output(kept)["broke"]["stopped"] == []
        assert pid_alive(stage["pid"]) and pid_alive(server["pid"])

        took = acquire_cli(lock, "run-c", "--break-token", "run-b")
        assert took.returncode == 0, took.stderr
        broke = output(took)["broke"]
        assert broke["stopped"] == ["stage slow", "server fake"]
        assert broke["why"] == (
            "owner process gone; stopped what it left running: stage slow, server fake"
        )
        assert wait_until(lambda: not pid_alive(stage["pid"]), 10)
        assert not pid_alive(server["pid"])
        assert not record.exists()
        assert pid_alive(bystander.pid)
        # Nothing left to stop: a later takeover only takes the lock.
        again = acquire_cli(lock, "run-d", "--break-token", "run-c")
        assert output(again)["broke"]["stopped"] == []
    finally:
        stage_run.stop(run_dir, "slow")
        bystander.kill()
        bystander.wait()


def test_release_ends_what_the_run_still_has_running(lock: Path):
    """A job started ahead of its stage (the hidden-states server, started early) whose stage
    never came, because an earlier one failed, ends with the run: releasing the lock stops it.
    Another run's release (wrong token) stops nothing."""
    from procutil import pid_alive, wait_until
    from specfleet_helpers.host import stage_run

    run_dir = lock.parent
    script = run_dir / "early.sh"
    script.write_text("echo '==> holding'\nsleep 300\n")
    job = stage_run.start(script, run_dir / "early.log", run_dir, "early", 600)
    try:
        assert acquire_cli(lock, "run-a").returncode == 0
        other = cli("release", "--lock", lock, "--token", "run-b")
        assert output(other)["released"] is False
        assert pid_alive(job["pid"])
        released = cli("release", "--lock", lock, "--token", "run-a")
        assert released.returncode == 0, released.stderr
        assert output(released) == {"released": True, "stopped": ["stage early"]}
        assert wait_until(lambda: not pid_alive(job["pid"]), 10)
        assert not lock.exists()
    finally:
        stage_run.stop(run_dir, "early")
