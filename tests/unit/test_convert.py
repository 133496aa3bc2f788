"""Tests for specfleet_helpers.stages.convert.

The input checks and the output verification run in-process on hand-written configs and
safetensors files (no torch). A real conversion runs the module's CLI with the CPU venv's
Python (SPECFLEET_TEST_VENV_PYTHON) on a tiny Qwen3 verifier and a tiny z-lab-layout DFlash
draft that the test synthesizes.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from specfleet_helpers.checks.model_check import check_model
from specfleet_helpers.stages.convert import (
    CHECKSUMS,
    ConvertError,
    ConvertInputError,
    check_checksums,
    main,
    preflight,
    publish,
    verify_output,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
HELPERS = REPO_ROOT / "python_helpers"
VENV_PYTHON = Path(
    os.environ.get(
        "SPECFLEET_TEST_VENV_PYTHON", str(REPO_ROOT / ".work" / "local" / "venv" / "bin" / "python")
    )
)

VERIFIER_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 128,
    "num_hidden_layers": 6,
    "vocab_size": 1024,
}
ZLAB_DRAFT_CONFIG = {
    "architectures": ["DFlashDraftModel"],
    "block_size": 4,
    "dflash_config": {"mask_token_id": 1000, "target_layer_ids": [0, 1, 2]},
    "model_type": "qwen3",
    "hidden_size": 128,
    "num_hidden_layers": 1,
    "vocab_size": 1024,
}
# The shape of a config.json that speculators 0.9.0 writes for a DFlash conversion.
CONVERTED_CONFIG = {
    "architectures": ["DFlashDraftModel"],
    "aux_hidden_state_layer_ids": [1, 2, 3],
    "block_size": 4,
    "draft_vocab_size": 1024,
    "mask_token_id": 1000,
    "speculators_config": {
        "algorithm": "dflash",
        "default_proposal_method": "greedy",
        "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
        "verifier": {"architectures": ["Qwen3ForCausalLM"], "name_or_path": "/models/verifier"},
    },
    "speculators_model_type": "dflash",
    "transformer_layer_config": {"hidden_size": 128, "num_hidden_layers": 1, "vocab_size": 1024},
}


def tiny_safetensors() -> bytes:
    raw = json.dumps({"norm.weight": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})
    return struct.pack("<Q", len(raw)) + raw.encode() + bytes(8)


def make_dir(path: Path, config: dict[str, Any], weights: bool = True) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    if weights:
        (path / "model.safetensors").write_bytes(tiny_safetensors())
    return path


@pytest.fixture
def inputs(tmp_path: Path) -> tuple[Path, Path]:
    return (
        make_dir(tmp_path / "draft", ZLAB_DRAFT_CONFIG),
        make_dir(tmp_path / "verifier", VERIFIER_CONFIG),
    )


@pytest.fixture
def converted(tmp_path: Path) -> tuple[Path, Path]:
    return (
        make_dir(tmp_path / "converted", CONVERTED_CONFIG),
        make_dir(tmp_path / "verifier", VERIFIER_CONFIG),
    )


# --- checks before converting ---------------------------------------------------------------


def test_preflight_accepts_matching_models(inputs: tuple[Path, Path]):
    assert preflight(*inputs) == {"hidden_size": 128, "block_size": 4}


def test_preflight_finds_block_size_in_dflash_config(tmp_path: Path):
    config = {**ZLAB_DRAFT_CONFIG, "dflash_config": {"block_size": 16, "target_layer_ids": [1]}}
    del config["block_size"]
    draft = make_dir(tmp_path / "draft", config)
    verifier = make_dir(tmp_path / "verifier", VERIFIER_CONFIG)
    assert preflight(draft, verifier)["block_size"] == 16


def test_hidden_size_mismatch_names_both_values(tmp_path: Path):
    draft = make_dir(tmp_path / "draft", {**ZLAB_DRAFT_CONFIG, "hidden_size": 64})
    verifier = make_dir(tmp_path / "verifier", VERIFIER_CONFIG)
    with pytest.raises(ConvertInputError) as info:
        preflight(draft, verifier)
    assert str(info.value) == (
        f"hidden size mismatch: draft {draft} has hidden_size=64 but verifier {verifier} has"
        " hidden_size=128; the draft was built for another verifier"
    )


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        (lambda d, v: shutil.rmtree(d), "--draft"),
        (lambda d, v: (d / "config.json").unlink(), "--draft: "),
        (lambda d, v: (v / "config.json").write_text("{"), "--verifier: "),
        (lambda d, v: (d / "model.safetensors").unlink(), "no model.safetensors"),
        (lambda d, v: (v / "model.safetensors").unlink(), "--verifier"),
        (
            lambda d, v: (d / "config.json").write_text(json.dumps(CONVERTED_CONFIG)),
            "already a speculators checkpoint",
        ),
        (
            lambda d, v: (d / "config.json").write_text(
                json.dumps({k: x for k, x in ZLAB_DRAFT_CONFIG.items() if k != "block_size"})
            ),
            "no integer 'block_size'",
        ),
        (
            lambda d, v: (v / "config.json").write_text(json.dumps({"hidden_size": 128})),
            "'num_hidden_layers' must be a positive integer",
        ),
        (
            lambda d, v: (v / "config.json").write_text(json.dumps({"num_hidden_layers": 6})),
            "'hidden_size' must be a positive integer, got None",
        ),
    ],
)
def test_preflight_rejects_bad_inputs(
    inputs: tuple[Path, Path], edit: Callable[[Path, Path], Any], fragment: str
):
    edit(*inputs)
    with pytest.raises(ConvertInputError) as info:
        preflight(*inputs)
    assert fragment in str(info.value)


def test_run_with_mismatched_hidden_size_fails_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    # In-process on the controller's Python, which has no speculators or torch: the
    # mismatch must be caught before they are imported and before anything is written.
    draft = make_dir(tmp_path / "draft", {**ZLAB_DRAFT_CONFIG, "hidden_size": 64})
    verifier = make_dir(tmp_path / "verifier", VERIFIER_CONFIG)
    out = tmp_path / "out"
    argv = ["run", "--draft", str(draft), "--verifier", str(verifier), "--out", str(out)]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "hidden_size=64" in captured.err
    assert "hidden_size=128" in captured.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["draft", "verifier"]


# --- verifying an output --------------------------------------------------------------------


def test_verify_output_reports_the_fields(converted: tuple[Path, Path]):
    out, verifier = converted
    assert verify_output(out, verifier) == {
        "path": str(out),
        "speculators_model_type": "dflash",
        "block_size": 4,
        "aux_hidden_state_layer_ids": [1, 2, 3],
        "speculative_tokens": 3,
        "mask_token_id": 1000,
        "verifier_name_or_path": "/models/verifier",
        "verifier_num_layers": 6,
        "files": ["config.json", "model.safetensors"],
    }


def test_verify_output_without_optional_fields(tmp_path: Path):
    config = {
        k: v
        for k, v in CONVERTED_CONFIG.items()
        if k not in ("mask_token_id", "speculators_config")
    }
    out = make_dir(tmp_path / "out", config)
    result = verify_output(out, make_dir(tmp_path / "verifier", VERIFIER_CONFIG))
    assert "speculative_tokens" not in result
    assert "mask_token_id" not in result
    assert "verifier_name_or_path" not in result


def edit_config(out: Path, **changes: Any) -> None:
    config = json.loads((out / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (out / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"speculators_model_type": "eagle3"}, "speculators_model_type is 'eagle3'"),
        ({"speculators_model_type": None}, "speculators_model_type is None"),
        ({"block_size": None}, "block_size must be a positive integer, got None"),
        ({"block_size": "4"}, "block_size must be a positive integer, got '4'"),
        ({"aux_hidden_state_layer_ids": None}, "aux_hidden_state_layer_ids must be a non-empty"),
        ({"aux_hidden_state_layer_ids": []}, "aux_hidden_state_layer_ids must be a non-empty"),
        (
            {"aux_hidden_state_layer_ids": [1, 3, 6]},
            "has ids outside the verifier's 6 layers (0..5): [6]",
        ),
        ({"mask_token_id": 1024}, "mask_token_id 1024 is not a token id"),
        (
            {"transformer_layer_config": {"hidden_size": 64}},
            "draft hidden_size=64 but verifier",
        ),
    ],
)
def test_verify_output_rejects_edited_config(
    converted: tuple[Path, Path], changes: dict[str, Any], fragment: str
):
    out, verifier = converted
    edit_config(out, **changes)
    with pytest.raises(ConvertError) as info:
        verify_output(out, verifier)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("damage", "fragment"),
    [
        (lambda w: w.unlink(), "model.safetensors: missing"),
        (lambda w: w.write_bytes(b""), "model.safetensors: empty file"),
        (lambda w: os.truncate(w, w.stat().st_size - 1), "truncated"),
    ],
)
def test_verify_output_rejects_bad_weights(
    converted: tuple[Path, Path], damage: Callable[[Path], Any], fragment: str
):
    out, verifier = converted
    damage(out / "model.safetensors")
    with pytest.raises(ConvertError) as info:
        verify_output(out, verifier)
    assert fragment in str(info.value)


def test_verify_output_needs_configs(converted: tuple[Path, Path]):
    out, verifier = converted
    (verifier / "config.json").unlink()
    with pytest.raises(ConvertError, match=r"verifier/config\.json: missing"):
        verify_output(out, verifier)


def test_main_verify_exit_codes(
    converted: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    out, verifier = converted
    assert main(["verify", "--out", str(out), "--verifier", str(verifier)]) == 0
    assert json.loads(capsys.readouterr().out)["block_size"] == 4
    edit_config(out, speculators_model_type="eagle3")
    assert main(["verify", "--out", str(out), "--verifier", str(verifier)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("convert: ")
    assert "speculators_model_type is 'eagle3'" in captured.err
    assert main(["verify", "--out", str(tmp_path / "nope"), "--verifier", str(verifier)]) == 1
    assert "not a directory" in capsys.readouterr().err


def test_publish_replaces_old_output_only_when_new_is_complete(tmp_path: Path):
    out = make_dir(tmp_path / "out", {"old": True})
    tmp = make_dir(tmp_path / ".out.partial", {"new": True})
    publish(tmp, out)
    assert json.loads((out / "config.json").read_text()) == {"new": True}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    publish(make_dir(tmp_path / ".out.partial", {"newer": True}), tmp_path / "fresh")
    assert (tmp_path / "fresh" / "config.json").exists()


# --- run() with a stand-in for speculators (in-process, no torch) ---------------------------


def fake_speculators(
    monkeypatch: pytest.MonkeyPatch, write: Callable[[Path], Any]
) -> list[dict[str, Any]]:
    """Install a `speculators.convert.convert_model` that calls write(output_path)."""
    calls: list[dict[str, Any]] = []

    def convert_model(**kwargs: Any) -> None:
        calls.append(kwargs)
        print("speculators chatter on stdout")
        write(Path(kwargs["output_path"]))

    package = types.ModuleType("speculators")
    module = types.ModuleType("speculators.convert")
    module.convert_model = convert_model  # type: ignore[attr-defined]
    package.convert = module  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "speculators", package)
    monkeypatch.setitem(sys.modules, "speculators.convert", module)
    return calls


def run_argv(draft: Path, verifier: Path, out: Path) -> list[str]:
    return ["run", "--draft", str(draft), "--verifier", str(verifier), "--out", str(out)]


def test_run_converts_into_a_sibling_then_replaces_the_old_output(
    inputs: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
):
    draft, verifier = inputs
    out = make_dir(tmp_path / "out", {"old": True})
    seen: list[Any] = []

    def write(path: Path) -> None:
        seen.append(json.loads((out / "config.json").read_text()))
        make_dir(path, CONVERTED_CONFIG)

    calls = fake_speculators(monkeypatch, write)
    assert main([*run_argv(draft, verifier, out), "--validate-device", "cpu"]) == 0
    assert calls == [
        {
            "model": str(draft.resolve()),
            "verifier": str(verifier.resolve()),
            "algorithm": "dflash",
            "output_path": str(tmp_path / ".out.partial"),
            "validate_device": "cpu",
        }
    ]
    assert seen == [{"old": True}]  # the old output stays in place while converting
    captured = capsys.readouterr()
    result = json.loads(captured.out)  # only the JSON line on stdout
    assert "speculators chatter on stdout" in captured.err
    assert (result["path"], result["block_size"]) == (str(out), 4)
    assert json.loads((out / "config.json").read_text()) == CONVERTED_CONFIG
    assert sorted(p.name for p in tmp_path.iterdir()) == ["draft", "out", "verifier"]


def converted_by_run(
    inputs: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Path:
    out = tmp_path / "out"
    fake_speculators(monkeypatch, lambda path: make_dir(path, CONVERTED_CONFIG))
    assert main(run_argv(*inputs, out)) == 0
    return out


def test_run_records_the_checksums_of_the_verified_output(
    inputs: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    out = converted_by_run(inputs, tmp_path, monkeypatch)
    record = json.loads((out / CHECKSUMS).read_text())
    assert record == {
        "files": {
            name: hashlib.sha256((out / name).read_bytes()).hexdigest()
            for name in ("config.json", "model.safetensors")
        }
    }
    # The record is not one of the checkpoint's files.
    assert verify_output(out, inputs[1])["files"] == ["config.json", "model.safetensors"]


@pytest.mark.parametrize(
    ("damage", "fragment"),
    [
        # Still a plausible conversion: only the record tells.
        (lambda out: edit_config(out, block_size=8), "config.json edited (sha256 differs"),
        (
            lambda out: (out / "generation_config.json").write_text("{}"),
            "generation_config.json added",
        ),
        (
            lambda out: (out / "model.safetensors").write_bytes(
                tiny_safetensors()[:-8] + bytes([1] * 8)
            ),
            "model.safetensors edited",
        ),
        (lambda out: (out / CHECKSUMS).write_text("{"), "unreadable checksum record"),
    ],
    ids=["config-value", "file-added", "weights-changed", "record-damaged"],
)
def test_verify_notices_any_change_since_the_conversion(
    inputs: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    damage: Callable[[Path], Any],
    fragment: str,
):
    out = converted_by_run(inputs, tmp_path, monkeypatch)
    capsys.readouterr()
    damage(out)
    with pytest.raises(ConvertError, match=r"changed since it was converted|unreadable") as info:
        verify_output(out, inputs[1])
    assert fragment in str(info.value)
    assert main(["verify", "--out", str(out), "--verifier", str(inputs[1])]) == 1
    assert fragment in capsys.readouterr().err


def test_an_output_without_a_record_is_checked_for_consistency_only(
    converted: tuple[Path, Path],
):
    out, verifier = converted
    assert check_checksums(out) is False
    edit_config(out, block_size=8)
    assert verify_output(out, verifier)["block_size"] == 8


@pytest.mark.parametrize(
    ("write", "message"),
    [
        (
            lambda path: (_ for _ in ()).throw(RuntimeError("boom")),
            "convert: conversion failed: RuntimeError: boom",
        ),
        (
            lambda path: make_dir(path, {**CONVERTED_CONFIG, "block_size": 0}),
            "convert: conversion produced an invalid checkpoint: ",
        ),
        (
            lambda path: make_dir(path, CONVERTED_CONFIG, weights=False),
            "convert: conversion produced an invalid checkpoint: ",
        ),
    ],
    ids=["raises", "invalid-config", "no-weights"],
)
def test_failed_conversion_keeps_the_old_output(
    inputs: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    write: Callable[[Path], Any],
    message: str,
):
    out = make_dir(tmp_path / "out", {"old": True})
    fake_speculators(monkeypatch, write)
    assert main(run_argv(*inputs, out)) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip().splitlines()[-1].startswith(message)
    assert json.loads((out / "config.json").read_text()) == {"old": True}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["draft", "out", "verifier"]


def test_run_cleans_a_leftover_partial_dir(
    inputs: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    make_dir(tmp_path / ".out.partial", {"interrupted": True})
    fake_speculators(monkeypatch, lambda path: make_dir(path, CONVERTED_CONFIG))
    assert main(run_argv(*inputs, tmp_path / "out")) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["draft", "out", "verifier"]


# --- a real conversion in the CPU venv ------------------------------------------------------

BUILD_MODELS = """
import json, sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import Qwen3Config, Qwen3ForCausalLM

root = Path(sys.argv[1])
torch.manual_seed(0)
config = Qwen3Config(
    vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=6,
    num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=2048,
    tie_word_embeddings=False, dtype="bfloat16",
)
config.architectures = ["Qwen3ForCausalLM"]
Qwen3ForCausalLM(config).to(torch.bfloat16).save_pretrained(root / "verifier")

# z-lab layout DFlash draft: 1 layer, block_size 4, target layers [0, 1, 2] (z-lab convention)
hidden, heads, kv_heads, head_dim, inter = 128, 4, 2, 32, 256
draft_config = {
    "architectures": ["DFlashDraftModel"], "block_size": 4,
    "dflash_config": {"mask_token_id": 1000, "target_layer_ids": [0, 1, 2]},
    "num_target_layers": 6, "model_type": "qwen3", "attention_bias": False, "head_dim": head_dim,
    "hidden_act": "silu", "hidden_size": hidden, "intermediate_size": inter,
    "max_position_embeddings": 2048, "num_attention_heads": heads, "num_hidden_layers": 1,
    "num_key_value_heads": kv_heads, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
    "tie_word_embeddings": False, "vocab_size": 1024,
}
g = torch.Generator().manual_seed(0)
def rand(*shape):
    return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)
def ones(n):
    return torch.ones(n, dtype=torch.bfloat16)
p = "layers.0."
weights = {
    p + "self_attn.q_proj.weight": rand(heads * head_dim, hidden),
    p + "self_attn.k_proj.weight": rand(kv_heads * head_dim, hidden),
    p + "self_attn.v_proj.weight": rand(kv_heads * head_dim, hidden),
    p + "self_attn.o_proj.weight": rand(hidden, heads * head_dim),
    p + "self_attn.q_norm.weight": ones(head_dim),
    p + "self_attn.k_norm.weight": ones(head_dim),
    p + "mlp.gate_proj.weight": rand(inter, hidden),
    p + "mlp.up_proj.weight": rand(inter, hidden),
    p + "mlp.down_proj.weight": rand(hidden, inter),
    p + "input_layernorm.weight": ones(hidden),
    p + "post_attention_layernorm.weight": ones(hidden),
    "fc.weight": rand(hidden, 3 * hidden),
    "hidden_norm.weight": ones(hidden),
    "norm.weight": ones(hidden),
}
(root / "draft").mkdir()
(root / "draft" / "config.json").write_text(json.dumps(draft_config, indent=2))
save_file(weights, str(root / "draft" / "model.safetensors"), metadata={"format": "pt"})
"""


@functools.cache
def venv_problem() -> str:
    """Why the CPU venv cannot run a real conversion ("" when it can)."""
    if not VENV_PYTHON.exists():
        return (
            f"CPU venv python {VENV_PYTHON} not found (set SPECFLEET_TEST_VENV_PYTHON to a"
            " Python with torch, transformers, safetensors and speculators)"
        )
    probe = subprocess.run(
        [
            str(VENV_PYTHON),
            "-c",
            "import importlib.util, sys; sys.exit(any(importlib.util.find_spec(m) is None"
            " for m in ('torch', 'transformers', 'safetensors', 'speculators')))",
        ],
        capture_output=True,
        timeout=60,
    )
    return (
        f"{VENV_PYTHON} lacks torch, transformers, safetensors or speculators"
        if probe.returncode
        else ""
    )


def run_venv(*args: str) -> subprocess.CompletedProcess[str]:
    problem = venv_problem()
    if problem:
        pytest.skip(problem)
    return subprocess.run(
        [str(VENV_PYTHON), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(HELPERS), "HF_HUB_OFFLINE": "1"},
    )


def run_controller(*args: str) -> subprocess.CompletedProcess[str]:
    """The module on the interpreter running the tests (no torch): `verify` needs none."""
    return subprocess.run(
        [sys.executable, "-m", "specfleet_helpers.stages.convert", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(HELPERS)},
    )


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tiny-models")
    proc = run_venv("-c", BUILD_MODELS, str(root))
    assert proc.returncode == 0, proc.stderr
    return root


@pytest.fixture(scope="module")
def conversion(tiny_models: Path) -> tuple[dict[str, Any], Path]:
    """`convert run` into an existing output directory (which it must replace)."""
    out = tiny_models / "converted"
    out.mkdir()
    (out / "stale-file").write_text("from an older conversion")
    proc = run_venv(
        "-m",
        "specfleet_helpers.stages.convert",
        "run",
        "--draft",
        str(tiny_models / "draft"),
        "--verifier",
        str(tiny_models / "verifier"),
        "--out",
        str(out),
        "--validate-device",
        "cpu",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout
    return json.loads(lines[0]), out


def test_real_conversion_result(tiny_models: Path, conversion: tuple[dict[str, Any], Path]):
    result, out = conversion
    assert result.pop("seconds") > 0
    assert result == {
        "path": str(out),
        "speculators_model_type": "dflash",
        "block_size": 4,
        "aux_hidden_state_layer_ids": [1, 2, 3],
        "speculative_tokens": 3,
        "mask_token_id": 1000,
        "verifier_name_or_path": str((tiny_models / "verifier").resolve()),
        "verifier_num_layers": 6,
        "files": ["config.json", "config.py", "model.safetensors"],
    }
    # The old output was replaced; no temporary siblings are left behind.
    assert sorted(p.name for p in tiny_models.iterdir()) == ["converted", "draft", "verifier"]


def test_real_conversion_config_layout(conversion: tuple[dict[str, Any], Path]):
    """Where speculators 0.9.0 puts the fields the verification reads."""
    _, out = conversion
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_model_type"] == "dflash"
    assert config["block_size"] == 4
    assert config["aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert config["mask_token_id"] == 1000
    assert config["transformer_layer_config"]["hidden_size"] == 128
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3


def test_real_safetensors_files_pass_model_check(
    tiny_models: Path, conversion: tuple[dict[str, Any], Path]
):
    _, out = conversion
    for model in (tiny_models / "verifier", tiny_models / "draft", out):
        assert check_model(model)["bytes"] > 0


def test_real_mismatch_fails_before_converting(tiny_models: Path, tmp_path: Path):
    draft = tmp_path / "draft"
    shutil.copytree(tiny_models / "draft", draft)
    edit_config(draft, hidden_size=64)
    out = tmp_path / "out"
    proc = run_venv(
        "-m",
        "specfleet_helpers.stages.convert",
        "run",
        "--draft",
        str(draft),
        "--verifier",
        str(tiny_models / "verifier"),
        "--out",
        str(out),
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "hidden_size=64" in proc.stderr
    assert "hidden_size=128" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["draft"]


def test_real_verify_cli_detects_edits(
    tiny_models: Path, conversion: tuple[dict[str, Any], Path], tmp_path: Path
):
    verifier = str(tiny_models / "verifier")
    copy = tmp_path / "converted"
    shutil.copytree(conversion[1], copy)

    proc = run_controller("verify", "--out", str(copy), "--verifier", verifier)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["aux_hidden_state_layer_ids"] == [1, 2, 3]

    original = (copy / "config.json").read_text()
    edit_config(copy, speculators_model_type="eagle3")
    proc = run_controller("verify", "--out", str(copy), "--verifier", verifier)
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert "speculators_model_type is 'eagle3', expected 'dflash'" in proc.stderr

    (copy / "config.json").write_text(original)
    (copy / "model.safetensors").unlink()
    proc = run_controller("verify", "--out", str(copy), "--verifier", verifier)
    assert proc.returncode == 1
    assert "model.safetensors: missing" in proc.stderr
