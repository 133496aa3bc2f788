"""Reliability and security of real runs: site.yml against this machine (CPU profile, every
stage for real) with damaged artifacts, busy ports, a full disk, two runs at once and an
API key.

All cases that need a finished pipeline share ONE work root (module scope), primed once by
a complete run; every test leaves it complete for the next one. It reuses the CPU venv that
`make run` built (.work/local/venv, through specfleet_venv) and runs the servers on ports
18200 (serve) and 18201 (hidden states), so a `make run` root on 8000/8001 is not disturbed.

  1. a damaged artifact on the finished root, then one site.yml run: exactly the damaged
     stage and the stages it feeds run again, every other stamp stays byte-identical, the
     run is green.
     a. a hidden-states file cut to half       -> hidden_states, train, serve
     b. the trained draft's weights deleted     -> train, serve
     c. a value of the converted config changed -> convert (nothing consumes it by default)
  2. a foreign process (python -m http.server) holds the serve port, then the hidden-states
     port (fresh root): the run fails in the preflight naming the port, the holder's pid and
     command and the variable to change; the holder still runs and answers; no stage was
     started, nothing installed; once the port is free the preflight passes.
  3. more disk required than is free, on a fresh root: the preflight fails naming the
     variable before anything is installed or downloaded (no venv, no models).
  4. two runs against one host: B fails at once naming A's run (controller, pid, play) and
     the lock file, and starts no stage, while A's stage (hidden_states, forced) runs on
     undisturbed and A ends green; with specfleet_lock_wait_s B waits for A, then succeeds.
     Quick forms on a fresh root: a lock held by a live process of this controller stops a
     run at once (the helpers in use are not replaced), or makes it wait until released; a
     lock whose owner process is dead is taken over, and the run says so.
  5. serve_api_key: the key is in no ansible output, no file under the work root (scripts,
     logs, stamps, results) and no report; the work root has no group/world-writable file
     and its scripts are 0750 or stricter.
  6. with the key, the serve stage itself proves a request without it is refused (HTTP 401;
     api_key_enforced in the serve stamp), and the server bound 127.0.0.1.

In CI (`make test`): the cases on a fresh root (2, 3 and the quick forms of 4), a few
minutes. Marked slow, for `make test-reliability`: every case that needs the finished
pipeline (1, 4 with two real runs, 5, 6); they need the CPU venv (.work/local/venv, built
by `make run`). Measured on 2 cores shared with other runs: 42 min, 17 of them for the
first, complete pipeline (~5 min when the cores are idle). Explicitly:
    SPECFLEET_SLOW_TESTS=1 .venv/bin/python -m pytest -q -s tests/integration/test_failures.py
SPECFLEET_FAILURES_DIR=<dir> keeps the work root there across sessions (faster reruns).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import pytest
from siteruns import Run, playbook_env, port_free, wait_for

pytestmark = [pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]
SITE = REPO / "site.yml"
INVENTORY = REPO / "inventory" / "local.yml"
ANSIBLE_PLAYBOOK = REPO / ".venv" / "bin" / "ansible-playbook"
CPU_VENV = REPO / ".work" / "local" / "venv"
SERVE_PORT = 18200
HIDDEN_STATES_PORT = 18201
DATA_PORT = 18202
# Stages that leave a stamp with a run id (npu_env records the host in npu_env.json).
STAGES = (
    "speculators_install",
    "models",
    "convert",
    "data",
    "hidden_states",
    "train",
    "serve",
)
REDONE_BY_DAMAGE = "artifacts no longer valid"
# A whole pipeline takes ~4-5 min here; this only stops a hung run.
RUN_TIMEOUT_S = 2400
# A run that only checks (everything up to date, or a failing preflight) starts in seconds;
# other tests and molecule may share the 2 cores.
QUICK_RUN_S = 240
# For runs that only have to show the lock or a port at work on a root whose artifacts the
# previous run's suite checked: the testinfra suite costs ~1-2 min per run here.
NO_ARTIFACT_SUITE = {"validate_artifact_tests": False}
# Wall time of every run of this module, printed at the end (pytest -s).
TIMINGS: list[tuple[str, float, str]] = []


# ----------------------------------------------------------------------------- helpers


def http_ok(port: int) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://127.0.0.1:{port}/", timeout=5) as resp:
            return resp.status == 200
    except OSError:
        return False


# The console's list of every task's wall time after the recap (SPECFLEET_TASK_TIMINGS, set by
# siteruns.playbook_env): "   12.34s  session : Take the host lock".
TASK_TIME = re.compile(r"^ +(?P<seconds>\d+\.\d+)s  (?P<name>.+)$", re.M)


def task_durations(stdout: str) -> list[tuple[str, float]]:
    """(task name, seconds) of every task the console timed."""
    _, _, timings = stdout.rpartition("SLOWEST TASKS")
    return [(m.group("name"), float(m.group("seconds"))) for m in TASK_TIME.finditer(timings)]


LOCK_TASKS = ("Start this run's session on the host (helpers, lock, earlier runs' stamps)",)


def lock_wait_s(run: Run) -> float:
    """The longest of the tasks that take the host lock in a run (one per play)."""
    return max(s for name, s in task_durations(run.stdout) if name.endswith(LOCK_TASKS))


def tree_files(top: Path) -> Iterator[Path]:
    """Every file, directory and symlink under top (top included), not following links."""
    yield top
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            yield Path(dirpath) / name


@dataclass
class Pipeline:
    """localhost as a CPU-profile host with its own work root, ports and reports."""

    base: Path
    root: Path = field(init=False)
    runs: list[Run] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.root = self.base / "root"

    @property
    def state(self) -> Path:
        return self.root / "state"

    def extravars(self, root: Optional[Path] = None, **extra: Any) -> dict[str, Any]:
        return {
            "specfleet_root": str(root or self.root),
            "specfleet_venv": str(CPU_VENV),
            "specfleet_hidden_states_port": HIDDEN_STATES_PORT,
            "specfleet_data_port": DATA_PORT,
            "specfleet_serve_port": SERVE_PORT,
            # Faster polls of the running stages than the roles' 5-10 s (no fingerprint input).
            "stage_poll_delay_s": 2,
            **extra,
        }

    def fresh_extravars(self, name: str, **extra: Any) -> dict[str, Any]:
        """A new, empty work root under the module's base (its venv under it, never built:
        the runs on it stop in the preflight or before any stage)."""
        fresh = self.base / name
        if fresh.exists():
            shutil.rmtree(fresh)
        extravars = self.extravars(root=fresh, **extra)
        extravars.pop("specfleet_venv")
        return extravars

    def command(
        self, label: str, extravars: dict[str, Any], tags: Optional[str] = None
    ) -> tuple[list[str], Path]:
        reports = self.base / f"reports-{len(self.runs) + 1:02d}-{label}"
        argv = [
            str(ANSIBLE_PLAYBOOK),
            str(SITE),
            "-i",
            str(INVENTORY),
            "-e",
            json.dumps({**extravars, "specfleet_reports_dir": str(reports)}),
            *(["--tags", tags] if tags else []),
        ]
        return argv, reports

    def start(self, label: str, extravars: dict[str, Any], tags: Optional[str] = None) -> Started:
        argv, reports = self.command(label, extravars, tags)
        log = self.base / f"{label}.log"
        out = log.open("w")
        proc = subprocess.Popen(
            argv,
            cwd=REPO,
            env=playbook_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        out.close()
        return Started(self, label, proc, log, reports, time.monotonic())

    def run(self, label: str, extravars: Optional[dict[str, Any]] = None) -> Run:
        return self.start(label, self.extravars(**(extravars or {}))).wait()

    def record(self, run: Run) -> Run:
        self.runs.append(run)
        TIMINGS.append((run.label, run.seconds, f"rc={run.rc}"))
        print(f"\n[{run.label}] rc={run.rc} {run.seconds:.1f}s", flush=True)
        return run

    # -- the work root ----------------------------------------------------------------

    def stamps(self) -> dict[str, dict[str, Any]]:
        return {s: json.loads((self.state / f"{s}.json").read_text()) for s in STAGES}

    def stamp_bytes(self) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in sorted(self.state.glob("*.json"))}

    def incomplete(self) -> list[str]:
        """What keeps the root from being complete: missing stamps, failure records."""
        missing = [f"{s}.json" for s in STAGES if not (self.state / f"{s}.json").is_file()]
        return missing + sorted(p.name for p in self.state.glob("*.failed.json"))

    def assert_complete(self) -> None:
        assert not self.incomplete(), f"root not complete: {self.incomplete()}"

    def redone(self, before: dict[str, dict[str, Any]]) -> set[str]:
        """Stages whose stamp now has another run id and start time than in `before`."""
        after = self.stamps()
        return {
            s
            for s in STAGES
            if (after[s]["run_id"], after[s]["started"])
            != (before[s]["run_id"], before[s]["started"])
        }


@dataclass
class Started:
    """An ansible-playbook running in the background."""

    pipeline: Pipeline
    label: str
    proc: subprocess.Popen
    log: Path
    reports: Path
    t0: float

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, timeout_s: float = RUN_TIMEOUT_S) -> Run:
        try:
            self.proc.wait(timeout=max(1.0, timeout_s - (time.monotonic() - self.t0)))
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            self.proc.wait(timeout=60)
            raise AssertionError(f"[{self.label}] timed out\n{self.output()[-4000:]}") from None
        run = Run(
            self.label,
            self.proc.returncode,
            self.output(),
            time.monotonic() - self.t0,
            self.reports,
        )
        return self.pipeline.record(run)


@contextlib.contextmanager
def port_holder(port: int, cwd: Path) -> Iterator[subprocess.Popen]:
    """A foreign process listening on 127.0.0.1:port (python -m http.server)."""
    assert port_free(port), f"port {port} is busy before the test; stop what holds it"
    proc = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    try:
        wait_for(f"http.server on port {port}", lambda: http_ok(port), 30)
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    """The module's base directory and its runs; the shared root is primed by `primed`."""
    if not ANSIBLE_PLAYBOOK.exists():
        pytest.skip(f"{ANSIBLE_PLAYBOOK.relative_to(REPO)} missing (run `make setup`)")
    for port in (SERVE_PORT, HIDDEN_STATES_PORT):
        if not port_free(port):
            pytest.fail(f"port {port} is in use on 127.0.0.1; these tests run the servers there")
    configured = os.environ.get("SPECFLEET_FAILURES_DIR")
    base = Path(configured) if configured else tmp_path_factory.mktemp("specfleet-failures")
    base.mkdir(parents=True, exist_ok=True)
    for old in base.glob("reports-*"):
        shutil.rmtree(old)
    pipeline = Pipeline(base)
    started = time.monotonic()
    yield pipeline
    total = time.monotonic() - started
    print("\n\ntest_failures runs:", flush=True)
    for label, seconds, note in TIMINGS:
        print(f"  {label:<38} {seconds:7.1f}s  {note}")
    print(f"  {'module total':<38} {total:7.1f}s", flush=True)


@pytest.fixture(scope="module")
def primed(pipeline: Pipeline) -> Pipeline:
    """The shared root after one complete run (the slow part: the whole CPU pipeline)."""
    if not (CPU_VENV / "bin" / "python").exists():
        pytest.skip(
            f"{CPU_VENV.relative_to(REPO)} missing (the CPU venv: `make run` builds it;"
            " CI runs it first)"
        )
    pipeline.run("prime").assert_green()
    pipeline.assert_complete()
    return pipeline


@pytest.fixture
def complete(primed: Pipeline) -> Pipeline:
    """The shared root, complete. Each test leaves it so; after one that failed half-way, a
    repair run makes it complete again, so one failure does not fail every later test."""
    if primed.incomplete():
        print(f"\nNOTE: root not complete ({primed.incomplete()}); repair run", flush=True)
        primed.run("repair").assert_green()
    primed.assert_complete()
    return primed


# ----------------------------------------------------------------------------- 1. damage


def assert_redone_exactly(
    pipeline: Pipeline,
    run: Run,
    before: dict[str, dict[str, Any]],
    before_bytes: dict[str, bytes],
    damaged: str,
    expected: set[str],
) -> None:
    run.assert_green()
    assert pipeline.redone(before) == expected, run.tail()
    assert sorted(run.started_stages()) == sorted(expected), run.started_stages()
    after = pipeline.stamps()
    assert after[damaged]["reason"].startswith(REDONE_BY_DAMAGE), after[damaged]["reason"]
    for stage in expected - {damaged}:
        # Fed by the damaged stage: its new run id is one of their inputs.
        assert after[stage]["reason"].startswith("inputs changed: "), after[stage]["reason"]
        assert "upstream" in after[stage]["reason"], after[stage]["reason"]
    untouched = {
        name: data
        for name, data in pipeline.stamp_bytes().items()
        if Path(name).stem not in expected
    }
    assert untouched == {k: v for k, v in before_bytes.items() if Path(k).stem not in expected}
    stages = run.host()["stages"]
    for stage in expected:
        assert stages[stage]["status"] == "passed"
        assert stages[stage]["detail"].startswith("ran: "), stages[stage]
    for stage in set(STAGES) - expected:
        assert stages[stage]["detail"] == "up to date", stages[stage]


@pytest.mark.slow
def test_1a_truncated_hidden_states_redo_hidden_states_train_serve(complete: Pipeline):
    before, before_bytes = complete.stamps(), complete.stamp_bytes()
    files = sorted((complete.root / "hidden_states").glob("hs_*.safetensors"))
    assert files, "no hidden-states files"
    victim = files[len(files) // 2]
    size = victim.stat().st_size
    with victim.open("r+b") as fh:
        fh.truncate(size // 2)

    run = complete.run("1a-truncated-hs")
    assert_redone_exactly(
        complete, run, before, before_bytes, "hidden_states", {"hidden_states", "train", "serve"}
    )
    assert victim.stat().st_size == size, "the truncated file was not rewritten"
    print(f"  hidden_states: {complete.stamps()['hidden_states']['reason']}")


@pytest.mark.slow
def test_1b_deleted_draft_weights_redo_train_serve(complete: Pipeline):
    before, before_bytes = complete.stamps(), complete.stamp_bytes()
    weights = complete.root / "train" / "draft" / "model.safetensors"
    assert weights.is_file()
    weights.unlink()

    run = complete.run("1b-deleted-draft")
    assert_redone_exactly(complete, run, before, before_bytes, "train", {"train", "serve"})
    assert weights.is_file() and weights.stat().st_size > 0
    print(f"  train: {complete.stamps()['train']['reason']}")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("what", "edit"),
    [
        # Inconsistent with the verifier (its hidden size is 128).
        ("draft hidden_size", lambda c: c["transformer_layer_config"].update(hidden_size=64)),
        # Still a plausible DFlash config: only a record of what was converted can tell.
        ("block_size", lambda c: c.update(block_size=c["block_size"] + 4)),
    ],
)
def test_1c_edited_converted_config_redoes_convert(complete: Pipeline, what: str, edit):
    before, before_bytes = complete.stamps(), complete.stamp_bytes()
    config_path = complete.root / "converted" / "config.json"
    original = json.loads(config_path.read_text())
    config = json.loads(config_path.read_text())
    edit(config)
    assert config != original
    config_path.write_text(json.dumps(config, indent=2) + "\n")

    run = complete.run(f"1c-edited-convert-{what.replace(' ', '-')}")
    # serve too: its yardstick is the converted draft (serve needs convert with serve_yardstick).
    assert_redone_exactly(complete, run, before, before_bytes, "convert", {"convert", "serve"})
    assert json.loads(config_path.read_text()) == original, "the edit survived the run"
    print(f"  convert ({what}): {complete.stamps()['convert']['reason']}")


# ----------------------------------------------------------------------------- 2. ports


def assert_only_the_preflight_ran(run: Run, fresh: Path) -> None:
    """The run failed in npu_env's preflight on a fresh root: no stage started, nothing was
    installed or downloaded; only what the preflight needs is there (the layout, the shipped
    helpers, the failure record and the host lock's guard file: the lock was released)."""
    assert run.started_stages() == [], run.started_stages()
    host = run.host()
    assert host["failed_stage"] == "npu_env", host
    assert [host["stages"][s]["status"] for s in STAGES] == ["not reached"] * len(STAGES)
    left = sorted(str(p.relative_to(fresh)) for p in tree_files(fresh) if p != fresh)
    assert left == [
        "lib",
        "lib/specfleet_helpers.zip",
        "logs",
        "run",
        "run/lock.json.guard",
        "state",
        "state/npu_env.failed.json",
    ], left


@pytest.mark.parametrize(
    ("port", "variable"),
    [(SERVE_PORT, "specfleet_serve_port"), (HIDDEN_STATES_PORT, "specfleet_hidden_states_port")],
)
def test_2_foreign_process_on_a_port_fails_the_preflight(
    pipeline: Pipeline, tmp_path: Path, port: int, variable: str
):
    extravars = pipeline.fresh_extravars(f"fresh-port-{port}", **NO_ARTIFACT_SUITE)
    fresh = Path(extravars["specfleet_root"])
    with port_holder(port, tmp_path) as holder:
        run = pipeline.start(f"2-port-{port}", extravars).wait(QUICK_RUN_S)
        assert holder.poll() is None, "the foreign process was ended"
        assert http_ok(port), "the foreign process no longer answers"

    assert run.rc != 0, run.tail()
    error = run.host()["error"]
    for expected in (
        f"127.0.0.1:{port}",
        f"pid {holder.pid}",
        f"-m http.server {port} --bind 127.0.0.1",
        variable,
    ):
        assert expected in error, (expected, error)
        assert expected in run.text, (expected, run.tail())
    assert_only_the_preflight_ran(run, fresh)
    print(f"  error: {error}")
    if port != SERVE_PORT:
        return
    # Once the port is free the preflight passes and its failure record is gone.
    again = pipeline.start(f"2-port-{port}-freed", extravars, tags="npu_env").wait(QUICK_RUN_S)
    assert again.rc == 0, again.tail()
    assert again.host()["stages"]["npu_env"]["status"] == "passed"
    assert (fresh / "state" / "npu_env.json").is_file()
    assert not (fresh / "state" / "npu_env.failed.json").exists()
    shutil.rmtree(fresh)


# ----------------------------------------------------------------------------- 3. disk


def test_3_too_little_disk_fails_before_anything_is_installed(pipeline: Pipeline):
    extravars = pipeline.fresh_extravars(
        "fresh-disk", specfleet_disk_required_gb={"npu": 60, "cpu": 100000}
    )
    fresh = Path(extravars["specfleet_root"])
    run = pipeline.start("3-disk", extravars).wait(QUICK_RUN_S)

    assert run.rc != 0, run.tail()
    error = run.host()["error"]
    for expected in ("preflight disk", "specfleet_disk_required_gb.cpu", "100000 GB", str(fresh)):
        assert expected in error, (expected, error)
        assert expected in run.text, expected
    assert_only_the_preflight_ran(run, fresh)
    print(f"  error: {error}")
    shutil.rmtree(fresh)


# ----------------------------------------------------------------------------- 4. lock


@pytest.mark.slow
def test_4_a_second_run_on_a_busy_host(complete: Pipeline):
    before = complete.stamps()
    run_dir = complete.root / "run"
    lock_file = run_dir / "lock.json"
    a = complete.start(
        "4-A-forced-hs", complete.extravars(specfleet_force_stages=["hidden_states"])
    )

    def hidden_states_running() -> bool:
        assert a.proc.poll() is None, f"run A ended early\n{a.output()[-3000:]}"
        info = run_dir / "hidden_states.pid"
        done = run_dir / "hidden_states.status.json"
        return (
            info.is_file()
            and not done.exists()
            and not (complete.state / "hidden_states.json").exists()
        )

    wait_for("run A's hidden_states stage", hidden_states_running, 900, every_s=1)
    holder = json.loads(lock_file.read_text())
    controller = socket.gethostname()
    assert str(holder["owner"]["pid"]) == str(a.pid), holder
    assert holder["owner"]["controller"] == controller, holder

    # B2 waits for the lock; B1, started while A and B2 run, fails at once.
    b2 = complete.start(
        "4-B2-waits", complete.extravars(specfleet_lock_wait_s=1200, **NO_ARTIFACT_SUITE)
    )
    b1 = complete.start("4-B1-fails", complete.extravars()).wait(QUICK_RUN_S)
    assert b1.rc != 0, b1.tail()
    assert a.proc.poll() is None, "run A ended before run B1 did: not a concurrent run"
    message = b1.text
    for expected in (
        f"host lock {lock_file} is held by run {holder['token']}",
        f"controller {controller}",
        f"pid {a.pid}",
        "play Run the stages",
        "specfleet_lock_wait_s",
    ):
        assert expected in message, (expected, b1.tail())
    assert b1.started_stages() == [], b1.started_stages()
    assert "running: " not in message
    b1_lock_s = lock_wait_s(b1)
    assert b1_lock_s < 10, f"B1 waited {b1_lock_s}s for the lock"
    assert not (b1.reports / "latest").exists(), "B1 wrote a report"

    a_run = a.wait()
    a_run.assert_green()
    assert complete.redone(before) == {"hidden_states", "train", "serve"}
    stamp = complete.stamps()["hidden_states"]
    assert stamp["reason"] == "forced by specfleet_force_stages", stamp["reason"]
    log = (complete.root / "logs" / "hidden_states.log").read_text()
    assert log.count("==> specfleet: stage 'hidden_states' started") == 1, log[:2000]
    assert a_run.started_stages() == ["hidden_states", "train", "serve"]
    assert a_run.stdout.count("TASK [stage : Start: hidden_states]") == 1

    after_a = complete.stamp_bytes()
    b2_run = b2.wait()
    b2_run.assert_green(artifact_tests=False)
    b2_wait = lock_wait_s(b2_run)
    # B2 asked for the lock while A ran and got it only when A was done with the host.
    assert b2_wait > 20, f"B2 waited only {b2_wait}s"
    assert "is held by run" not in b2_run.text
    assert b2_run.started_stages() == [], "B2 redid a stage A had just done"
    assert complete.stamp_bytes() == after_a
    assert not lock_file.exists(), "a lock was left behind"
    print(
        f"  B1 failed after {b1.seconds:.1f}s (lock task {b1_lock_s:.1f}s);"
        f" A took {a_run.seconds:.1f}s;"
        f" B2 waited {b2_wait:.1f}s for the lock, {b2_run.seconds:.1f}s in all"
    )


def lock_of(pid: int, play: str = "Run the stages") -> dict:
    """A host lock as another run of this controller would have written it, heartbeat fresh."""
    now = time.time()
    return {
        "token": f"{pid}-0123456789ab",
        "owner": {
            "controller": socket.gethostname(),
            "pid": str(pid),
            "user": os.environ.get("USER", ""),
            "play": play,
        },
        "acquired": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - 60)),
        "heartbeat": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
        "heartbeat_epoch": now,
    }


def acquiring(lock_file: Path) -> bool:
    """A `session open` of lock_file is running (a run waiting for the lock; its playbook
    output is block-buffered in the log, so the process is the signal)."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            argv = cmdline.read_bytes().split(b"\0")
            lock_arg = f"--lock={lock_file}".encode()
            if b"specfleet_helpers.host.session" in argv and lock_arg in argv:
                return True
    return False


def test_4_a_held_lock_stops_a_run_at_once_or_makes_it_wait(pipeline: Pipeline):
    """The quick form of the case above, on a fresh root: the holder is a live process of this
    controller (a `sleep`) named in a fresh lock, as a running playbook would be."""
    extravars = pipeline.fresh_extravars("fresh-lock", **NO_ARTIFACT_SUITE)
    fresh = Path(extravars["specfleet_root"])
    lock_file = fresh / "run" / "lock.json"
    lock_file.parent.mkdir(parents=True)
    # The helpers the lock holder runs: a refused run must not replace them under it.
    in_use = fresh / "lib" / "specfleet_helpers.zip"
    in_use.parent.mkdir()
    in_use.write_bytes(b"the helpers of the run that holds the lock")
    holder = subprocess.Popen(["sleep", "600"])
    try:
        lock = lock_of(holder.pid)
        lock_file.write_text(json.dumps(lock) + "\n")

        refused = pipeline.start("4-held-fails", extravars, tags="npu_env").wait(QUICK_RUN_S)
        assert refused.rc != 0, refused.tail()
        for expected in (
            f"host lock {lock_file} is held by run {lock['token']}",
            f"controller {socket.gethostname()}",
            f"pid {holder.pid}",
            "play Run the stages",
            "specfleet_lock_wait_s",
        ):
            assert expected in refused.text, (expected, refused.tail())
        assert lock_wait_s(refused) < 10
        assert json.loads(lock_file.read_text()) == lock, "the other run's lock was touched"
        assert not (fresh / "state" / "npu_env.json").exists(), "npu_env ran without the lock"
        assert in_use.read_bytes() == b"the helpers of the run that holds the lock"

        # With specfleet_lock_wait_s the run waits; the holder releases after ~15 s.
        waiting = pipeline.start(
            "4-held-waits", {**extravars, "specfleet_lock_wait_s": 300}, tags="npu_env"
        )
        wait_for("the waiting run to ask for the lock", lambda: acquiring(lock_file), QUICK_RUN_S)
        time.sleep(15)
        assert waiting.proc.poll() is None, "the waiting run did not wait"
        assert acquiring(lock_file), "the waiting run stopped asking for the lock"
        lock_file.unlink()
        waited = waiting.wait(QUICK_RUN_S)
    finally:
        holder.kill()
        holder.wait()
    assert waited.rc == 0, waited.tail()
    assert lock_wait_s(waited) > 10, lock_wait_s(waited)
    assert (fresh / "state" / "npu_env.json").is_file()
    assert not lock_file.exists(), "the waiting run left its lock behind"
    # Once it held the lock, the waiting run put its own helpers in place.
    assert in_use.read_bytes() == (REPO / ".cache" / "specfleet_helpers.zip").read_bytes()
    assert sorted(p.name for p in in_use.parent.iterdir()) == ["specfleet_helpers.zip"]
    print(f"  refused after {refused.seconds:.1f}s; waited {lock_wait_s(waited):.1f}s for it")
    shutil.rmtree(fresh)


def test_4_a_dead_runs_lock_is_taken_over(pipeline: Pipeline):
    extravars = pipeline.fresh_extravars("fresh-dead-lock", **NO_ARTIFACT_SUITE)
    fresh = Path(extravars["specfleet_root"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert not Path(f"/proc/{dead.pid}").exists()
    # A fresh heartbeat: only the dead owner process makes this lock abandoned.
    lock = lock_of(dead.pid)
    lock_file = fresh / "run" / "lock.json"
    lock_file.parent.mkdir(parents=True)
    lock_file.write_text(json.dumps(lock) + "\n")

    run = pipeline.start("4-dead-lock", extravars, tags="npu_env").wait(QUICK_RUN_S)
    assert run.rc == 0, run.tail()
    expected = f"took over the host lock of run {lock['token']} (owner process gone"
    assert expected in run.text, run.tail()
    assert (fresh / "state" / "npu_env.json").is_file()
    assert not lock_file.exists()
    shutil.rmtree(fresh)


# ----------------------------------------------------------------------------- 5 + 6. key


@pytest.mark.slow
def test_5_6_api_key_is_secret_and_enforced(complete: Pipeline):
    marker = "sfkey-" + secrets.token_hex(12)
    before = complete.stamps()
    run = complete.run("5-api-key", {"serve_api_key": marker})
    run.assert_green()
    assert complete.redone(before) == {"serve"}
    serve = complete.stamps()["serve"]
    assert serve["reason"].startswith("inputs changed: ") and "api_key_set" in serve["reason"]

    # 6: the serve stage proved that requests without the key are refused.
    assert serve["inputs"]["api_key_set"] is True
    assert serve["metrics"]["api_key_enforced"] is True, serve["metrics"]
    result = json.loads((complete.root / "serve" / "result.json").read_text())
    assert result["auth"] == {
        "ok": True,
        "api_key_enforced": True,
        "path": "/v1/chat/completions",
        "without_key": 401,
        "wrong_key": 401,
    }
    assert result["chat"]["ok"] is True  # the authenticated completion worked
    assert "requests without the API key refused (HTTP 401)" in run.text
    # ... and the server bound 127.0.0.1 (the default), as its recorded command line says.
    assert serve["inputs"]["host"] == "127.0.0.1"
    vllm_log = (complete.root / "logs" / "serve.trained.vllm.log").read_text(errors="replace")
    command = json.loads(re.search(r"^==> command: (\[.*\])$", vllm_log, re.M).group(1))
    assert command[command.index("--host") + 1] == "127.0.0.1", command
    assert not any(arg.startswith("--api-key") for arg in command), command

    # 5: the key is nowhere: not in the output, not under the work root, not in the report.
    assert marker not in run.stdout
    secret = marker.encode()
    leaks = [
        str(p)
        for top in (complete.root, run.reports)
        for p in tree_files(top)
        if p.is_file() and not p.is_symlink() and secret in p.read_bytes()
    ]
    assert leaks == [], f"the API key leaked into {leaks}"
    script = (complete.root / "run" / "serve.sh").read_text()
    assert "serve_check auth" in script and "VLLM_API_KEY" in script

    # Nothing under the work root is group/world-writable; scripts are 0750 or stricter.
    writable = [
        f"{p} {stat.filemode(p.lstat().st_mode)}"
        for p in tree_files(complete.root)
        if not p.is_symlink() and p.lstat().st_mode & 0o022
    ]
    assert writable == [], writable
    run_dir = complete.root / "run"
    scripts = [*sorted(run_dir.glob("*.sh")), run_dir / "specfleet-env"]
    loose = [f"{p} {oct(p.stat().st_mode & 0o777)}" for p in scripts if p.stat().st_mode & 0o027]
    assert len(scripts) >= len(STAGES) and loose == [], loose
