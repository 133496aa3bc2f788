"""Validation is never greener than the truth: playbooks/validate.yml ALONE, on a finished CPU
pipeline, runs every stage's verifier (checks/stage_verify.py, the code begin.yml runs for the
skip decision) and turns the host red naming the stage, for each break a re-run would redo:

  A. (one validate run, four stages) the verifier's chat template edited (models), data's
     row count edited in its stamp (data), a hidden-states file truncated (hidden_states),
     the trained draft's model.safetensors emptied (train);
  B. after `--tags train -e train_epochs=2`, serve's stamp names the old train run: the report
     shows serve `stale` and the host not green;
  C. a serve-only run with `-e serve_num_speculative_tokens=3`: the report prints 3 (the value
     the host ran with, from serve's stamp), not the fleet default;
  D. (one validate run, two stages) a verifier shard deleted (models), a hidden-states file
     deleted (hidden_states).
After A and D, one site.yml run redoes the damaged stages and only what depends on them, and
validate.yml is green again.
  E. data_source: file end to end;
  F. serve_mode service: left serving, kept by a no-op run (same pid; the artifact suite's
     pass kept too, and run again when the env wrapper loses its execute bit, which it finds,
     and when the work root is made world-writable, which the validation sets right and says),
     back after a kill, stopped by playbooks/stop-serving.yml and deployed again by the next
     run, redeployed when train_epochs changes.

One work root (module scope), primed by a complete run; reuses the CPU venv of `make run`
(.work/local/venv) and runs the servers on 18400 (serve) / 18401 (hidden states). Marked slow
(it runs the CPU pipeline three times): `make test-reliability`, or
    SPECFLEET_SLOW_TESTS=1 .venv/bin/python -m pytest -q -s tests/integration/test_validation.py
SPECFLEET_VALIDATION_DIR=<dir> keeps the work root there across sessions.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import pytest
from siteruns import HOST, Run, port_free, run_playbook, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SITE = REPO / "site.yml"
VALIDATE = REPO / "playbooks" / "validate.yml"
INVENTORY = REPO / "inventory" / "local.yml"
ANSIBLE_PLAYBOOK = REPO / ".venv" / "bin" / "ansible-playbook"
CPU_VENV = REPO / ".work" / "local" / "venv"
SERVE_PORT = 18400
HIDDEN_STATES_PORT = 18401
DATA_PORT = 18402
STAGES = ("speculators_install", "models", "convert", "data", "hidden_states", "train", "serve")
RUN_TIMEOUT_S = 2400
TIMINGS: list[tuple[str, float, str]] = []


class Pipeline:
    """localhost as a CPU-profile host with its own work root, ports and reports."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.root = base / "root"
        self.count = 0

    @property
    def state(self) -> Path:
        return self.root / "state"

    def play(
        self,
        label: str,
        playbook: Path = SITE,
        tags: Optional[str] = None,
        **extra: Any,
    ) -> Run:
        self.count += 1
        reports = self.base / f"reports-{self.count:02d}-{label}"
        extravars = {
            "specfleet_root": str(self.root),
            "specfleet_venv": str(CPU_VENV),
            "specfleet_hidden_states_port": HIDDEN_STATES_PORT,
            "specfleet_data_port": DATA_PORT,
            "specfleet_serve_port": SERVE_PORT,
            "stage_poll_delay_s": 2,
            # The greedy comparison against the plain verifier is a second vLLM start per
            # serve run; test_failures covers it.
            "serve_check_lossless": False,
            "specfleet_reports_dir": str(reports),
            **extra,
        }
        argv = [str(ANSIBLE_PLAYBOOK), str(playbook), "-i", str(INVENTORY)]
        argv += ["-e", json.dumps(extravars), *(["--tags", tags] if tags else [])]
        t0 = time.monotonic()
        done = run_playbook(argv, RUN_TIMEOUT_S)
        run = Run(label, done.returncode, done.stdout, time.monotonic() - t0, reports)
        (self.base / f"{label}.log").write_text(done.stdout)
        TIMINGS.append((label, run.seconds, f"rc={run.rc}"))
        print(f"\n[{label}] rc={run.rc} {run.seconds:.1f}s", flush=True)
        return run

    def validate(self, label: str) -> Run:
        # The artifact suite is left out: the stage verifier alone must find every break.
        return self.play(label, VALIDATE, validate_artifact_tests=False)

    def stamps(self) -> dict[str, dict[str, Any]]:
        return {s: json.loads((self.state / f"{s}.json").read_text()) for s in STAGES}

    def redone(self, before: dict[str, dict[str, Any]]) -> set[str]:
        after = self.stamps()
        return {s for s in STAGES if after[s]["run_id"] != before[s]["run_id"]}

    def hidden_states_files(self) -> list[Path]:
        top = Path(self.stamps()["hidden_states"]["artifacts"]["hidden_states"])
        files = sorted(top.glob("hs_*.safetensors"))
        assert files, "no hidden-states files"
        return files


def stages_of(run: Run) -> dict[str, dict[str, Any]]:
    return run.host()["stages"]


def assert_red(run: Run, damaged: dict[str, str]) -> None:
    """validate.yml failed the host, and exactly the `damaged` stages are reported damaged,
    each naming what (the substring given)."""
    assert run.rc != 0, f"[{run.label}] validate passed\n{run.tail()}"
    fleet = run.fleet()
    host = run.host()
    assert fleet["green"] is False and host["green"] is False, host["stages"]
    stages = stages_of(run)
    found = {s for s, r in stages.items() if r["status"] == "damaged"}
    assert found == set(damaged), {s: (r["status"], r["detail"]) for s, r in stages.items()}
    for stage, what in damaged.items():
        assert what in stages[stage]["detail"], stages[stage]
        assert f"{stage} damaged" in host["not_green_reason"], host["not_green_reason"]
    # The play's failure names the stages too.
    for stage in damaged:
        assert stage in run.text.split("is not green:", 1)[-1], run.tail()
    md = (run.reports / "latest" / "fleet.md").read_text()
    assert "NOT GREEN" in md and all(f"{s} damaged" in md for s in damaged), md[:2000]


def assert_validate_green(pipeline: Pipeline, label: str) -> None:
    run = pipeline.validate(label)
    assert run.rc == 0, run.tail()
    assert run.fleet()["green"] is True, stages_of(run)
    assert all(r["status"] == "passed" for r in stages_of(run).values()), stages_of(run)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    if not ANSIBLE_PLAYBOOK.exists():
        pytest.skip(f"{ANSIBLE_PLAYBOOK.relative_to(REPO)} missing (run `make setup`)")
    if not (CPU_VENV / "bin" / "python").exists():
        pytest.skip(f"{CPU_VENV.relative_to(REPO)} missing (the CPU venv: `make run` builds it)")
    for port in (SERVE_PORT, HIDDEN_STATES_PORT):
        if not port_free(port):
            pytest.fail(f"port {port} is in use on 127.0.0.1; these tests run the servers there")
    configured = os.environ.get("SPECFLEET_VALIDATION_DIR")
    base = Path(configured) if configured else tmp_path_factory.mktemp("specfleet-validation")
    base.mkdir(parents=True, exist_ok=True)
    for old in base.glob("reports-*"):
        shutil.rmtree(old)
    started = time.monotonic()
    yield Pipeline(base)
    print("\n\ntest_validation runs:", flush=True)
    for label, seconds, note in TIMINGS:
        print(f"  {label:<32} {seconds:7.1f}s  {note}")
    print(f"  {'module total':<32} {time.monotonic() - started:7.1f}s", flush=True)


@pytest.fixture(scope="module")
def primed(pipeline: Pipeline) -> Pipeline:
    """A complete root whose stamps list their files and their checkers."""
    pipeline.play("prime").assert_green()
    for stage, stamp in pipeline.stamps().items():
        assert stamp.get("manifest"), f"{stage}: the stamp lists no files"
        assert stamp.get("verify_argv"), f"{stage}: the stamp records no checker"
    return pipeline


def test_a_four_breaks_red_then_redone(primed: Pipeline):
    stamps = primed.stamps()
    verifier = Path(stamps["models"]["artifacts"]["verifier"])
    # transformers 5 saves the template beside tokenizer_config.json (chat_template.jinja);
    # older tokenizers keep it in tokenizer_config.json's "chat_template".
    tok = verifier / "tokenizer_config.json"
    config = json.loads(tok.read_text())
    if "chat_template" in config:
        config["chat_template"] += "{# edited #}"
        tok.write_text(json.dumps(config, indent=2))
        template = tok
    else:
        template = verifier / "chat_template.jinja"
        assert template.is_file(), f"no chat template in {verifier}"
        template.write_text(template.read_text() + "{# edited #}")

    data = primed.state / "data.json"
    data_stamp = json.loads(data.read_text())
    # As many as the data source made (the CPU default regenerates answers to 960 prompts).
    rows = data_stamp["metrics"]["rows"]
    assert rows > 0, data_stamp["metrics"]
    data_stamp["metrics"]["rows"] += 1
    data.write_text(json.dumps(data_stamp, indent=4, sort_keys=True) + "\n")

    hs = primed.hidden_states_files()[0]
    with hs.open("r+b") as fh:
        fh.truncate(hs.stat().st_size // 2)

    weights = Path(stamps["train"]["artifacts"]["draft"]) / "model.safetensors"
    assert weights.is_file()
    weights.resolve().write_bytes(b"")

    run = primed.validate("a-validate-red")
    assert_red(
        run,
        {
            # the stage's own checker speaks first where it sees the break, the file list else
            "models": f"{template} has",
            "data": f"rows is {rows} in the files, {rows + 1} in the stamp",
            "hidden_states": str(hs),
            "train": "model.safetensors",
            # serve's release of the draft is hard links to train's files (serve.sh.j2):
            # the same emptied file
            "serve": "model.safetensors",
        },
    )
    # Nothing was redone by validation: it only reads.
    assert primed.stamps()["models"]["run_id"] == stamps["models"]["run_id"]

    repair = primed.play("a-repair")
    repair.assert_green()
    redone = primed.redone(stamps)
    # models redone redoes everything that depends on it; the install does not.
    assert redone == set(STAGES) - {"speculators_install"}, redone
    assert json.loads(data.read_text())["metrics"]["rows"] == stamps["data"]["metrics"]["rows"]
    assert_validate_green(primed, "a-validate-green")


def test_b_stale_serve_after_retraining(primed: Pipeline):
    before = primed.stamps()
    run = primed.play("b-train-epochs-2", tags="train", train_epochs=2)
    assert run.rc == 0, run.tail()
    after = primed.stamps()
    assert after["train"]["run_id"] != before["train"]["run_id"]
    assert after["serve"]["run_id"] == before["serve"]["run_id"]
    for report in (run, primed.validate("b-validate")):
        host = report.host()
        serve = host["stages"]["serve"]
        assert serve["status"] == "stale", serve
        assert f"train run {before['train']['run_id']}" in serve["detail"], serve
        assert host["green"] is False and report.fleet()["green"] is False
        assert "serve stale" in host["not_green_reason"], host["not_green_reason"]
        assert host["stages"]["train"]["status"] == "passed", host["stages"]["train"]


def test_c_report_shows_effective_num_speculative_tokens(primed: Pipeline):
    run = primed.play("c-serve-tokens-3", tags="serve", serve_num_speculative_tokens=3)
    assert run.rc == 0, run.tail()
    host = run.host()
    assert host["stages"]["serve"]["status"] == "passed", host["stages"]["serve"]
    assert host["settings"]["num_speculative_tokens"] == 3, host["settings"]
    assert "num_speculative_tokens `3`" in (run.reports / "latest" / "fleet.md").read_text()
    # Serve now follows the retrained draft: nothing is stale, the host is green again.
    assert run.fleet()["green"] is True, host["stages"]
    validated = primed.validate("c-validate")
    assert validated.host()["settings"]["num_speculative_tokens"] == 3
    assert validated.fleet()["green"] is True, stages_of(validated)
    assert validated.host()["name"] == HOST


def test_d_deleted_shard_and_hidden_states_file_red_then_redone(primed: Pipeline):
    stamps = primed.stamps()
    verifier = Path(stamps["models"]["artifacts"]["verifier"])
    shards = sorted(verifier.glob("*.safetensors"))
    assert shards, f"no safetensors in {verifier}"
    shards[-1].unlink()
    hs = primed.hidden_states_files()[-1]
    hs.unlink()

    run = primed.validate("d-validate-red")
    assert_red(
        run,
        # the checkers see both: model_check finds no weights, hs_check one file too few
        {"models": shards[-1].name, "hidden_states": "hs_*.safetensors files, expected"},
    )

    repair = primed.play("d-repair")
    repair.assert_green()
    assert primed.redone(stamps) == set(STAGES) - {"speculators_install"}
    assert shards[-1].is_file() and hs.is_file()
    assert_validate_green(primed, "d-validate-green")


def test_e_data_from_a_jsonl_file_is_pushed_stamped_and_kept(primed: Pipeline, tmp_path: Path):
    """data_source: file end to end (every other run trains on the smoke chats): the file is
    pushed to the host, its conversations become the dataset, the stamp records the file's
    checksum, and the same file again changes nothing."""
    chats = tmp_path / "chats.jsonl"
    rows = [
        {
            "conversations": [
                {"role": "user", "content": f"question {i}: what comes after {i}?"},
                {"role": "assistant", "content": f"{i + 1} comes after {i}."},
            ]
        }
        for i in range(4)
    ]
    chats.write_text("".join(json.dumps(row) + "\n" for row in rows))
    file_vars = {"data_source": "file", "data_input_file": str(chats)}
    before = primed.stamps()

    run = primed.play("e-data-file", tags="data", **file_vars)
    assert run.rc == 0, run.tail()
    assert "data" in run.started_stages(), run.tail()
    data = primed.stamps()["data"]
    assert data["run_id"] != before["data"]["run_id"]
    assert data["inputs"]["source"] == "file", data["inputs"]
    assert data["inputs"]["input_sha256"] == hashlib.sha256(chats.read_bytes()).hexdigest()
    assert data["metrics"]["rows"] == len(rows), data["metrics"]
    assert (primed.root / "data" / "input.jsonl").read_bytes() == chats.read_bytes()

    again = primed.play("e-data-file-again", tags="data", **file_vars)
    assert again.rc == 0, again.tail()
    assert again.started_stages() == [], again.started_stages()
    assert primed.stamps()["data"]["run_id"] == data["run_id"]


def service_state(root: Path) -> dict[str, Any]:
    """The serve service as specfleet's own helper reports it (pid, restarts, health)."""
    done = subprocess.run(
        [
            str(CPU_VENV / "bin" / "python"),
            "-m",
            "specfleet_helpers.host.service",
            "status",
            "--name=serve",
            f"--run-dir={root / 'run'}",
        ],
        env={**os.environ, "PYTHONPATH": str(REPO / "python_helpers")},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout)


def health(port: int) -> int:
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://127.0.0.1:{port}/health", timeout=5) as resp:
            return resp.status
    except OSError:
        return 0


def test_f_service_left_serving_kept_by_a_no_op_back_after_a_kill_redeployed_on_change(
    primed: Pipeline,
):
    """serve_mode service on the local profile (specfleet's own supervisor: no systemd here):
    the endpoint answers after the run; a no-op run keeps the same server process; a killed
    server is back within the restart delay and a server start; a changed train_epochs
    retrains and redeploys; playbooks/stop-serving.yml stops it, and the next run deploys it
    again without redoing anything else."""
    service_vars = {"serve_mode": "service", "serve_service_restart_delay_s": 2}
    try:
        run = primed.play("f-service", **service_vars)
        run.assert_green()
        assert health(SERVE_PORT) == 200
        first = service_state(primed.root)
        assert first["manager"] == "specfleet" and first["running"] and first["restarts"] == 0
        assert primed.stamps()["serve"]["inputs"]["mode"] == "service"

        before = primed.stamps()
        again = primed.play("f-service-no-op", **service_vars)
        again.assert_green()
        assert primed.redone(before) == set() and " changed=0 " in again.text
        assert service_state(primed.root)["main_pid"] == first["main_pid"]
        # Nothing the artifact suite reads changed (the service's log aside): the pass of the
        # run before stands, named in the report.
        kept = again.host()["artifact_tests"]
        assert kept["reused_from"] == run.fleet()["report_id"] and kept["failed"] == 0, kept

        # A change no stage's verifier looks at: the suite runs again, and finds it.
        wrapper = primed.root / "run" / "specfleet-env"
        wrapper.chmod(0o640)
        try:
            broken = primed.play("f-wrapper-not-executable", VALIDATE)
        finally:
            wrapper.chmod(0o750)
        tests = broken.host()["artifact_tests"]
        assert broken.rc != 0 and tests["reused_from"] is None, (tests, broken.tail())
        # (the other tests that run commands through the wrapper fail with it)
        assert "test_env_wrapper_runs_commands" in [f["test"] for f in tests["failures"]], tests
        # The work root made writable by others: the validation sets the mode again, says so,
        # and the suite runs again on the repaired root.
        primed.root.chmod(primed.root.stat().st_mode | 0o002)
        opened = primed.play("f-root-world-writable", VALIDATE)
        assert not primed.root.stat().st_mode & 0o002
        tests = opened.host()["artifact_tests"]
        assert opened.rc == 0 and tests["reused_from"] is None, (tests, opened.tail())
        assert any(str(primed.root) in w for w in opened.host()["summary"]["warnings"])

        os.kill(first["main_pid"], 9)
        back = wait_for(
            "the killed server back on /health",
            lambda: (
                (s := service_state(primed.root))["healthy"]
                and s["main_pid"] != first["main_pid"]
                and s
            ),
            timeout_s=300,
            every_s=2,
        )
        assert back["restarts"] == 1, back
        # A restart by the supervisor is no reason to redeploy: the next run reports it as it is.
        after_kill = primed.play("f-service-after-kill", **service_vars)
        after_kill.assert_green()
        assert primed.redone(before) == set()
        # The supervisor recorded the restart in the work root: the suite ran again.
        assert after_kill.host()["artifact_tests"]["reused_from"] is None
        assert service_state(primed.root)["main_pid"] == back["main_pid"]

        stop = primed.play("f-stop-serving", playbook=REPO / "playbooks" / "stop-serving.yml")
        assert stop.rc == 0, stop.tail()
        assert health(SERVE_PORT) == 0 and port_free(SERVE_PORT)
        assert service_state(primed.root)["deployed"] is False

        back_again = primed.play("f-service-redeploy", **service_vars)
        back_again.assert_green()
        assert primed.redone(before) == {"serve"}
        assert "the 'serve' service is not deployed" in back_again.text
        assert health(SERVE_PORT) == 200
        redeployed = service_state(primed.root)

        # Last: train_epochs changed with train forced too, a run the artifact suite holds green.
        before = primed.stamps()
        retrain = primed.play(
            "f-service-epochs", train_epochs=3, specfleet_force_stages=["train"], **service_vars
        )
        retrain.assert_green()
        assert primed.redone(before) == {"train", "serve"}
        retrained = service_state(primed.root)
        assert retrained["supervisor_pid"] != redeployed["supervisor_pid"]
        assert retrained["healthy"] and retrained["restarts"] == 0
    finally:
        primed.play("f-stop-serving-end", playbook=REPO / "playbooks" / "stop-serving.yml")


def zeroed_copy(draft: Path, out: Path) -> Path:
    """A DFlash draft broken on purpose: the same files with every weight zeroed, so it
    proposes one token whatever it is asked (the acceptance a draft whose lm_head is lost
    shows, vllm-ascend #11374)."""
    shutil.copytree(draft, out)
    code = (
        "import sys; from safetensors.torch import load_file, save_file;"
        "p = sys.argv[1]; t = load_file(p);"
        "save_file({k: v.zero_() for k, v in t.items()}, p, metadata={'format': 'pt'})"
    )
    for weights in out.glob("*.safetensors"):
        subprocess.run([str(CPU_VENV / "bin" / "python"), "-c", code, str(weights)], check=True)
    return out


def test_g_floors_turn_a_broken_yardstick_red_naming_it_and_pass_the_trained_draft(
    primed: Pipeline,
):
    """serve_floors on the CPU profile: the yardstick slot given a draft broken on purpose
    (zeroed weights) falls below its floor, and the host goes red naming the figure, the floor
    and the draft; the trained draft passes its own floor in the same run. The same floors with
    a good draft in the yardstick slot (the trained one: the CPU profile's own yardstick, the
    synthesized draft, is random) are green."""
    trained = Path(primed.stamps()["train"]["artifacts"]["draft"])
    broken = zeroed_copy(trained, primed.base / "broken-draft")
    floors = {"yardstick.mean_acceptance_length": 1.2, "trained.mean_acceptance_length": 1.3}
    run = primed.play(
        "g-broken-yardstick", tags="serve", serve_floors=floors,
        serve_yardstick_draft=str(broken), specfleet_force_stages=["serve"],
    )  # fmt: skip
    assert run.rc != 0, run.tail()
    serve = stages_of(run)["serve"]
    assert serve["status"] == "failed", serve
    said = serve["error"] or serve["detail"]
    assert (
        f"the yardstick (the converted pretrained draft) ({broken}): mean acceptance length" in said
    )
    assert "is below its floor 1.2 (serve_floors, the cpu profile's)" in said, said
    assert "the trained draft" not in said, said
    # The run's figures are there even so (the failed stage leaves no stamp): the trained draft
    # passed its floor, the yardstick did not.
    result = json.loads((primed.root / "serve" / "result.json").read_text())
    assert result["bench"]["trained"]["mean_acceptance_length"] >= 1.3, result["bench"]["trained"]
    green = primed.play(
        "g-floors-green", tags="serve", serve_floors=floors, serve_yardstick_draft=str(trained)
    )
    assert green.rc == 0, green.tail()
    assert green.fleet()["green"] is True, stages_of(green)
