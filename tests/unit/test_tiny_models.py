"""Tests for specfleet_helpers.cpu.tiny_models.

Validation and the atomic-output logic need no torch and run in-process. Building needs the
CPU venv (torch, transformers, tokenizers, safetensors, speculators): its interpreter is
SPECFLEET_TEST_VENV_PYTHON (default: <repo>/.work/local/venv/bin/python), and the tests
that need it are skipped when it is missing. Those build a verifier and a draft through the
CLI, check them with transformers, and convert them with speculators' real DFlash
converter, which is the proof that the layout is the one published drafts use.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from specfleet_helpers.cpu.tiny_models import (
    CPU_ATTENTION_HEAD_DIMS,
    DraftSpec,
    VerifierSpec,
    build_atomically,
    read_verifier,
    validate_draft_spec,
    validate_out,
    validate_verifier_spec,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
HELPERS = REPO_ROOT / "python_helpers"
MODULE = "specfleet_helpers.cpu.tiny_models"
CPU_PYTHON = Path(
    os.environ.get("SPECFLEET_TEST_VENV_PYTHON", str(REPO_ROOT / ".work/local/venv/bin/python"))
)
BUILD_TIMEOUT = 600


def _module_env() -> dict[str, str]:
    pythonpath = os.pathsep.join(p for p in (str(HELPERS), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": pythonpath}


def run_module(python: Path | str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(python), "-m", MODULE, *args],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
        env=_module_env(),
    )


def run_module_parallel(python: Path | str, *arg_lists: list[str]) -> list[tuple[int, str, str]]:
    """Run several CLI invocations at once (the heavy imports overlap); (rc, stdout, stderr)."""
    procs = [
        subprocess.Popen(
            [str(python), "-m", MODULE, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_module_env(),
        )
        for args in arg_lists
    ]
    results = []
    for proc in procs:
        try:
            stdout, stderr = proc.communicate(timeout=BUILD_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        results.append((proc.returncode, stdout, stderr))
    return results


def last_json_line(stdout: str) -> dict[str, Any]:
    return json.loads(stdout.strip().splitlines()[-1])


def safetensors_header(path: Path) -> dict[str, Any]:
    """The safetensors JSON header (u64 little-endian length, then JSON), read without torch."""
    with path.open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        return json.loads(handle.read(length))


def fake_verifier(directory: Path, layers: int = 6, vocab: int = 1024, tokens: int = 1000) -> Path:
    """A verifier directory with just enough for read_verifier (config + tokenizer.json)."""
    directory.mkdir(parents=True)
    config = {"hidden_size": 128, "num_hidden_layers": layers, "vocab_size": vocab}
    (directory / "config.json").write_text(json.dumps(config))
    vocab_ids = {f"t{i}": i for i in range(tokens - 2)}
    added = [{"id": tokens - 2, "content": "<|im_end|>"}, {"id": tokens - 1, "content": "<x>"}]
    (directory / "tokenizer.json").write_text(
        json.dumps({"model": {"type": "BPE", "vocab": vocab_ids}, "added_tokens": added})
    )
    return directory


# --------------------------------------------------------------------------- validation


def test_default_specs_are_valid(tmp_path):
    assert validate_verifier_spec(VerifierSpec()) == []
    assert validate_draft_spec(DraftSpec()) == []
    facts = read_verifier(fake_verifier(tmp_path / "v"))
    assert facts.problems == []
    assert (facts.num_hidden_layers, facts.first_free_token_id) == (6, 1000)
    assert validate_draft_spec(DraftSpec(), facts) == []


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"head_dim": 16}, "--head-dim 16 is not supported by vLLM's CPU attention"),
        ({"head_dim": 48}, "expected one of 32, 64, 80, 96, 112, 128"),
        (
            {"num_heads": 4, "num_kv_heads": 3},
            "--num-heads 4 must be a multiple of --num-kv-heads 3",
        ),
        ({"vocab_size": 1000}, "--vocab-size 1000 must be greater than --tokenizer-vocab 1000"),
        ({"tokenizer_vocab": 200, "vocab_size": 300}, "--tokenizer-vocab 200 is too small"),
        ({"hidden_size": 0}, "--hidden-size must be a positive integer, got 0"),
        ({"num_layers": -1}, "--num-layers must be a positive integer, got -1"),
        ({"seed": -1}, "--seed must be an integer in [0, 2**63), got -1"),
    ],
)
def test_verifier_validation_names_the_option(changes, expected):
    problems = validate_verifier_spec(VerifierSpec(**changes))
    assert any(expected in problem for problem in problems), problems


def test_verifier_validation_reports_every_problem():
    problems = validate_verifier_spec(VerifierSpec(head_dim=16, vocab_size=900))
    assert len(problems) == 2
    assert "--head-dim" in problems[0] and "--vocab-size" in problems[1]


def test_every_cpu_attention_head_dim_is_accepted():
    for head_dim in CPU_ATTENTION_HEAD_DIMS:
        assert validate_verifier_spec(VerifierSpec(head_dim=head_dim)) == []


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"target_layer_ids": (2, 1)}, "--target-layer-ids 2 1 must be unique and sorted"),
        ({"target_layer_ids": (1, 1)}, "--target-layer-ids 1 1 must be unique and sorted"),
        ({"target_layer_ids": ()}, "--target-layer-ids must name at least one"),
        ({"block_size": 1}, "--block-size 1 must be at least 2"),
        ({"head_dim": 16}, "--head-dim 16 is not supported"),
        ({"num_heads": 3}, "--num-heads 3 must be a multiple of --num-kv-heads 2"),
        ({"intermediate_size": 0}, "--intermediate-size must be a positive integer"),
    ],
)
def test_draft_validation_names_the_option(changes, expected):
    problems = validate_draft_spec(DraftSpec(**changes))
    assert any(expected in problem for problem in problems), problems


def test_draft_target_layers_must_stay_below_the_verifier_layer_count(tmp_path):
    facts = read_verifier(fake_verifier(tmp_path / "v", layers=6))
    assert validate_draft_spec(DraftSpec(target_layer_ids=(0, 4)), facts) == []
    problems = validate_draft_spec(DraftSpec(target_layer_ids=(0, 4, 5)), facts)
    assert len(problems) == 1
    assert "--target-layer-ids 5 out of range" in problems[0]
    assert "[0, 4]" in problems[0] and "6 layers" in problems[0]


def test_draft_needs_a_free_vocabulary_slot_for_the_mask(tmp_path):
    facts = read_verifier(fake_verifier(tmp_path / "v", vocab=1000, tokens=1000))
    problems = validate_draft_spec(DraftSpec(), facts)
    assert len(problems) == 1
    assert problems[0].startswith("--verifier ") and "<|MASK|>" in problems[0]


def test_read_verifier_requires_config_and_tokenizer(tmp_path):
    missing = read_verifier(tmp_path / "nope")
    assert missing.problems == [f"--verifier {tmp_path / 'nope'} is not a directory"]

    empty = tmp_path / "empty"
    empty.mkdir()
    problems = read_verifier(empty).problems
    assert len(problems) == 2
    assert "has no config.json" in problems[0]
    assert "has no tokenizer.json" in problems[1]

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"hidden_size": 128}')
    (broken / "tokenizer.json").write_text("[]")
    problems = read_verifier(broken).problems
    assert "config.json lacks integer num_hidden_layers, vocab_size" in problems[0]
    assert "tokenizer.json is not usable" in problems[1]

    no_tokenizer = fake_verifier(tmp_path / "v")
    (no_tokenizer / "tokenizer.json").unlink()
    problems = validate_draft_spec(DraftSpec(), read_verifier(no_tokenizer))
    assert len(problems) == 1 and "tokenizer" in problems[0]


def test_validate_out_rejects_files_and_the_input_directory(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert validate_out(a_file) == [f"--out {a_file} exists and is not a directory"]
    verifier = fake_verifier(tmp_path / "v")
    assert "must differ from the input directory" in validate_out(verifier, [verifier])[0]
    assert validate_out(tmp_path / "new") == []


# --------------------------------------------------------------------------- atomic output


def test_build_atomically_replaces_only_when_complete(tmp_path):
    out = tmp_path / "model"
    out.mkdir()
    (out / "old.txt").write_text("old")

    def build(tmp: Path) -> None:
        assert tmp.parent == tmp_path and tmp.name.startswith(".model.tmp-")
        assert (out / "old.txt").read_text() == "old"  # old model still in place
        (tmp / "new.txt").write_text("new")

    build_atomically(out, build)
    assert sorted(p.name for p in out.iterdir()) == ["new.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_build_atomically_failure_keeps_the_old_output(tmp_path):
    out = tmp_path / "model"
    out.mkdir()
    (out / "old.txt").write_text("old")

    def build(tmp: Path) -> None:
        (tmp / "half.bin").write_bytes(b"\0")
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError, match="interrupted"):
        build_atomically(out, build)
    assert sorted(p.name for p in out.iterdir()) == ["old.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]

    fresh = tmp_path / "sub" / "fresh"
    with pytest.raises(RuntimeError):
        build_atomically(fresh, build)
    assert not fresh.exists() and list(fresh.parent.iterdir()) == []


def test_build_atomically_removes_temporaries_of_dead_builds(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    abandoned = tmp_path / f".model.tmp-{dead.pid}"
    abandoned.mkdir()
    alive = tmp_path / f".model.tmp-{os.getppid()}"  # a running process: not ours to remove
    alive.mkdir()
    build_atomically(tmp_path / "model", lambda tmp: (tmp / "f").write_text("x"))
    assert sorted(p.name for p in tmp_path.iterdir()) == [alive.name, "model"]


# --------------------------------------------------------------------------- CLI, no torch


def test_cli_validation_exits_2_before_any_work(tmp_path):
    out = tmp_path / "v"
    result = run_module(sys.executable, "verifier", "--out", str(out), "--head-dim", "16")
    assert result.returncode == 2, result.stderr
    assert "--head-dim 16 is not supported by vLLM's CPU attention" in result.stderr
    assert "verifier: error:" in result.stderr
    assert result.stdout == "" and not out.exists()

    result = run_module(
        sys.executable,
        "verifier",
        "--out",
        str(out),
        "--num-heads",
        "4",
        "--num-kv-heads",
        "3",
        "--vocab-size",
        "512",
        "--tokenizer-vocab",
        "600",
    )
    assert result.returncode == 2
    assert "--num-heads 4 must be a multiple of --num-kv-heads 3" in result.stderr
    assert "--vocab-size 512 must be greater than --tokenizer-vocab 600" in result.stderr


def test_cli_draft_validation_exits_2(tmp_path):
    verifier = fake_verifier(tmp_path / "v", layers=4)
    out = tmp_path / "d"
    result = run_module(
        sys.executable,
        "draft",
        "--verifier",
        str(verifier),
        "--out",
        str(out),
        "--target-layer-ids",
        "1",
        "3",
    )
    assert result.returncode == 2
    assert "--target-layer-ids 3 out of range; expected each in [0, 2]" in result.stderr
    assert not out.exists()

    result = run_module(
        sys.executable, "draft", "--verifier", str(tmp_path / "missing"), "--out", str(out)
    )
    assert result.returncode == 2
    assert "--verifier" in result.stderr and "is not a directory" in result.stderr

    result = run_module(
        sys.executable, "draft", "--verifier", str(verifier), "--out", str(verifier)
    )
    assert result.returncode == 2 and "must differ from the input directory" in result.stderr


@pytest.mark.parametrize(
    ("command", "options"),
    [
        ("verifier", ["--out", "--head-dim", "--tokenizer-vocab", "--vocab-size", "--seed"]),
        ("draft", ["--verifier", "--out", "--block-size", "--target-layer-ids", "--head-dim"]),
    ],
)
def test_cli_help(command, options):
    result = run_module(sys.executable, command, "--help")
    assert result.returncode == 0, result.stderr
    for option in options:
        assert option in result.stdout


# --------------------------------------------------------------------------- CPU venv builds


def _cpu_venv_has(*modules: str) -> bool:
    if not CPU_PYTHON.exists():
        return False
    probe = (
        "import importlib.util, sys; "
        f"sys.exit(0 if all(importlib.util.find_spec(m) for m in {modules!r}) else 1)"
    )
    return subprocess.run([str(CPU_PYTHON), "-c", probe], timeout=60).returncode == 0


BUILD_MODULES = ("torch", "transformers", "tokenizers", "safetensors")
needs_cpu_venv = pytest.mark.skipif(
    not _cpu_venv_has(*BUILD_MODULES),
    reason=f"CPU venv python {CPU_PYTHON} missing or lacks {', '.join(BUILD_MODULES)} "
    "(set SPECFLEET_TEST_VENV_PYTHON)",
)

# Runs in the CPU venv: everything transformers/speculators-side, in one interpreter so the
# heavy imports are paid once. Prints a JSON report the tests below assert on.
CHECKER = r"""
import json, sys, time, traceback
verifier, draft, converted = sys.argv[1:4]
report = {}

def check(name):
    def wrap(fn):
        start = time.monotonic()
        try:
            report[name] = {"ok": True, **fn()}
        except Exception:
            report[name] = {"ok": False, "error": traceback.format_exc()}
        report[name]["seconds"] = round(time.monotonic() - start, 2)
    return wrap

@check("tokenizer")
def _():
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(verifier)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "def f(x): return x"},
    ]
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
    text = "<|im_start|>user\nimport os; print('h\u00e9llo \u2713')<|im_end|>\n"
    ids = tok.encode(text, add_special_tokens=False)
    return {
        "len": len(tok),
        "eos": tok.eos_token,
        "pad": tok.pad_token,
        "prompt": tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
        "no_prompt": tok.apply_chat_template(messages, tokenize=False),
        "special_ids": {s: tok.encode(s, add_special_tokens=False) for s in specials},
        "special_decoded": {s: tok.decode(tok.convert_tokens_to_ids([s])) for s in specials},
        "roundtrip": tok.decode(ids) == text,
    }

@check("forward")
def _():
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(verifier)
    with torch.no_grad():
        logits = model(torch.tensor([[996, 84, 198, 997, 198, 996]])).logits
    return {
        "class": type(model).__name__,
        "dtype": str(model.dtype),
        "shape": list(logits.shape),
        "finite": bool(torch.isfinite(logits.float()).all()),
    }

@check("convert")
def _():
    from speculators.convert import convert_model
    convert_model(
        model=draft, verifier=verifier, algorithm="dflash", output_path=converted,
        validate_device="cpu",
    )
    with open(converted + "/config.json") as handle:
        return {"config": json.load(handle)}

print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Any]:
    """A verifier and a draft built through the CLI, twice with the same arguments.

    The second pair goes to ``again/`` (its draft over a stale directory, to exercise the
    replacement) and is built in parallel with the first, so the determinism check costs
    little extra time.
    """
    root = tmp_path_factory.mktemp("tiny")
    again = root / "again"
    (again / "draft").mkdir(parents=True)
    (again / "draft" / "stale.txt").write_text("from an older build")
    result: dict[str, Any] = {"root": root, "again": again}
    for kind in ("verifier", "draft"):
        arg_lists = []
        for base in (root, again):
            args = [kind, "--out", str(base / kind)]
            if kind == "draft":
                args += ["--verifier", str(base / "verifier")]
            arg_lists.append(args)
        start = time.monotonic()
        (rc, stdout, stderr), (rc_again, stdout_again, stderr_again) = run_module_parallel(
            CPU_PYTHON, *arg_lists
        )
        assert rc == 0, stderr
        assert rc_again == 0, stderr_again
        result[kind] = last_json_line(stdout)
        result[f"again_{kind}"] = last_json_line(stdout_again)
        result[f"{kind}_seconds"] = round(time.monotonic() - start, 1)
    return result


@pytest.fixture(scope="module")
def checked(built) -> dict[str, Any]:
    root = built["root"]
    script = root / "checker.py"
    script.write_text(CHECKER)
    proc = subprocess.run(
        [
            str(CPU_PYTHON),
            str(script),
            built["verifier"]["path"],
            built["draft"]["path"],
            str(root / "converted"),
        ],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
    )
    assert proc.returncode == 0, proc.stderr
    return last_json_line(proc.stdout)


@needs_cpu_venv
def test_verifier_build(built):
    line = built["verifier"]
    path = Path(line["path"])
    assert line["kind"] == "verifier" and path == built["root"] / "verifier"
    assert line["files"] == [
        "chat_template.jinja",
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert line["files"] == sorted(p.name for p in path.iterdir())
    assert line["config"]["tokenizer_size"] <= 1000 < line["config"]["vocab_size"] == 1024

    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    expected = {
        "model_type": "qwen3",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "vocab_size": 1024,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
    }
    assert {key: config[key] for key in expected} == expected
    ids = line["config"]["special_token_ids"]
    generation = json.loads((path / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [ids["<|im_end|>"], ids["<|endoftext|>"]]
    assert config["eos_token_id"] == ids["<|im_end|>"] == line["config"]["eos_token_id"]

    header = safetensors_header(path / "model.safetensors")
    assert header.pop("__metadata__") == {"format": "pt"}
    assert {entry["dtype"] for entry in header.values()} == {"BF16"}
    assert header["lm_head.weight"]["shape"] == [1024, 128]
    assert header["model.embed_tokens.weight"]["shape"] == [1024, 128]
    assert header["model.layers.5.self_attn.k_proj.weight"]["shape"] == [64, 128]
    params = sum(_numel(entry["shape"]) for entry in header.values())
    assert params == line["params"]
    umask = os.umask(0)
    os.umask(umask)
    assert (path / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask


def _numel(shape: list[int]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


@needs_cpu_venv
def test_draft_build(built):
    line = built["draft"]
    path = Path(line["path"])
    assert line["kind"] == "draft" and line["files"] == ["config.json", "model.safetensors"]
    mask = built["verifier"]["config"]["tokenizer_size"]

    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"]
    assert config["block_size"] == 4
    assert config["dflash_config"] == {"mask_token_id": mask, "target_layer_ids": [0, 1, 2]}
    assert config["num_target_layers"] == 6
    assert (config["hidden_size"], config["vocab_size"], config["head_dim"]) == (128, 1024, 32)
    assert (config["num_hidden_layers"], config["model_type"]) == (1, "qwen3")
    assert line["config"]["mask_token_id"] == mask

    header = safetensors_header(path / "model.safetensors")
    assert header.pop("__metadata__") == {"format": "pt"}
    shapes = {name: entry["shape"] for name, entry in header.items()}
    assert {entry["dtype"] for entry in header.values()} == {"BF16"}
    assert shapes == {
        "layers.0.self_attn.q_proj.weight": [128, 128],
        "layers.0.self_attn.k_proj.weight": [64, 128],
        "layers.0.self_attn.v_proj.weight": [64, 128],
        "layers.0.self_attn.o_proj.weight": [128, 128],
        "layers.0.self_attn.q_norm.weight": [32],
        "layers.0.self_attn.k_norm.weight": [32],
        "layers.0.mlp.gate_proj.weight": [256, 128],
        "layers.0.mlp.up_proj.weight": [256, 128],
        "layers.0.mlp.down_proj.weight": [128, 256],
        "layers.0.input_layernorm.weight": [128],
        "layers.0.post_attention_layernorm.weight": [128],
        "fc.weight": [128, 3 * 128],
        "hidden_norm.weight": [128],
        "norm.weight": [128],
    }
    assert line["params"] == sum(_numel(shape) for shape in shapes.values())


@needs_cpu_venv
def test_same_arguments_give_identical_weights(built):
    """Both builds give the same bytes; the stale directory was replaced as a whole."""
    root, again = built["root"], built["again"]
    same_files = {
        "verifier": ["model.safetensors", "tokenizer.json", "config.json"],
        "draft": ["model.safetensors", "config.json"],
    }
    for kind, names in same_files.items():
        for name in names:
            first = (root / kind / name).read_bytes()
            second = (again / kind / name).read_bytes()
            assert first == second, f"{kind}/{name} differs between identical builds"
        assert built[kind]["params"] == built[f"again_{kind}"]["params"]
    assert not (again / "draft" / "stale.txt").exists()
    assert sorted(p.name for p in again.iterdir()) == ["draft", "verifier"]


@needs_cpu_venv
def test_tokenizer_loads_with_qwen_specials_and_chat_template(checked, built):
    report = checked["tokenizer"]
    assert report["ok"], report.get("error")
    assert report["len"] == built["verifier"]["config"]["tokenizer_size"]
    assert (report["eos"], report["pad"]) == ("<|im_end|>", "<|endoftext|>")
    assert report["prompt"].endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert report["prompt"].startswith("<|im_start|>system\nBe brief.<|im_end|>\n")
    assert "<|im_start|>assistant\n<think>\n\n</think>\n\nHello!<|im_end|>\n" in report["prompt"]
    assert not report["no_prompt"].endswith("<|im_start|>assistant\n")
    ids = built["verifier"]["config"]["special_token_ids"]
    assert report["special_ids"] == {token: [ids[token]] for token in ids}
    assert report["special_decoded"] == {token: token for token in ids}
    assert report["roundtrip"]


@needs_cpu_venv
def test_verifier_forward(checked):
    report = checked["forward"]
    assert report["ok"], report.get("error")
    assert report["class"] == "Qwen3ForCausalLM"
    assert report["dtype"] == "torch.bfloat16"
    assert report["shape"] == [1, 6, 1024] and report["finite"]


@needs_cpu_venv
@pytest.mark.skipif(
    not _cpu_venv_has("speculators"), reason=f"speculators is not installed in {CPU_PYTHON}"
)
def test_speculators_converts_the_draft(checked, built):
    """The key integration proof: speculators' own DFlash converter accepts the pair."""
    report = checked["convert"]
    assert report["ok"], report.get("error")
    config = report["config"]
    assert config["speculators_model_type"] == "dflash"
    assert config["aux_hidden_state_layer_ids"] == [1, 2, 3]  # z-lab ids shifted by +1
    assert config["block_size"] == 4
    assert config["mask_token_id"] == built["verifier"]["config"]["tokenizer_size"]
    assert config["transformer_layer_config"]["hidden_size"] == 128
    converted = built["root"] / "converted"
    assert (converted / "model.safetensors").is_file()
