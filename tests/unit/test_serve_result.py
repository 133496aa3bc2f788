"""Tests for specfleet_helpers.stages.serve_result: combine the serve checks into result.json and
verify it, including the API key check (a server with a key must have refused a request
without it)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from procutil import run_helper
from specfleet_helpers.stages import serve_result

CHAT = {"ok": True, "content": "hi there", "completion_tokens": 8, "finish_reason": "length"}
METRICS = {
    "ok": True,
    "num_drafts": 5.0,
    "num_draft_tokens": 15.0,
    "num_accepted_tokens": 3.0,
    "acceptance_rate": 0.2,
    "mean_acceptance_length": 1.6,
}
AUTH_OK = {
    "ok": True,
    "api_key_enforced": True,
    "path": "/v1/chat/completions",
    "without_key": 401,
    "wrong_key": 401,
}


def write(path: Path, data: dict[str, Any]) -> Path:
    # As the serve script leaves them: the check's progress, then its JSON line last.
    path.write_text("noise\n" + json.dumps(data) + "\n")
    return path


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return run_helper("specfleet_helpers.stages.serve_result", *args, timeout=60)


@pytest.fixture
def checks(tmp_path: Path) -> dict[str, Path]:
    return {
        "chat": write(tmp_path / "chat.json", CHAT),
        "metrics": write(tmp_path / "metrics.json", METRICS),
        "auth": write(tmp_path / "auth.json", AUTH_OK),
        "out": tmp_path / "result.json",
    }


def test_without_a_key_nothing_is_required_and_enforcement_is_recorded_false(checks):
    serve_result.combine(checks["chat"], checks["metrics"], None, None, checks["out"])
    summary = serve_result.verify(checks["out"], 8, require_lossless=False)
    assert summary["api_key_enforced"] is False
    assert summary["completion_tokens"] == 8
    with pytest.raises(ValueError, match="did not refuse a request without its API key: no check"):
        serve_result.verify(checks["out"], 8, require_lossless=False, require_api_key=True)


def test_a_refused_request_is_recorded_and_passes(checks):
    combined = serve_result.combine(
        checks["chat"], checks["metrics"], None, None, checks["out"], auth=checks["auth"]
    )
    assert combined["auth"] == AUTH_OK
    summary = serve_result.verify(checks["out"], 8, False, require_api_key=True)
    assert summary["api_key_enforced"] is True


def test_an_unenforced_key_fails_verify_with_the_check_error(checks, tmp_path):
    bad = {
        "ok": False,
        "api_key_enforced": False,
        "without_key": 200,
        "wrong_key": 200,
        "error": "the server does not enforce its API key: POST ... -> HTTP 200, expected 401",
    }
    serve_result.combine(
        checks["chat"],
        checks["metrics"],
        None,
        None,
        checks["out"],
        auth=write(tmp_path / "bad.json", bad),
    )
    assert serve_result.verify(checks["out"], 8, False)["api_key_enforced"] is False
    with pytest.raises(ValueError, match="does not enforce its API key"):
        serve_result.verify(checks["out"], 8, False, require_api_key=True)


def test_cli_combine_and_verify_with_require_api_key(checks):
    args = ["--chat", str(checks["chat"]), "--metrics", str(checks["metrics"])]
    assert run_cli("combine", *args, "--out", str(checks["out"])).returncode == 0
    verify = ["verify", "--result", str(checks["out"]), "--max-tokens", "8"]
    plain = run_cli(*verify)
    assert plain.returncode == 0, plain.stderr
    assert json.loads(plain.stdout)["api_key_enforced"] is False
    required = run_cli(*verify, "--require-api-key")
    assert required.returncode == 1
    assert "did not refuse a request without its API key" in required.stderr

    combined = run_cli("combine", *args, "--auth", str(checks["auth"]), "--out", str(checks["out"]))
    assert combined.returncode == 0, combined.stderr
    passed = run_cli(*verify, "--require-api-key")
    assert passed.returncode == 0, passed.stderr
    assert json.loads(passed.stdout)["api_key_enforced"] is True


def test_verify_still_checks_the_smoke_completion(checks, tmp_path):
    short = write(
        tmp_path / "short.json", {**CHAT, "finish_reason": "stop", "completion_tokens": 3}
    )
    serve_result.combine(short, checks["metrics"], None, None, checks["out"], auth=checks["auth"])
    with pytest.raises(ValueError, match=r"finish_reason is .stop.*completion_tokens is 3"):
        serve_result.verify(checks["out"], 8, False, require_api_key=True)


# --- the plain verifier's greedy outputs, kept between serve runs ---------------------------

GREEDY = {"ok": True, "outputs": [{"prompt": "Hello", "text": " a b", "token_ids": [3, 4]}]}
IDENTITY = {"install": "run-1", "prompts": ["Hello"], "max_tokens": 16}


def models_stamp(tmp_path: Path) -> tuple[Path, Path]:
    verifier = tmp_path / "models" / "verifier"
    files = {
        f"{verifier}/config.json": {"sha256": "c0" * 32, "size": 900},
        f"{verifier}/model.safetensors": {"sha256": "aa" * 32, "size": 2_000_000},
        f"{verifier}-shards/model-00001.safetensors": {"size": 16},  # another directory
        f"{tmp_path}/models/draft/model.safetensors": {"sha256": "dd" * 32, "size": 10},
    }
    stamp = tmp_path / "models.json"
    inputs = {"source": "modelscope", "modelscope": {"verifier": "Qwen/Qwen3-8B"}}
    stamp.write_text(
        json.dumps({"stage": "models", "inputs": inputs, "manifest": {"files": files}})
    )
    return stamp, verifier


def test_reference_key_is_the_verifiers_recorded_files_and_the_identity(tmp_path):
    stamp, verifier = models_stamp(tmp_path)
    key = serve_result.reference_key(stamp, verifier, IDENTITY)
    assert key == serve_result.reference_key(stamp, Path(f"{verifier}/"), IDENTITY)
    assert key != serve_result.reference_key(stamp, verifier, {**IDENTITY, "install": "run-2"})
    assert key != serve_result.reference_key(stamp, verifier, {**IDENTITY, "max_tokens": 8})
    # The same verifier directory with other weights: another key.
    retrained = json.loads(stamp.read_text())
    retrained["manifest"]["files"][f"{verifier}/model.safetensors"]["sha256"] = "bb" * 32
    other_weights = tmp_path / "models-other.json"
    other_weights.write_text(json.dumps(retrained))
    assert key != serve_result.reference_key(other_weights, verifier, IDENTITY)
    # Another origin, or the models stage redone after another install: only the origin counts.
    elsewhere = json.loads(stamp.read_text())
    elsewhere["inputs"]["modelscope"]["revision"] = "v2"
    other_weights.write_text(json.dumps(elsewhere))
    assert key != serve_result.reference_key(other_weights, verifier, IDENTITY)
    rerun = json.loads(stamp.read_text())
    rerun["inputs"].update(upstream={"speculators_install": "r2"}, script_sha256="ff" * 32)
    other_weights.write_text(json.dumps(rerun))
    assert key == serve_result.reference_key(other_weights, verifier, IDENTITY)
    # The draft, and a directory that only shares the verifier's name prefix, are not in it.
    only_verifier = json.loads(stamp.read_text())
    only_verifier["manifest"]["files"] = {
        k: v for k, v in only_verifier["manifest"]["files"].items() if k.startswith(f"{verifier}/")
    }
    stamp.write_text(json.dumps(only_verifier))
    assert key == serve_result.reference_key(stamp, verifier, IDENTITY)


def test_no_key_without_recorded_verifier_files(tmp_path):
    stamp = tmp_path / "models.json"
    stamp.write_text(json.dumps({"stage": "models"}))  # an older stamp: no manifest
    assert serve_result.reference_key(stamp, tmp_path / "verifier", IDENTITY) is None
    assert (
        serve_result.take_reference(tmp_path / "kept", None, {"greedy": tmp_path / "o.json"})
        is None
    )
    assert (
        serve_result.keep_reference(tmp_path / "kept", None, {"greedy": tmp_path / "x.json"})
        is None
    )
    assert not (tmp_path / "kept").exists()


def test_kept_outputs_are_taken_by_the_same_key_only(tmp_path):
    source = write(tmp_path / "greedy_plain.json", GREEDY)
    kept = serve_result.keep_reference(tmp_path / "kept", "k1", {"greedy": source})
    assert kept == [tmp_path / "kept" / "k1.greedy.json"]
    out = tmp_path / "out.json"
    assert serve_result.take_reference(tmp_path / "kept", "k2", {"greedy": out}) is None
    assert not out.exists()
    assert serve_result.take_reference(tmp_path / "kept", "k1", {"greedy": out}) == kept
    assert serve_result.last_json(out) == GREEDY


def test_only_greedy_outputs_are_kept_never_benchmark_figures(tmp_path):
    """A speedup is measured against the plain verifier of the same round: its benchmark
    figures are not a part of the kept reference any more."""
    assert set(serve_result.REFERENCE_PARTS) == {"greedy"}
    with pytest.raises(ValueError, match="expected NAME=FILE with NAME one of greedy"):
        serve_result._parts([f"bench={tmp_path / 'b.json'}"])


def test_damaged_kept_outputs_are_dropped_not_taken(tmp_path):
    kept_dir = tmp_path / "kept"
    kept_dir.mkdir()
    (kept_dir / "k1.greedy.json").write_text('{"outputs": [')  # cut short
    assert serve_result.take_reference(kept_dir, "k1", {"greedy": tmp_path / "out.json"}) is None
    assert not (kept_dir / "k1.greedy.json").exists()
    with pytest.raises(ValueError, match="no greedy outputs"):
        serve_result.keep_reference(
            kept_dir, "k1", {"greedy": write(tmp_path / "e.json", {"outputs": []})}
        )


def reference_cli_args(tmp_path: Path) -> tuple[Path, list[str]]:
    """The verifier and the arguments take-reference and keep-reference share."""
    stamp, verifier = models_stamp(tmp_path)
    common = [
        "--dir", str(tmp_path / "kept"), "--models-stamp", str(stamp),
        "--verifier", str(verifier), "--identity", json.dumps(IDENTITY),
    ]  # fmt: skip
    return verifier, common


def test_reference_cli_take_exits_3_until_kept(tmp_path):
    _, common = reference_cli_args(tmp_path)
    out = tmp_path / "out.json"
    taken = run_cli("take-reference", *common, "--part", f"greedy={out}")
    assert taken.returncode == 3 and taken.stdout == "", taken
    source = write(tmp_path / "greedy_plain.json", GREEDY)
    kept = run_cli("keep-reference", *common, "--part", f"greedy={source}")
    assert kept.returncode == 0, kept.stderr
    taken = run_cli("take-reference", *common, "--part", f"greedy={out}")
    assert taken.returncode == 0, taken.stderr
    assert taken.stdout.strip() == kept.stdout.strip() != ""
    assert serve_result.last_json(out) == GREEDY


def test_reference_cli_keys_on_the_server_arguments(tmp_path):
    verifier, common = reference_cli_args(tmp_path)
    server = ["--", str(verifier), "--max-model-len", "512", "--enforce-eager"]
    source = write(tmp_path / "greedy_plain.json", GREEDY)
    out = tmp_path / "out.json"
    assert run_cli("keep-reference", *common, "--part", f"greedy={source}", *server).returncode == 0
    assert run_cli("take-reference", *common, "--part", f"greedy={out}", *server).returncode == 0
    other = ["--", str(verifier), "--max-model-len", "1024", "--enforce-eager"]
    assert run_cli("take-reference", *common, "--part", f"greedy={out}", *other).returncode == 3
    assert run_cli("take-reference", *common, "--part", f"greedy={out}").returncode == 3


def test_combine_records_where_the_plain_outputs_came_from(tmp_path):
    with_draft = write(tmp_path / "with_draft.json", GREEDY)
    plain = write(tmp_path / "plain.json", GREEDY)
    chat, metrics = write(tmp_path / "chat.json", CHAT), write(tmp_path / "m.json", METRICS)
    out = tmp_path / "result.json"
    served = serve_result.combine(chat, metrics, with_draft, plain, out)
    assert served["lossless"]["plain"] == "served" and served["lossless"]["equal"]
    kept = run_cli(
        "combine", "--chat", str(chat), "--metrics", str(metrics),
        "--greedy-with-draft", str(with_draft), "--greedy-plain", str(plain),
        "--plain-source", "kept", "--out", str(out),
    )  # fmt: skip
    assert kept.returncode == 0, kept.stderr
    assert json.loads(out.read_text())["lossless"]["plain"] == "kept"
    assert serve_result.verify(out, 8, require_lossless=True)["lossless"] is True


BENCH_DRAFT = {
    "date": "20261204-215300", "num_prompts": 4, "max_concurrency": 1, "completed": 4, "failed": 0,
    "total_output_tokens": 128, "output_throughput": 600.0, "mean_tpot_ms": 1.2,
    "spec_decode_acceptance_rate": 90.0, "spec_decode_acceptance_length": 5.5,
    "spec_decode_num_drafts": 24, "spec_decode_draft_tokens": 120,
    "spec_decode_accepted_tokens": 108,
    "spec_decode_per_position_acceptance_rates": [0.95, 0.9, 0.9, 0.85, 0.85],
    "generated_texts": ["not kept"],
}  # fmt: skip
BENCH_PLAIN = {
    "date": "20261204-215329", "num_prompts": 4, "max_concurrency": 1, "completed": 4, "failed": 0,
    "total_output_tokens": 128, "output_throughput": 300.0, "mean_tpot_ms": 3.0,
}  # fmt: skip
# A broken draft: one token in 120 accepted.
BENCH_BROKEN = {**BENCH_DRAFT, "output_throughput": 250.0, "mean_tpot_ms": 3.6,
                "spec_decode_accepted_tokens": 1}  # fmt: skip


def bench_rounds(directory: Path, plain=(300.0, 280.0, 320.0), drafts=None) -> Path:
    """Round files as the serve script saves them: 3 rounds of each arm."""
    from specfleet_helpers.stages import serve_bench

    directory.mkdir()
    drafts = drafts or {"trained": BENCH_DRAFT, "yardstick": BENCH_DRAFT}
    for n, speed in enumerate(plain, 1):
        serve_bench.result_path(directory, "plain", n).write_text(
            json.dumps({**BENCH_PLAIN, "output_throughput": speed})
        )
        for arm, figures in drafts.items():
            serve_bench.result_path(directory, arm, n).write_text(json.dumps(figures))
    return directory


def combined(tmp_path: Path, *extra: str, drafts=None) -> Path:
    chat, metrics = write(tmp_path / "chat.json", CHAT), write(tmp_path / "m.json", METRICS)
    rounds = bench_rounds(tmp_path / "bench", drafts=drafts)
    out = tmp_path / "result.json"
    done = run_cli(
        "combine", "--chat", str(chat), "--metrics", str(metrics), "--bench-dir", str(rounds),
        "--bench-rounds", "3", "--draft", "trained=/srv/drafts/r1",
        "--draft", "yardstick=/srv/converted", *extra, "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return out


def test_the_measurement_gives_each_drafts_acceptance_and_speedup_per_round(tmp_path):
    out = combined(tmp_path)
    bench = json.loads(out.read_text())["bench"]
    assert bench["rounds"] == 3 and bench["servers"] == "together"
    assert bench["order"] == [
        ["plain", "trained", "yardstick"], ["yardstick", "plain", "trained"],
        ["trained", "yardstick", "plain"],
    ]  # fmt: skip
    trained = bench["trained"]
    # each round against the plain verifier of that round: 600/300, 600/280, 600/320
    assert trained["speedup"]["rounds"] == pytest.approx([2.0, 600 / 280, 600 / 320])
    assert trained["speedup"]["median"] == pytest.approx(2.0)
    assert trained["speedup"]["min"] == pytest.approx(1.875)
    assert trained["acceptance_rate"] == pytest.approx(0.9)  # pooled over the rounds
    assert trained["mean_acceptance_length"] == pytest.approx(5.5)
    assert trained["draft"] == "/srv/drafts/r1"
    assert bench["yardstick"]["draft"] == "/srv/converted"
    summary = serve_result.verify(out, 8, require_lossless=False, bench_prompts=4)
    assert summary["acceptance_measured_on"] == "bench"
    assert summary["acceptance_rate"] == pytest.approx(0.9)
    assert summary["mean_acceptance_length"] == pytest.approx(5.5)
    assert summary["num_drafts"] == 72
    # Without the benchmark asked for, the acceptance is the checks' own.
    checks = serve_result.verify(out, 8, require_lossless=False)
    assert checks["acceptance_measured_on"] == "checks" and "bench" not in checks


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda r: r.pop("bench"), "no benchmark recorded"),
        (
            lambda r: r["bench"]["plain"].update(completed=[4, 3, 4], failed=[0, 1, 0]),
            r"plain benchmark completed \[4, 3, 4\] of 4",
        ),
        (lambda r: r["bench"].pop("trained"), "no trained benchmark recorded"),
    ],
)
def test_verify_requires_every_benchmark_request(tmp_path, change, problem):
    out = combined(tmp_path)
    result = json.loads(out.read_text())
    change(result)
    out.write_text(json.dumps(result))
    with pytest.raises(ValueError, match=problem):
        serve_result.verify(out, 8, require_lossless=False, bench_prompts=4)


def test_a_figure_below_its_floor_fails_naming_figure_floor_and_draft(tmp_path):
    """The yardstick broken on purpose (its lm_head gone: 1 token in 120 accepted) turns the
    host red naming the figure, the floor and the draft; the trained draft passes its floor."""
    from specfleet_helpers.stages import serve_bench

    out = combined(tmp_path, drafts={"trained": BENCH_DRAFT, "yardstick": BENCH_BROKEN})
    floors = [
        serve_bench.parse_floor("trained.mean_acceptance_length=1.3"),
        serve_bench.parse_floor("yardstick.mean_acceptance_length=2.5"),
        serve_bench.parse_floor("yardstick.speedup=1.3"),
    ]
    with pytest.raises(ValueError) as failed:
        serve_result.verify(
            out, 8, require_lossless=False, bench_prompts=4, floors=floors,
            floors_of="serve_floors, the atlas-a2 group's",
        )  # fmt: skip
    message = str(failed.value)
    assert (
        "the yardstick (the converted pretrained draft) (/srv/converted): mean acceptance length"
        " 1.04 is below its floor 2.5 (serve_floors, the atlas-a2 group's)"
    ) in message
    assert "speedup over the plain verifier (output tokens/s) 0.833 (median of 3 rounds)" in message
    assert "the trained draft" not in message
    passed = serve_result.verify(out, 8, require_lossless=False, bench_prompts=4, floors=floors[:1])
    assert passed["floors"]["checked"] == ["trained.mean_acceptance_length>=1.3"]
    # through the CLI, as the stage verifier calls it
    cli = run_cli(
        "verify", "--result", str(out), "--max-tokens", "8", "--bench-prompts", "4",
        "--floor", "yardstick.acceptance_rate=0.5", "--floors-of", "serve_floors",
    )  # fmt: skip
    assert cli.returncode == 1 and "acceptance rate 0.00833 is below its floor 0.5" in cli.stderr
    bad = run_cli("verify", "--result", str(out), "--max-tokens", "8", "--floor", "yardstick.mal=3")
    assert bad.returncode == 2 and "FIGURE one of mean_acceptance_length" in bad.stderr


SERVICE = {
    "deployed": True,
    "manager": "specfleet",
    "launcher": "/srv/run/serve.service.sh",
    "launcher_sha256": "a" * 64,
    "launcher_unchanged": True,
    "main_pid": 4242,
    "restarts": 0,
    "host": "127.0.0.1",
    "port": 8000,
    "running": True,
    "healthy": True,
}


def test_service_mode_requires_the_checked_service_still_serving(checks, tmp_path, monkeypatch):
    from specfleet_helpers.host import service

    combined = serve_result.combine(
        checks["chat"],
        checks["metrics"],
        None,
        None,
        checks["out"],
        service=write(tmp_path / "service.json", SERVICE),
    )
    assert (
        combined["service"]["launcher_sha256"] == "a" * 64 and "running" not in combined["service"]
    )
    now = dict(SERVICE, main_pid=5151, restarts=1)
    monkeypatch.setattr(service, "status", lambda name, run_dir: now)
    summary = serve_result.verify(checks["out"], 8, False, service_name="serve", run_dir=tmp_path)
    # A restart by the supervisor is no reason to redeploy; it is reported as it is now.
    assert summary["live_service"]["main_pid"] == 5151 and summary["live_service"]["restarts"] == 1
    for change, problem in (
        ({"deployed": False}, "is not deployed"),
        ({"launcher_sha256": "b" * 64}, "its launcher changed"),
        ({"launcher_unchanged": False}, "its launcher changed"),
        ({"running": False, "healthy": False}, "is not running"),
        ({"healthy": False}, "does not answer /health within 0 s"),
    ):
        now = dict(SERVICE, **change)
        with pytest.raises(ValueError, match=problem):
            serve_result.verify(checks["out"], 8, False, service_name="serve", run_dir=tmp_path)
