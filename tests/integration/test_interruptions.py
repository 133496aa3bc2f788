"""Reliability of real runs: interrupted playbooks, a vLLM server that dies, a work root whose
path has spaces. site.yml against this machine (CPU profile, every stage for real).

Every case shares ONE work root (module scope), ``<tmp>/spec fleet root``: its path has
spaces, so every run of the module also proves that the templated scripts quote it. Each
test leaves the root complete for the next. The CPU venv that `make run` built
(.work/local/venv) is reused through specfleet_venv (speculators_install then only checks
it); the servers run on ports 18100 (serve) and 18101 (hidden states).

  1. a work root with spaces: the whole pipeline from nothing to a green report; every
     stage script exists, parses and names the root quoted; nothing was created at the
     pieces of a split path.
  2. the hidden-states vLLM server killed (SIGKILL) while generate-offline-data uses it:
     the stage fails within seconds (measured from the kill to the stage's failure record),
     the failure shows the server's log tail, nothing of the root keeps running; the next
     run redoes hidden_states (and train, serve) and is green.
  3. the playbook interrupted during hidden_states or train. SIGINT (Ctrl-C: to its process
     group) ends the run cleanly: before ansible-playbook exits, its report_net callback
     stops the stage (script, vLLM server, ranks), releases the lock and writes a report
     that says where the run was interrupted; the next run finds the lock free. SIGKILL (to
     ansible-playbook alone) cannot be answered: the stage runs on, detached, and the dead
     run's lock stays; the next run takes the lock over (its owner process is gone), says so,
     and with it stops what the dead run left running. Either way the next run redoes the
     stage ("no stamp from an earlier run") and what follows, and is green; the stage has a
     new run id, its artifacts verify, nothing of the root keeps running.

Needs the controller venv (.venv) and the CPU venv (.work/local/venv: `make run` builds it;
CI runs it first). Takes 37-65 min on 2 cores shared with other runs (11 playbook runs, 6 of
them whole pipelines), hence `slow`: it runs with SPECFLEET_SLOW_TESTS=1 (conftest.py), i.e.
`make test-reliability`. Prints the measured figures (pytest -s). Or on its own:
    SPECFLEET_SLOW_TESTS=1 .venv/bin/python -m pytest -q -s tests/integration/test_interruptions.py
SPECFLEET_INTERRUPTIONS_DIR=<dir> keeps the work root there across sessions (faster reruns).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import pytest
from siteruns import Run, flat, playbook_env, port_free, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SITE = REPO / "site.yml"
INVENTORY = REPO / "inventory" / "local.yml"
ANSIBLE_PLAYBOOK = REPO / ".venv" / "bin" / "ansible-playbook"
CPU_VENV = REPO / ".work" / "local" / "venv"
HELPERS = REPO / "python_helpers"
SERVE_PORT = 18100
HIDDEN_STATES_PORT = 18101
DATA_PORT = 18102
ROOT_NAME = "spec fleet root"
STAGES = ("speculators_install", "models", "convert", "data", "hidden_states", "train", "serve")
AFTER = {"hidden_states": {"hidden_states", "train", "serve"}, "train": {"train", "serve"}}
# A whole pipeline takes 4-11 min on 2 shared cores; this only stops a hung run.
RUN_TIMEOUT_S = 2400
# From the vLLM kill to the stage's failure record: the watch notices within a second; the
# rest is the stage poll (every 5 s) and Ansible's rescue.
SERVER_DEATH_FAILS_WITHIN_S = 30
# Wall time of every run of this module, printed at the end (pytest -s).
TIMINGS: list[tuple[str, float, str]] = []


# ----------------------------------------------------------------------------- helpers


def proc_state(pid: int) -> Optional[str]:
    """The process state letter (R, S, Z, ...), or None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    return proc_state(pid) not in (None, "Z", "X")


def processes_of(root: Path) -> dict[int, str]:
    """Live processes that belong to the work root: its path is in their command line, or in
    their environment (every stage runs with <root>/lib on PYTHONPATH; vLLM renames its
    engine process "VLLM::EngineCore", whose command line then no longer names the root).
    This test process is left out; zombies count as gone."""
    needle = str(root).encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if (needle in cmdline or needle in environ) and alive(int(entry.name)):
            found[int(entry.name)] = cmdline.replace(b"\0", b" ").decode(errors="replace")[:300]
    return found


def find_process(root: Path, marker: str) -> Optional[int]:
    """A live process of the root whose command line contains `marker`."""
    for pid, cmdline in processes_of(root).items():
        if marker in cmdline:
            return pid
    return None


def read_json(path: Path) -> Optional[dict[str, Any]]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


@dataclass
class Started:
    """An ansible-playbook running in the background, in a process group of its own."""

    pipeline: Pipeline
    label: str
    proc: subprocess.Popen
    log: Path
    reports: Path
    t0: float

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, timeout_s: float = RUN_TIMEOUT_S) -> Run:
        try:
            self.proc.wait(timeout=max(1.0, timeout_s - (time.monotonic() - self.t0)))
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=60)
            raise AssertionError(f"[{self.label}] timed out\n{self.output()[-4000:]}") from None
        run = Run(
            self.label,
            self.proc.returncode,
            self.output(),
            time.monotonic() - self.t0,
            self.reports,
        )
        TIMINGS.append((run.label, run.seconds, f"rc={run.rc}"))
        print(f"\n[{run.label}] rc={run.rc} {run.seconds:.1f}s", flush=True)
        return run


@dataclass
class Pipeline:
    """localhost as a CPU-profile host with its own work root (with spaces), ports, reports."""

    base: Path
    root: Path = field(init=False)
    count: int = 0

    def __post_init__(self) -> None:
        self.root = self.base / ROOT_NAME

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    def start(self, label: str, **extravars: Any) -> Started:
        self.count += 1
        reports = self.base / f"reports-{self.count:02d}-{label}"
        log = self.base / f"{self.count:02d}-{label}.log"
        argv = [
            str(ANSIBLE_PLAYBOOK),
            str(SITE),
            "-i",
            str(INVENTORY),
            "-e",
            json.dumps(
                {
                    "specfleet_root": str(self.root),
                    "specfleet_venv": str(CPU_VENV),
                    "specfleet_hidden_states_port": HIDDEN_STATES_PORT,
                    "specfleet_data_port": DATA_PORT,
                    "specfleet_serve_port": SERVE_PORT,
                    "specfleet_reports_dir": str(reports),
                    **extravars,
                }
            ),
        ]
        with log.open("w") as out:
            proc = subprocess.Popen(
                argv,
                cwd=REPO,
                env=playbook_env(),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group, as a shell gives a command
            )
        return Started(self, label, proc, log, reports, time.monotonic())

    def run(self, label: str, **extravars: Any) -> Run:
        return self.start(label, **extravars).wait()

    def stamps(self) -> dict[str, dict[str, Any]]:
        return {s: json.loads((self.state / f"{s}.json").read_text()) for s in STAGES}

    def assert_complete(self) -> None:
        missing = [s for s in STAGES if not (self.state / f"{s}.json").is_file()]
        failed = sorted(p.name for p in self.state.glob("*.failed.json"))
        assert not missing and not failed, f"root not complete: missing {missing}, {failed}"

    def assert_nothing_running(self, what: str) -> None:
        left = wait_for_none(self.root, 30)
        assert not left, f"{what}: processes of the root still run: {json.dumps(left, indent=1)}"
        for name in ("hidden_states", "serve"):
            record = self.run_dir / f"{name}.server.json"
            assert not record.exists(), f"{what}: {record} left: {record.read_text()}"

    def helper(self, *argv: str) -> subprocess.CompletedProcess:
        """A verify command of python_helpers, run as the stage role runs it."""
        return subprocess.run(
            [str(CPU_VENV / "bin" / "python"), "-m", *argv],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "PYTHONPATH": str(HELPERS), "PYTHONDONTWRITEBYTECODE": "1"},
        )

    def verify(self, stage: str) -> dict[str, Any]:
        """The stage's artifacts, checked by the helper its role verifies them with."""
        stamps = self.stamps()
        if stage == "hidden_states":
            hs = stamps["hidden_states"]
            models = stamps["models"]["metrics"]["verifier"]
            result = self.helper(
                "specfleet_helpers.checks.hs_check",
                f"--dir={hs['artifacts']['hidden_states']}",
                f"--rows={stamps['data']['metrics']['rows']}",
                f"--layers={len(hs['inputs']['target_layer_ids']) + 1}",
                f"--hidden-size={models['hidden_size']}",
            )
        else:
            result = self.helper(
                "specfleet_helpers.stages.checkpoint",
                "verify",
                f"--out={stamps[stage]['artifacts']['draft']}",
            )
        assert result.returncode == 0, f"{stage} artifacts do not verify: {result.stderr}"
        return json.loads(result.stdout.splitlines()[-1])


def wait_for_none(root: Path, timeout_s: float) -> dict[int, str]:
    """The root's processes still alive after up to timeout_s (a stopping server may take a
    few seconds to go), or {}."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = processes_of(root)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def pipeline(request: pytest.FixtureRequest) -> Iterator[Pipeline]:
    for needed, why in (
        (ANSIBLE_PLAYBOOK, "the controller venv: run `make setup`"),
        (CPU_VENV / "bin" / "python", "the CPU venv: `make run` builds it (CI runs it first)"),
    ):
        if not needed.exists():
            pytest.skip(f"{needed.relative_to(REPO)} missing ({why})")
    for port in (SERVE_PORT, HIDDEN_STATES_PORT):
        if not port_free(port):
            pytest.fail(f"port {port} is in use on 127.0.0.1; these tests run the servers there")
    configured = os.environ.get("SPECFLEET_INTERRUPTIONS_DIR")
    if configured:
        base = Path(configured)
        base.mkdir(parents=True, exist_ok=True)
    else:
        parent = Path(tempfile.gettempdir()) / "specfleet-interruptions"
        parent.mkdir(exist_ok=True)
        base = Path(tempfile.mkdtemp(prefix="run-", dir=parent))
    for old in [*base.glob("reports-*"), *base.glob("[0-9][0-9]-*.log")]:
        shutil.rmtree(old) if old.is_dir() else old.unlink()
    failed_before = request.session.testsfailed
    started = time.monotonic()
    yield Pipeline(base)
    total = time.monotonic() - started
    print("\n\ntest_interruptions runs:", flush=True)
    for label, seconds, note in TIMINGS:
        print(f"  {label:<34} {seconds:7.1f}s  {note}")
    print(f"  {'module total':<34} {total:7.1f}s", flush=True)
    if configured or request.session.testsfailed > failed_before:
        print(f"  work root kept: {base}", flush=True)
    else:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def complete(pipeline: Pipeline) -> Pipeline:
    """The shared root, complete (each test leaves it so; this says so when one did not)."""
    pipeline.assert_complete()
    return pipeline


# ----------------------------------------------------------------------------- 1. spaces


def test_1_a_work_root_with_spaces_runs_green(pipeline: Pipeline):
    fresh = not pipeline.state.exists()
    run = pipeline.run("spaces")
    run.assert_green()
    pipeline.assert_complete()
    if fresh:
        assert set(run.started_stages()) >= set(STAGES), run.started_stages()
    root = str(pipeline.root)
    stamps = pipeline.stamps()
    for stage, stamp in stamps.items():
        for name, path in stamp["artifacts"].items():
            if isinstance(path, str) and path.startswith("/") and stage != "speculators_install":
                assert path.startswith(root + "/"), (stage, name, path)
                assert Path(path).exists(), (stage, name, path)
    for stage in STAGES:
        script = pipeline.run_dir / f"{stage}.sh"
        assert script.is_file(), f"{script} missing"
        syntax = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert syntax.returncode == 0, (script, syntax.stderr)
        # Every use of the root outside comments and echo lines is quoted as one word.
        for number, line in enumerate(script.read_text().splitlines(), 1):
            code = line.strip()
            if root not in code or code.startswith(("#", "echo ", "step ")):
                continue
            unquoted = re.sub(r"'[^']*'|\"[^\"]*\"", "", code)
            assert ROOT_NAME.split()[0] + " " not in unquoted, f"{script}:{number}: {line}"
    # Nothing at the pieces of a split path: <base>/spec, and fleet or root in the directory
    # the playbook ran from (the stage scripts' working directory).
    first, *rest = ROOT_NAME.split()
    strays = [pipeline.base / first, *(REPO / piece for piece in rest)]
    assert not [str(p) for p in strays if p.exists()], "something wrote to a split root path"
    pipeline.assert_nothing_running("spaces")
    print(f"  root: {root!r}; stages run: {run.started_stages()}")


# ----------------------------------------------------------------------------- 2. vLLM dies


def test_2_vllm_dying_during_generation_fails_the_stage_within_seconds(complete: Pipeline):
    pipeline = complete
    server_json = pipeline.run_dir / "hidden_states.server.json"
    failed_json = pipeline.state / "hidden_states.failed.json"
    vllm_log = pipeline.root / "logs" / "hidden_states.vllm.log"
    # The role's own poll delay (5 s for hidden_states): the figure is what a user sees.
    started = pipeline.start("vllm-dies", specfleet_force_stages=["hidden_states"])
    client = wait_for(
        "generate-offline-data to run",
        lambda: (
            started.proc.poll() is None
            and server_json.is_file()
            and find_process(pipeline.root, "generate-offline-data")
        ),
        900,
    )
    assert started.proc.poll() is None, started.output()[-4000:]
    server = read_json(server_json)
    assert server and alive(server["pid"]), server
    os.kill(server["pid"], signal.SIGKILL)
    killed_at = time.monotonic()
    print(f"  killed vLLM pid {server['pid']} while generate-offline-data pid {client} ran")

    wait_for("the stage's failure record", failed_json.is_file, 600, every_s=0.1)
    failed_after = time.monotonic() - killed_at
    client_gone = not alive(client)
    run = started.wait()
    print(f"  kill -> failure record: {failed_after:.1f}s")
    assert failed_after < SERVER_DEATH_FAILS_WITHIN_S, (
        f"the stage failed {failed_after:.1f}s after vLLM died\n{run.tail()}"
    )
    assert client_gone, "generate-offline-data still ran when the stage failed"

    assert run.rc != 0
    host = run.host()
    assert host["green"] is False and host["failed_stage"] == "hidden_states", host
    assert run.started_stages() == ["hidden_states"], run.started_stages()
    record = json.loads(failed_json.read_text())
    # The failure names the death and carries the server's own last lines.
    died = f"server 'hidden_states' (pid {server['pid']}) died while pid {client} used it"
    assert died in run.text and died in "\n".join(record["log_tail"]), record
    server_lines = [line.strip() for line in vllm_log.read_text().splitlines() if line.strip()]
    shown = [line.strip().removeprefix("| ").strip() for line in record["log_tail"]]
    from_server = [line for line in shown if line and line in server_lines]
    assert len(from_server) >= 10, (shown, server_lines[-15:])
    assert all(flat(line) in run.text for line in from_server[-5:]), from_server[-5:]
    pipeline.assert_nothing_running("after the vLLM death")
    print(f"  failure: {record['error'].splitlines()[0]}")
    print(f"  server log lines in the failure: {len(from_server)}, last: {from_server[-1]!r}")

    again = pipeline.run("vllm-dies-rerun")
    again.assert_green()
    assert "hidden_states: running: no stamp from an earlier run" in again.text, again.tail()
    assert set(again.started_stages()) == AFTER["hidden_states"], again.started_stages()
    pipeline.verify("hidden_states")
    pipeline.assert_complete()
    pipeline.assert_nothing_running("after the rerun")


# ----------------------------------------------------------------------------- 3. interrupted


def stage_running(pipeline: Pipeline, stage: str, phase: str) -> Optional[dict[str, Any]]:
    """The stage's pid record once it really works: hidden_states with its vLLM server
    starting (phase "server") or with generate-offline-data using it ("generate"), train
    with the trainer process."""
    info = read_json(pipeline.run_dir / f"{stage}.pid")
    if not info or not alive(info["supervisor"]):
        return None
    if stage == "hidden_states":
        server = read_json(pipeline.run_dir / "hidden_states.server.json")
        if not (server and alive(server["pid"])):
            return None
        client = find_process(pipeline.root, "generate-offline-data")
        if phase == "generate" and not client:
            return None
        return {**info, "server": server["pid"], "worker": client}
    worker = find_process(pipeline.root, "specfleet_helpers.cpu.train_entry")
    return {**info, "worker": worker} if worker else None


@pytest.mark.parametrize(
    ("stage", "signum", "phase"),
    [
        # Ctrl-C while vLLM loads (the longest wait), kill -9 while it generates.
        ("hidden_states", signal.SIGINT, "server"),
        ("hidden_states", signal.SIGKILL, "generate"),
        ("train", signal.SIGINT, "train"),
        ("train", signal.SIGKILL, "train"),
    ],
    ids=["hidden_states-SIGINT", "hidden_states-SIGKILL", "train-SIGINT", "train-SIGKILL"],
)
def test_3_interrupted_run_is_redone_by_the_next(
    complete: Pipeline, stage: str, signum: int, phase: str
):
    pipeline = complete
    label = f"{stage}-{signal.Signals(signum).name}"
    before = pipeline.stamps()
    started = pipeline.start(label, specfleet_force_stages=[stage])
    running = wait_for(
        f"{stage} to run ({phase})",
        lambda: started.proc.poll() is None and stage_running(pipeline, stage, phase),
        900,
    )
    if signum == signal.SIGINT:
        os.killpg(started.proc.pid, signal.SIGINT)  # Ctrl-C: the terminal's foreground group
    else:
        os.kill(started.proc.pid, signal.SIGKILL)
    sent_at = time.monotonic()
    try:
        started.proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(started.proc.pid, signal.SIGKILL)
        raise AssertionError(
            f"ansible-playbook ignored {label}\n{started.output()[-4000:]}"
        ) from None
    exited_after = time.monotonic() - sent_at
    output = started.output()
    TIMINGS.append((label, time.monotonic() - started.t0, f"rc={started.proc.returncode}"))

    lock = read_json(pipeline.run_dir / "lock.json")
    assert not alive(started.proc.pid)
    detached = alive(running["supervisor"])
    left = processes_of(pipeline.root)
    assert not (pipeline.state / f"{stage}.json").exists(), "the interrupted stage kept a stamp"
    print(
        f"  {label}: ansible-playbook exited {exited_after:.1f}s after the signal "
        f"(rc {started.proc.returncode}); the detached stage "
        f"{'still ran' if detached else 'had ended'}; {len(left)} processes of the root"
    )
    if signum == signal.SIGINT:
        # Ctrl-C: the run ended its own work, released its lock and reported where it stopped.
        assert started.proc.returncode == 99, output[-3000:]
        assert "specfleet: interrupted at play" in output, output[-3000:]
        assert lock is None, lock
        assert not detached and not left, (left, output[-3000:])
        report = json.loads((started.reports / "latest" / "fleet.json").read_text())
        assert report["ended_early"].startswith("interrupted at play"), report["ended_early"]
        host = report["hosts"][0]
        assert host["failed_stage"] == stage, host
        assert host["stages"][stage]["detail"].startswith("interrupted"), host["stages"][stage]
        md = (started.reports / "latest" / "fleet.md").read_text()
        assert "**The run was interrupted** at play" in md, md
    else:
        # kill -9: nothing could answer; the dead run holds the lock and its stage runs on.
        assert lock and lock["owner"]["pid"] == str(started.proc.pid), lock
    if signum == signal.SIGKILL and stage == "hidden_states":
        # vLLM's start and a 10-row generation outlast the seconds ansible-playbook takes to exit
        assert detached, (running, output[-3000:])
    paused = None
    if phase == "generate":
        # On a real dataset generation runs for hours: pause the orphaned client, so that the
        # detached stage still generates, its server listening on the port, when the next run
        # starts (a 10-row generation could end first and prove nothing).
        paused = running["worker"]
        os.kill(paused, signal.SIGSTOP)

    try:
        again = pipeline.run(f"{label}-rerun")
    finally:
        if paused and alive(paused):
            os.kill(paused, signal.SIGKILL)
    again.assert_green()
    took_over = re.search(r"took over the host lock of run (\S+) \((.*?)\)", again.text)
    if signum == signal.SIGINT:
        assert not took_over, again.tail()
    else:
        assert took_over and took_over.group(1) == lock["token"], again.tail()
        print(f"  {label}: the rerun {took_over.group(0)}")
    if paused:
        # The dead run's stage and server are stopped when its lock is taken over, before the
        # preflight (which would find the port in use) and long before the stage reruns.
        assert "stopped what it left running: stage hidden_states" in took_over.group(2)
    assert f"{stage}: running: no stamp from an earlier run" in again.text, again.tail()
    assert set(again.started_stages()) == AFTER[stage], again.started_stages()
    after = pipeline.stamps()
    for name in AFTER[stage]:
        assert after[name]["run_id"] != before[name]["run_id"], name
    for name in set(STAGES) - AFTER[stage]:
        assert after[name]["run_id"] == before[name]["run_id"], name
    assert after[stage]["reason"] == "no stamp from an earlier run", after[stage]
    metrics = pipeline.verify(stage)
    pipeline.assert_complete()
    for pid in (
        running["supervisor"],
        running["pid"],
        running.get("server"),
        running.get("worker"),
    ):
        assert pid is None or not alive(pid), f"pid {pid} of the interrupted run still runs"
    pipeline.assert_nothing_running(f"after {label}")
    assert not (pipeline.state / f"{stage}.failed.json").exists()
    print(f"  {label}: rerun {again.seconds:.0f}s, {stage} verified: {json.dumps(metrics)[:160]}")


# ----------------------------------------------------------------------------- 4. resume


def rank_pids(root: Path) -> list[int]:
    """The live torchrun ranks of the root's train stage (each in a session of its own)."""
    return sorted(
        pid
        for pid, cmdline in processes_of(root).items()
        if "specfleet_helpers.cpu.train_entry" in cmdline and "torch.distributed.run" not in cmdline
    )


def test_4_a_run_killed_mid_train_leaves_no_rank_and_the_next_resumes(complete: Pipeline):
    """Two gloo ranks (the CPU default) train 6 epochs; ansible-playbook is killed (SIGKILL) once
    speculators has saved epoch 0. The next run takes the lock over, which ends the old stage:
    torchrun's own shutdown (its ranks save an `interrupted` checkpoint and exit) within the
    train stage's stop grace. No rank of the old run is alive afterwards; train resumes within
    the epoch the ranks were in, from their `interrupted` checkpoint in the same checkpoint
    directory (named after train's inputs), and the run is green."""
    pipeline = complete
    epochs = 6
    started = pipeline.start("train-killed", train_epochs=epochs)
    record: dict[str, Any] = {}

    def epoch0_saved() -> bool:
        if started.proc.poll() is not None:
            raise AssertionError(f"the run ended early\n{started.output()[-4000:]}")
        record.update(read_json(pipeline.run_dir / "train.pid") or {})
        saves = list((pipeline.root / "train" / "checkpoints").glob("*/0/training_state.json"))
        return bool(record) and bool(saves) and len(rank_pids(pipeline.root)) == 2

    wait_for("train to save epoch 0 with its two ranks running", epoch0_saved, 1200, every_s=0.2)
    ranks = rank_pids(pipeline.root)
    os.kill(started.proc.pid, signal.SIGKILL)
    started.proc.wait(timeout=60)
    assert all(alive(pid) for pid in ranks), "the ranks should outlive the killed playbook"
    checkpoints = pipeline.root / "train" / "checkpoints"
    save = next(checkpoints.glob("*/0/training_state.json")).parents[1]
    print(f"  killed ansible-playbook with ranks {ranks} running, epoch 0 saved in {save.name}")

    again = pipeline.run("train-killed-rerun", train_epochs=epochs)
    again.assert_green()
    assert re.search(r"took over the host lock of run \S+ \(.*stage train", again.text), (
        again.tail()
    )
    assert not [pid for pid in ranks if alive(pid)], "a rank of the killed run still runs"
    assert record["stop_grace_s"] == 45, record
    log = (pipeline.root / "logs" / "train.log").read_text(errors="replace")
    # torchrun's own shutdown came first: its ranks were asked to stop (SIGTERM) and saved
    # speculators' `interrupted` checkpoint, which the rerun resumed within its epoch.
    adopted = re.search(r'"resumed_from": "the interrupted checkpoint, in epoch (\d+)"', log)
    assert adopted and int(adopted.group(1)) >= 1, log[-3000:]
    resumed = re.search(r"Resuming mid-epoch from epoch=(\d+) local_step=1", log)
    assert resumed and resumed.group(1) == adopted.group(1), log[-3000:]
    assert not (save / "interrupted").exists(), sorted(os.listdir(save))
    stamp = pipeline.stamps()["train"]
    assert stamp["artifacts"]["checkpoints"] == str(save), (stamp["artifacts"], save)
    published = json.loads((pipeline.run_dir / "train.publish.json").read_text().splitlines()[-1])
    assert published["metrics"]["val_loss_finite"] is True
    pipeline.verify("train")
    pipeline.assert_nothing_running("after the resumed train")
    print(f"  rerun resumed on epoch {resumed.group(1)} of {epochs}; {again.seconds:.0f}s")
