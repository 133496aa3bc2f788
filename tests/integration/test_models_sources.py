"""The models role's `modelscope` and `local` sources, for real, on this machine.

site.yml runs with --tags models against localhost (CPU profile; npu_env runs too, it is
tagged always) with a work root under tmp_path. The `modelscope` source downloads through
the real modelscope 1.37.0 `snapshot_download` in the CPU venv from fake_modelscope.py, a
local server speaking the part of ModelScope's API that snapshot_download uses and serving
a tiny verifier and DFlash draft synthesized once per module as Qwen/Qwen3-8B and
z-lab/Qwen3-8B-DFlash-b16.

  a. download: the play succeeds, the stamp's artifacts are where the runbook's own
     `snapshot_download(id)` puts them (<specfleet_modelscope_cache>/models/<org>/<name>), metrics
     recorded, the downloaded weights are byte-identical to the served ones
  b. the same again: changed=0 and not one request reaches the server
  c. the verifier's weights fail part-way on every attempt of the first play: the play fails
     with the stage, the log, the re-run command and modelscope's error; no stamp; the next
     play resumes (Range from the partial file) and fetches none of the draft's files again
  d. with models_modelscope_token: the token is in no output, event, stamp or work-root file
  e. source local: the given directories are used as they are; a truncated weight file fails
  f. a host that followed the runbook (its `snapshot_download(id)`, no cache_dir, as root:
     ~/.cache/modelscope/hub/models/<org>/<name>, with modelscope's .msc/.mv/.mdl beside
     the files): not one file is requested again, and those directories are the models
  g. a copy an older specfleet left at <specfleet_modelscope_cache>/<org>/<name> (cache_dir= layout)
     is moved into the runbook's layout, not downloaded again
  h. the disk preflight measures the cache's filesystem: more space required for the models
     than it has stops the host before any request, naming the cache path and the variables;
     with the cache on another filesystem than the work root, only the cache is blamed

Needs the CPU venv (modelscope, torch, transformers; `make run` builds it at .work/local/venv,
or point SPECFLEET_TEST_VENV at one). Run explicitly:
    .venv/bin/python -m pytest -q -s tests/integration/test_models_sources.py
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from fake_modelscope import FakeModelScope
from siteruns import LOW_HOST_FLOORS, free_port

pytestmark = [
    pytest.mark.integration,
    # ansible-runner starts ansible-playbook with pexpect's forkpty while the fake hub's
    # server thread is alive; the child execs at once and the hub is idle between plays.
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning"),
]

REPO = Path(__file__).resolve().parents[2]
SITE = REPO / "site.yml"
CONTROLLER_PYTHON = REPO / ".venv" / "bin" / "python"
HOST = "localhost"
STAGE = "models"
VERIFIER_ID = "Qwen/Qwen3-8B"
DRAFT_ID = "z-lab/Qwen3-8B-DFlash-b16"
WEIGHTS = "model.safetensors"
TOKEN = "sekrit-token-123"
# modelscope 1.37.0's http_get_model_file retries a broken download 5 times (Retry(total=5),
# API_FILE_DOWNLOAD_RETRY_TIMES), resuming with a Range request each time, so a file must fail
# on 6 requests in a row for snapshot_download (and the play) to fail. The retries back off
# 0+2+4+8+16 s.
CLIENT_ATTEMPTS = 6
# Where modelscope keeps partial downloads under its model store (TEMPORARY_FOLDER_NAME).
MODELSCOPE_TEMP = "._____temp"
# modelscope 1.37.0 with no cache_dir (the runbook's call) keeps models in
# $MODELSCOPE_CACHE/models/<org>/<name>; MODELSCOPE_CACHE defaults to ~/.cache/modelscope/hub.
RUNBOOK_STORE = "models"
RUNBOOK_CACHE = Path(".cache", "modelscope", "hub")
# What modelscope writes beside a model's files: the index of cached files (.msc), the
# model's id (.mdl) and revision (.mv). With them a directory counts as a complete download.
MODELSCOPE_INDEX = (".msc", ".mdl", ".mv")
# A play takes ~30 s here (plus ~30 s of modelscope back-off in case c); this only stops a
# hung run. Other tests and molecule may share the 2 cores.
RUN_TIMEOUT_S = 1200
BUILD_TIMEOUT_S = 900
# What a play reads from the checkout (others edit it while this runs).
CHECKOUT_WATCHED = (
    "ansible.cfg",
    "plugins",
    "playbooks",
    "python_helpers",
    "roles",
    "site.yml",
)
MAX_SETTLE_PLAYS = 3
# --tags models still runs every role's argument-spec validation (Ansible tags it `always`);
# train's templates train_target_layer_ids from specfleet_outputs.hidden_states.target_layer_ids,
# which only the hidden_states stage gives, so it fails under any --tags that leaves it out.
# Skipping train's tag skips that validation and nothing else of a models-only run.
SKIP_TAGS = "train"
# Wall time of every play of this module, printed at the end (pytest -s).
TIMINGS: list[tuple[str, float, str]] = []


def cpu_venv() -> Path:
    configured = os.environ.get("SPECFLEET_TEST_VENV")
    return Path(configured) if configured else REPO / ".work" / "local" / "venv"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def checkout_digest() -> dict[str, str]:
    digest = {}
    for name in CHECKOUT_WATCHED:
        top = REPO / name
        paths = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        for path in paths:
            if "__pycache__" in path.parts:
                continue
            try:
                digest[path.relative_to(REPO).as_posix()] = sha256(path)
            except OSError:  # removed while walking
                continue
    return digest


def changed_files(old: dict[str, str], new: dict[str, str]) -> list[str]:
    return sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))


@dataclass
class PlayResult:
    """One ansible-runner run (as conftest's PlayResult; not imported from conftest, whose
    module name another directory's conftest.py can take when several are collected)."""

    rc: int
    status: str
    stats: dict[str, dict[str, int]]
    events: list[dict[str, Any]]
    stdout: str

    def count(self, stat: str, host: str = HOST) -> int:
        return (self.stats.get(stat) or {}).get(host, 0)

    @property
    def failed(self) -> bool:
        return self.count("failures") > 0 or self.count("dark") > 0

    @property
    def failure_message(self) -> str:
        """The `msg` of every failed task of HOST (loop items one by one)."""
        messages = []
        for event in self.events:
            if event.get("event") not in ("runner_on_failed", "runner_item_on_failed"):
                continue
            data = event.get("event_data", {})
            res = data.get("res", {})
            if data.get("host") != HOST or (
                event["event"] == "runner_on_failed" and res.get("results")
            ):
                continue
            if res.get("msg"):
                messages.append(str(res["msg"]))
        assert messages, f"no failed task for {HOST}; rc={self.rc}\n{self.stdout[-4000:]}"
        return "\n".join(messages)

    def task_results(self, task: str, host: str = HOST) -> list[dict[str, Any]]:
        return [
            e["event_data"].get("res", {})
            for e in self.events
            if e.get("event") == "runner_on_ok"
            and e["event_data"].get("host") == host
            and e["event_data"].get("task") == task
        ]


@dataclass
class Play:
    label: str
    result: PlayResult
    seconds: float
    checkout_before: dict[str, str] = field(repr=False)
    checkout_after: dict[str, str] = field(repr=False)

    @property
    def ok(self) -> bool:
        return self.result.rc == 0 and not self.result.failed

    @property
    def changed(self) -> int:
        return self.result.count("changed")

    def tail(self, lines: int = 80) -> str:
        return "\n".join(self.result.stdout.splitlines()[-lines:])

    def plan(self) -> str:
        """The models stage's plan line ('models: up to date, skipping ...' / 'running: ...'):
        its line of the play's plan, or its role's own decision when it ran."""
        for res in self.result.task_results(f"Plan: {STAGE}"):
            return str(res.get("msg", ""))
        for res in self.result.task_results("Plan the stages"):
            for line in res.get("specfleet_plan") or []:
                if line.startswith(f"{STAGE}: "):
                    return str(line)
        return ""

    def failed_results(self) -> list[dict[str, Any]]:
        """res of every failed task or loop item of HOST."""
        found = []
        for event in self.result.events:
            if event.get("event") not in ("runner_on_failed", "runner_item_on_failed"):
                continue
            data = event.get("event_data", {})
            if data.get("host") == HOST:
                found.append({"task": data.get("task"), **data.get("res", {})})
        return found

    def changed_tasks(self) -> list[str]:
        return [
            str(e["event_data"].get("task"))
            for e in self.result.events
            if e.get("event") in ("runner_on_ok", "runner_item_on_ok")
            and e["event_data"].get("host") == HOST
            and e["event_data"].get("res", {}).get("changed")
        ]


@dataclass
class ModelsHost:
    """localhost as a CPU-profile host with its own work root and modelscope cache."""

    tmp: Path
    venv: Path
    root: Path = field(init=False)
    cache: Path = field(init=False)
    inventory: Path = field(init=False)
    plays: list[Play] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.root = self.tmp / "root"
        self.cache = self.tmp / "cache"
        # modelscope writes a session id under its credentials path; keep it here.
        self.credentials = self.tmp / "modelscope-credentials"
        self.default_cache = self.tmp / "modelscope-default-cache"
        hostvars = {
            "ansible_connection": "local",
            "ansible_python_interpreter": str(CONTROLLER_PYTHON),
            "specfleet_accelerator": "cpu",
            "specfleet_root": str(self.root),
            "specfleet_venv": str(self.venv),
            "specfleet_hidden_states_port": free_port(),
            "specfleet_serve_port": free_port(),
            "specfleet_data_port": free_port(),
            **LOW_HOST_FLOORS,
        }
        self.inventory = self.tmp / "inventory.yml"
        self.inventory.write_text(yaml.safe_dump({"all": {"hosts": {HOST: hostvars}}}))

    def store(self, model_id: str) -> Path:
        """Where the runbook's snapshot_download(model_id) keeps the model in this cache."""
        return self.cache / RUNBOOK_STORE / model_id

    @property
    def stamp_file(self) -> Path:
        return self.root / "state" / f"{STAGE}.json"

    @property
    def log_file(self) -> Path:
        return self.root / "logs" / f"{STAGE}.log"

    @property
    def script(self) -> Path:
        return self.root / "run" / f"{STAGE}.sh"

    def stamp(self) -> dict[str, Any]:
        return json.loads(self.stamp_file.read_text())

    def modelscope_vars(self, hub: FakeModelScope, **extra: Any) -> dict[str, Any]:
        return {
            "models_source": "modelscope",
            "models_modelscope_endpoint": hub.url,
            "specfleet_modelscope_cache": str(self.cache),
            "specfleet_verifier_model_id": VERIFIER_ID,
            "models_draft_id": DRAFT_ID,
            "models_verifier_revision": "master",
            "models_draft_revision": "master",
            **extra,
        }

    def play(self, label: str, extravars: dict[str, Any]) -> Play:
        import ansible_runner

        venv_bin = str(Path(sys.executable).parent)
        envvars = {
            "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
            "ANSIBLE_NOCOLOR": "1",
            "PATH": f"{venv_bin}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "MODELSCOPE_CREDENTIALS_PATH": str(self.credentials),
            "MODELSCOPE_CACHE": str(self.default_cache),
        }
        private_data_dir = self.tmp / f"runner-{len(self.plays) + 1}-{label}"
        private_data_dir.mkdir()
        before = checkout_digest()
        started = time.monotonic()
        runner = ansible_runner.run(
            private_data_dir=str(private_data_dir),
            project_dir=str(REPO),
            playbook=str(SITE),
            inventory=str(self.inventory),
            tags=STAGE,
            skip_tags=SKIP_TAGS,
            # Faster polls of the stage than the default 10 s; not part of any fingerprint.
            extravars={"stage_poll_delay_s": 2, **extravars},
            envvars=envvars,
            timeout=RUN_TIMEOUT_S,
            quiet=True,
        )
        seconds = time.monotonic() - started
        stdout = runner.stdout.read() if runner.stdout else ""
        result = PlayResult(
            rc=runner.rc,
            status=runner.status,
            stats=runner.stats or {},
            events=list(runner.events),
            stdout=stdout,
        )
        play = Play(label, result, seconds, before, checkout_digest())
        self.plays.append(play)
        TIMINGS.append((label, seconds, f"rc={result.rc} changed={play.changed} ok={play.ok}"))
        print(f"\n[{label}] rc={result.rc} {seconds:.1f}s changed={play.changed}", flush=True)
        if runner.status == "timeout":
            self.stop_stage()
        assert runner.status != "timeout", f"[{label}] timed out\n{stdout[-4000:]}"
        return play

    def play_unchanged_checkout(self, label: str, extravars: dict[str, Any]) -> Play:
        """Play once more on the checkout the previous play ended on.

        Others edit the checkout while this runs; a changed role or helper legitimately makes
        a play change something. When the checkout moved during or since the previous play,
        settle plays run first (at most MAX_SETTLE_PLAYS, each said on stdout).
        """
        previous = self.plays[-1]
        for attempt in range(1, MAX_SETTLE_PLAYS + 1):
            moved = sorted(
                set(changed_files(previous.checkout_before, previous.checkout_after))
                | set(changed_files(previous.checkout_after, checkout_digest()))
            )
            if not moved:
                break
            print(
                f"\n[{label}] NOTE: checkout changed ({', '.join(moved[:8])}); settle play",
                flush=True,
            )
            previous = self.play(f"{label}-settle{attempt}", extravars)
            assert previous.ok, f"settle play failed\n{previous.tail()}"
        return self.play(label, extravars)

    def stop_stage(self) -> None:
        """End a detached stage script a timed-out play left behind."""
        subprocess.run(
            [
                str(CONTROLLER_PYTHON),
                "-m",
                "specfleet_helpers.host.stage_run",
                "stop",
                f"--name={STAGE}",
                f"--run-dir={self.root / 'run'}",
            ],
            env={**os.environ, "PYTHONPATH": str(REPO / "python_helpers")},
            capture_output=True,
            check=False,
            timeout=60,
        )


@dataclass
class TinyModels:
    verifier: Path
    draft: Path
    served_root: Path

    def served(self, model_id: str) -> Path:
        return self.served_root / model_id


# -- fixtures --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def venv() -> Path:
    for tool in (CONTROLLER_PYTHON,):
        if not tool.exists():
            pytest.skip(f"{tool.relative_to(REPO)} missing: run `make setup` first")
    path = cpu_venv()
    python = path / "bin" / "python"
    if not python.exists():
        pytest.skip(f"CPU venv {path} missing (`make run` builds it; or set SPECFLEET_TEST_VENV)")
    probe = subprocess.run(
        [str(python), "-c", "import modelscope, torch, transformers, safetensors, tokenizers"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if probe.returncode != 0:
        pytest.skip(f"CPU venv {path} lacks modelscope/torch/transformers: {probe.stderr[-500:]}")
    return path


@pytest.fixture(scope="module")
def tiny(venv: Path, tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    """A tiny verifier + DFlash draft, built once, laid out as served ModelScope repos."""
    base = tmp_path_factory.mktemp("tiny_models")
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO / "python_helpers"),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    built = {"verifier": base / "verifier", "draft": base / "draft"}
    for argv in (
        ["verifier", "--out", str(built["verifier"])],
        ["draft", "--verifier", str(built["verifier"]), "--out", str(built["draft"])],
    ):
        proc = subprocess.run(
            [str(venv / "bin" / "python"), "-m", "specfleet_helpers.cpu.tiny_models", *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            check=False,
        )
        assert proc.returncode == 0, f"tiny_models {argv[0]} failed\n{proc.stderr[-3000:]}"
    served = base / "served"
    shutil.copytree(built["verifier"], served / VERIFIER_ID)
    shutil.copytree(built["draft"], served / DRAFT_ID)
    return TinyModels(built["verifier"], built["draft"], served)


@pytest.fixture(scope="module")
def hub(tiny: TinyModels) -> Iterator[FakeModelScope]:
    with FakeModelScope(tiny.served_root) as server:
        yield server


@pytest.fixture(scope="module")
def shared_host(venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelsHost]:
    """The host of cases a and b (b re-runs a's play)."""
    host = ModelsHost(tmp_path_factory.mktemp("models_modelscope"), venv)
    yield host
    host.stop_stage()


@pytest.fixture
def fresh_host(venv: Path, tmp_path: Path) -> Iterator[ModelsHost]:
    host = ModelsHost(tmp_path, venv)
    yield host
    host.stop_stage()


@pytest.fixture(scope="module", autouse=True)
def report_timings() -> Iterator[None]:
    yield
    print("\nmodels sources, wall time per play:")
    for label, seconds, outcome in TIMINGS:
        print(f"  {label:<22} {seconds:7.1f}s  {outcome}")


# -- helpers ---------------------------------------------------------------------------------
def served_files(tiny: TinyModels, model_id: str) -> list[str]:
    root = tiny.served(model_id)
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def assert_same_files(tiny: TinyModels, model_id: str, local: Path) -> None:
    for rel in served_files(tiny, model_id):
        got, want = local / rel, tiny.served(model_id) / rel
        assert got.is_file(), f"{got} missing after the download"
        assert got.read_bytes() == want.read_bytes(), f"{got} differs from the served {want}"


def assert_recorded_models(
    host: ModelsHost, tiny: TinyModels, verifier: Path, draft: Path
) -> dict[str, Any]:
    stamp = host.stamp()
    assert stamp["stage"] == STAGE
    assert stamp["artifacts"] == {"verifier": str(verifier), "draft": str(draft)}
    for key, model_id in (("verifier", VERIFIER_ID), ("draft", DRAFT_ID)):
        metrics = stamp["metrics"][key]
        served = tiny.served(model_id)
        assert metrics["path"] == str(verifier if key == "verifier" else draft)
        assert metrics["checksums"]["config.json"] == sha256(served / "config.json")
        assert metrics["bytes"] == (served / WEIGHTS).stat().st_size > 0
        assert metrics["weights"] == [{"name": WEIGHTS, "size": metrics["bytes"]}]
    assert stamp["metrics"]["verifier"]["architectures"] == ["Qwen3ForCausalLM"]
    return stamp


def files_containing(top: Path, needle: bytes) -> list[str]:
    hits = []
    for path in sorted(top.rglob("*")):
        if path.is_file() and not path.is_symlink():
            try:
                if needle in path.read_bytes():
                    hits.append(str(path))
            except OSError:
                continue
    return hits


def describe_requests(hub: FakeModelScope) -> str:
    return "\n".join(
        f"  {r.method} {r.kind:<9} {r.model_id} {r.file or ''} range={r.range} "
        f"status={r.status} sent={r.bytes_sent}{' CUT' if r.cut_short else ''}"
        for r in hub.snapshot()
    )


# -- a, b: download, then nothing --------------------------------------------------------------
def test_a_modelscope_download(
    shared_host: ModelsHost, hub: FakeModelScope, tiny: TinyModels
) -> None:
    hub.reset()
    play = shared_host.play("a-download", shared_host.modelscope_vars(hub))
    assert play.ok, f"play failed\n{play.tail()}\n{shared_host.log_file}"
    print(describe_requests(hub))

    # The runbook's layout, so a later runbook call (or vLLM with VLLM_USE_MODELSCOPE) finds it.
    verifier = shared_host.store(VERIFIER_ID)
    draft = shared_host.store(DRAFT_ID)
    assert_recorded_models(shared_host, tiny, verifier, draft)
    assert not (shared_host.cache / VERIFIER_ID).exists(), "the cache_dir= layout was used"
    for model in (verifier, draft):
        assert all((model / name).is_file() for name in MODELSCOPE_INDEX), sorted(model.iterdir())
    assert_same_files(tiny, VERIFIER_ID, verifier)
    assert_same_files(tiny, DRAFT_ID, draft)
    # Every served file was fetched once, whole, through the file endpoint.
    for model_id in (VERIFIER_ID, DRAFT_ID):
        fetched = sorted(r.file or "" for r in hub.downloads(model_id))
        assert fetched == served_files(tiny, model_id), describe_requests(hub)
        assert all(r.status in (200, 206) and not r.cut_short for r in hub.downloads(model_id))
    kinds = {r.kind for r in hub.snapshot()}
    assert kinds == {"revisions", "files", "file"}, describe_requests(hub)
    # The downloads went to specfleet_modelscope_cache, not modelscope's default cache.
    assert not shared_host.default_cache.exists()
    assert "running: no stamp from an earlier run" in play.plan()


def test_b_second_run_changes_nothing(
    shared_host: ModelsHost, hub: FakeModelScope, tiny: TinyModels
) -> None:
    if not shared_host.plays or not shared_host.plays[-1].ok:
        pytest.skip("needs a successful download play (case a) first")
    stamp_before = shared_host.stamp_file.read_bytes()
    log_before = shared_host.log_file.stat().st_mtime_ns
    hub.reset()
    play = shared_host.play_unchanged_checkout("b-again", shared_host.modelscope_vars(hub))
    assert play.ok, f"play failed\n{play.tail()}"
    assert play.changed == 0, f"changed tasks: {play.changed_tasks()}"
    assert play.plan().startswith("models: up to date, skipping"), play.plan()
    # The stamp and model_check on the stamped paths decide: modelscope is not even started,
    # so the server sees no request at all (not even the revision or file listing).
    assert hub.snapshot() == [], describe_requests(hub)
    if not any("settle" in p.label for p in shared_host.plays):
        assert shared_host.stamp_file.read_bytes() == stamp_before
        assert shared_host.log_file.stat().st_mtime_ns == log_before


# -- c: fail part-way, then resume -----------------------------------------------------------
def test_c_failure_part_way_then_resume(
    fresh_host: ModelsHost, hub: FakeModelScope, tiny: TinyModels
) -> None:
    host = fresh_host
    hub.reset()
    hub.fail_part_way(VERIFIER_ID, WEIGHTS, times=CLIENT_ATTEMPTS)
    first = host.play("c-fails-part-way", host.modelscope_vars(hub))
    print(describe_requests(hub))
    assert not first.ok, f"the play should have failed\n{first.tail()}"
    message = first.result.failure_message
    print(f"--- failure message ---\n{message}\n---")
    assert f"stage {STAGE} failed on {HOST}" in message
    assert f"log: {host.log_file}" in message
    assert f"re-run by hand: bash {host.script}" in message
    assert f"download of {VERIFIER_ID}@master failed: FileDownloadError" in message
    assert "1 file(s) failed to download" in message
    # modelscope's own reason, from the log tail
    assert "IncompleteRead" in message
    assert not host.stamp_file.exists(), "a failed stage must not be stamped"

    # What the client did: every file of the draft once; the verifier's weights on
    # CLIENT_ATTEMPTS requests, each cut short, resuming from the bytes it had kept.
    weights = hub.downloads(VERIFIER_ID, WEIGHTS)
    assert len(weights) == CLIENT_ATTEMPTS and all(r.cut_short for r in weights)
    assert hub.pending_failures() == {}
    assert sorted(r.file or "" for r in hub.downloads(DRAFT_ID)) == served_files(tiny, DRAFT_ID)
    partial = host.cache / RUNBOOK_STORE / MODELSCOPE_TEMP / VERIFIER_ID / WEIGHTS
    full_size = (tiny.served(VERIFIER_ID) / WEIGHTS).stat().st_size
    assert partial.is_file() and 0 < partial.stat().st_size < full_size
    partial_size = partial.stat().st_size
    print(f"partial {WEIGHTS} kept: {partial_size} of {full_size} bytes")

    hub.reset()
    second = host.play("c-resumes", host.modelscope_vars(hub))
    print(describe_requests(hub))
    assert second.ok, f"play failed\n{second.tail()}"
    verifier, draft = host.store(VERIFIER_ID), host.store(DRAFT_ID)
    assert_recorded_models(host, tiny, verifier, draft)
    assert_same_files(tiny, VERIFIER_ID, verifier)
    assert_same_files(tiny, DRAFT_ID, draft)
    # modelscope kept the completed files: the draft is listed again but not downloaded,
    # and of the verifier only the broken file is fetched, from where the partial file ended.
    assert hub.downloads(DRAFT_ID) == [], describe_requests(hub)
    resumed = hub.downloads(VERIFIER_ID)
    assert [r.file for r in resumed] == [WEIGHTS], describe_requests(hub)
    assert resumed[0].range == f"bytes={partial_size}-{full_size - 1}"
    assert resumed[0].bytes_sent == full_size - partial_size
    assert not partial.exists()


# -- d: the token is never logged -------------------------------------------------------------
def test_d_token_not_logged(fresh_host: ModelsHost, hub: FakeModelScope, tiny: TinyModels) -> None:
    host = fresh_host
    hub.reset()
    play = host.play("d-token", host.modelscope_vars(hub, models_modelscope_token=TOKEN))
    assert play.ok, f"play failed\n{play.tail()}"
    assert_recorded_models(host, tiny, host.store(VERIFIER_ID), host.store(DRAFT_ID))

    assert TOKEN not in play.result.stdout
    assert TOKEN not in json.dumps(play.result.events)
    assert TOKEN not in host.stamp_file.read_text()
    assert files_containing(host.root, TOKEN.encode()) == []
    assert files_containing(host.cache, TOKEN.encode()) == []
    # Whether modelscope sent the token to the endpoint (reported, not required): 1.37.0 puts
    # it in an m_session_id cookie scoped to its default domain, not to `endpoint`.
    sent = [
        r for r in hub.snapshot() if TOKEN in (r.authorization or "") or TOKEN in (r.cookie or "")
    ]
    print(f"token sent to the endpoint on {len(sent)} of {len(hub.snapshot())} requests")


# -- e: local directories --------------------------------------------------------------------
def test_e_local_source(
    fresh_host: ModelsHost, hub: FakeModelScope, tiny: TinyModels, tmp_path: Path
) -> None:
    host = fresh_host
    local = tmp_path / "local-models"
    verifier = shutil.copytree(tiny.verifier, local / "verifier")
    draft = shutil.copytree(tiny.draft, local / "draft")
    extravars = {
        "models_source": "local",
        "models_local_verifier_path": str(verifier),
        "models_local_draft_path": str(draft),
    }
    hub.reset()
    first = host.play("e-local", extravars)
    assert first.ok, f"play failed\n{first.tail()}"
    assert hub.snapshot() == [], describe_requests(hub)
    assert_recorded_models(host, tiny, verifier, draft)
    assert not host.script.exists(), "the local source runs no stage script"
    stamp_before = host.stamp_file.read_bytes()

    weights = verifier / WEIGHTS
    size = weights.stat().st_size
    with weights.open("r+b") as handle:
        handle.truncate(size // 2)
    second = host.play("e-local-truncated", extravars)
    assert not second.ok, f"the play should have failed\n{second.tail()}"
    print(f"plan: {second.plan()}")
    failures = second.failed_results()
    text = "\n".join(f"{f.get('msg', '')}\n{f.get('stderr', '')}" for f in failures)
    print(f"--- failure ---\n{text}\n---")
    assert any(f.get("task") == "Check both models" for f in failures), failures
    assert str(weights) in text and "truncated" in text
    assert f"artifacts no longer valid: model_check: {weights}" in second.plan()
    assert host.stamp_file.read_bytes() == stamp_before, "a failed check must not re-stamp"


# -- f, g: downloads already in the cache are used ---------------------------------------------
def modelscope_download(
    venv: Path, hub: FakeModelScope, model_id: str, home: Path, cache_dir: Path | None = None
) -> Path:
    """modelscope's own snapshot_download(model_id), run as a user would: the runbook's call
    (no cache_dir, HOME=home, MODELSCOPE_CACHE unset), or with cache_dir= as older specfleet
    releases called it. Only the endpoint is added (the fake hub)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODELSCOPE_")}
    env |= {"HOME": str(home), "MODELSCOPE_CREDENTIALS_PATH": str(home / "credentials")}
    call = "snapshot_download(sys.argv[1], endpoint=sys.argv[2]" + (
        ", cache_dir=sys.argv[3])" if cache_dir else ")"
    )
    proc = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            f"import sys; from modelscope import snapshot_download; print({call})",
            model_id,
            hub.url,
            *([str(cache_dir)] if cache_dir else []),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 0, f"snapshot_download({model_id}) failed\n{proc.stderr[-3000:]}"
    return Path(proc.stdout.strip().splitlines()[-1])


def file_identities(tiny: TinyModels, model_id: str, local: Path) -> dict[str, tuple[int, int]]:
    """(inode, mtime) of each served file's local copy: unchanged when it was not fetched again."""
    return {
        rel: ((local / rel).stat().st_ino, (local / rel).stat().st_mtime_ns)
        for rel in served_files(tiny, model_id)
    }


# A host that followed the runbook by hand, its downloads reused: in make test-reliability's
# budget.
@pytest.mark.slow
def test_f_runbook_download_is_reused(
    fresh_host: ModelsHost, hub: FakeModelScope, tiny: TinyModels, venv: Path
) -> None:
    host = fresh_host
    home = host.tmp / "home"
    hub.reset()
    seeded = {m: modelscope_download(venv, hub, m, home) for m in (DRAFT_ID, VERIFIER_ID)}
    # Where the runbook's call put them: the layout the role must share.
    host.cache = home / RUNBOOK_CACHE
    assert seeded == {m: host.store(m) for m in (DRAFT_ID, VERIFIER_ID)}, seeded
    for model_id, path in seeded.items():
        assert_same_files(tiny, model_id, path)
        assert all((path / name).is_file() for name in MODELSCOPE_INDEX), sorted(path.iterdir())
    before = {m: file_identities(tiny, m, p) for m, p in seeded.items()}

    hub.reset()
    play = host.play("f-runbook-cache", host.modelscope_vars(hub))
    print(describe_requests(hub))
    assert play.ok, f"play failed\n{play.tail()}\n{host.log_file}"
    # modelscope checks the revision and the file list, and fetches nothing.
    assert hub.downloads() == [], describe_requests(hub)
    assert_recorded_models(host, tiny, seeded[VERIFIER_ID], seeded[DRAFT_ID])
    assert {m: file_identities(tiny, m, p) for m, p in seeded.items()} == before
    assert not (host.cache / VERIFIER_ID).exists(), "a second copy in the cache_dir= layout"


# The move of an older specfleet release's cache layout: in make test-reliability's budget.
@pytest.mark.slow
def test_g_older_specfleet_copy_moves_to_the_runbook_layout(
    fresh_host: ModelsHost, hub: FakeModelScope, tiny: TinyModels, venv: Path
) -> None:
    host = fresh_host
    hub.reset()
    legacy = {
        m: modelscope_download(venv, hub, m, host.tmp / "home", cache_dir=host.cache)
        for m in (DRAFT_ID, VERIFIER_ID)
    }
    assert legacy == {m: host.cache / m for m in (DRAFT_ID, VERIFIER_ID)}, legacy
    before = {m: file_identities(tiny, m, p) for m, p in legacy.items()}

    hub.reset()
    play = host.play("g-legacy-cache", host.modelscope_vars(hub))
    print(describe_requests(hub))
    assert play.ok, f"play failed\n{play.tail()}\n{host.log_file}"
    assert hub.downloads() == [], describe_requests(hub)
    verifier, draft = host.store(VERIFIER_ID), host.store(DRAFT_ID)
    assert_recorded_models(host, tiny, verifier, draft)
    # Moved (same inodes), not copied, and no second copy left behind.
    assert {m: file_identities(tiny, m, host.store(m)) for m in legacy} == before
    assert not any(p.exists() for p in legacy.values()), legacy


# -- h: the disk preflight measures the cache's filesystem --------------------------------------
def other_filesystem(than: Path) -> Path | None:
    """A writable tmpfs on another filesystem than `than` (/dev/shm on Linux), if there is one."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK) and shm.stat().st_dev != than.stat().st_dev:
        return shm
    return None


# "shared" (the cache on the work root's filesystem) is the disk preflight test_failures runs
# in CI; it is in make test-reliability's budget here, "separate" stays.
@pytest.mark.parametrize("where", [pytest.param("shared", marks=pytest.mark.slow), "separate"])
def test_h_disk_preflight_measures_the_cache(
    fresh_host: ModelsHost, hub: FakeModelScope, tiny: TinyModels, where: str
) -> None:
    host = fresh_host
    cleanup = None
    if where == "separate":
        base = other_filesystem(host.tmp)
        if base is None:
            pytest.skip("no writable tmpfs on another filesystem than the test's tmp dir")
        cleanup = Path(tempfile.mkdtemp(prefix="specfleet-cache-", dir=base))
        host.cache = cleanup / "hub"
    try:
        hub.reset()
        play = host.play(
            f"h-disk-{where}",
            host.modelscope_vars(hub, specfleet_models_disk_required_gb={"cpu": 99999, "npu": 1}),
        )
        assert not play.ok, f"the play should have failed\n{play.tail()}"
        message = play.result.failure_message
        print(f"--- failure message ---\n{message}\n---")
        assert hub.snapshot() == [], describe_requests(hub)
        assert not host.script.exists(), "the models stage must not start"
        for expected in (
            "preflight disk",
            str(host.cache),
            "specfleet_modelscope_cache",
            "99999 GB",
            "specfleet_models_disk_required_gb.cpu",
        ):
            assert expected in message, (expected, message)
        # One name per setting: no role-level alias is offered (there is none to set).
        for alias in ("for this role alone", "fleet-wide specfleet_modelscope_cache"):
            assert alias not in message, (alias, message)
        if where == "shared":
            # One filesystem holds both: the work root's need is added to the models'.
            assert f"specfleet_root={host.root}" in message, message
            assert "specfleet_disk_required_gb.cpu" in message, message
        else:
            # The work root's filesystem has room: only the cache is blamed.
            assert "specfleet_root" not in message, message
    finally:
        if cleanup:
            shutil.rmtree(cleanup, ignore_errors=True)
