"""Tests for specfleet_helpers.checks.model_check on hand-built safetensors files (no torch)."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import pytest
from specfleet_helpers.checks.model_check import (
    ModelCheckError,
    check_model,
    main,
    read_safetensors_header,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
HELPERS = REPO_ROOT / "python_helpers"

QWEN3_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 128,
    "num_hidden_layers": 6,
    "vocab_size": 1024,
}
DTYPE_SIZE = {"BF16": 2, "F32": 4, "I64": 8}
TENSORS = {"embed.weight": ("BF16", [4, 8]), "norm.weight": ("F32", [8])}


def safetensors_bytes(
    tensors: dict[str, tuple[str, list[int]]], metadata: Optional[dict[str, str]] = None
) -> bytes:
    """A safetensors file: 8-byte little-endian header length, JSON header, tensor data."""
    header: dict[str, Any] = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    offset = 0
    for name, (dtype, shape) in tensors.items():
        size = DTYPE_SIZE[dtype]
        for dim in shape:
            size *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header to 8 bytes
    return struct.pack("<Q", len(raw)) + raw + bytes(offset)


def make_model(
    root: Path,
    config: Optional[dict[str, Any]] = None,
    tensors: Optional[dict[str, tuple[str, list[int]]]] = None,
) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config or QWEN3_CONFIG))
    (root / "model.safetensors").write_bytes(
        safetensors_bytes(tensors or TENSORS, metadata={"format": "pt"})
    )
    return root


def make_sharded(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(QWEN3_CONFIG))
    shards = {
        "model-00001-of-00002.safetensors": {"a.weight": ("BF16", [16, 8])},
        "model-00002-of-00002.safetensors": {"b.weight": ("F32", [3]), "c.weight": ("I64", [2])},
    }
    weight_map = {}
    for shard, tensors in shards.items():
        (root / shard).write_bytes(safetensors_bytes(tensors))
        weight_map.update(dict.fromkeys(tensors, shard))
    index = {"metadata": {}, "weight_map": weight_map}
    (root / "model.safetensors.index.json").write_text(json.dumps(index))
    return root


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def check_fails(model_dir: Path, *fragments: str, **kwargs: Any) -> str:
    with pytest.raises(ModelCheckError) as info:
        check_model(model_dir, **kwargs)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message
    return message


def test_single_file_model(tmp_path: Path):
    model = make_model(tmp_path / "m")
    size = (model / "model.safetensors").stat().st_size
    assert check_model(model, expect_architecture="Qwen3ForCausalLM") == {
        "path": str(model),
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "num_hidden_layers": 6,
        "hidden_size": 128,
        "vocab_size": 1024,
        "weights": [{"name": "model.safetensors", "size": size}],
        "bytes": size,
        "checksums": {"config.json": sha256(model / "config.json")},
    }


def test_header_parse_returns_tensors_without_metadata(tmp_path: Path):
    model = make_model(tmp_path / "m")
    tensors = read_safetensors_header(model / "model.safetensors")
    assert sorted(tensors) == ["embed.weight", "norm.weight"]
    assert tensors["embed.weight"] == {"dtype": "BF16", "shape": [4, 8], "data_offsets": [0, 64]}


def test_truncated_file_fails(tmp_path: Path):
    model = make_model(tmp_path / "m")
    weights = model / "model.safetensors"
    size = weights.stat().st_size
    os.truncate(weights, size - 3)
    check_fails(model, "model.safetensors", f"{size - 3} bytes", f"{size} bytes", "truncated")


def test_truncated_inside_header_fails(tmp_path: Path):
    model = make_model(tmp_path / "m")
    os.truncate(model / "model.safetensors", 20)
    check_fails(model, "header length", "does not fit", "truncated")


def test_trailing_bytes_fail(tmp_path: Path):
    model = make_model(tmp_path / "m")
    with (model / "model.safetensors").open("ab") as handle:
        handle.write(b"\0")
    check_fails(model, "trailing bytes")


def test_empty_weight_file_fails(tmp_path: Path):
    model = make_model(tmp_path / "m")
    (model / "model.safetensors").write_bytes(b"")
    check_fails(model, "model.safetensors: empty file")


def test_too_short_weight_file_fails(tmp_path: Path):
    model = make_model(tmp_path / "m")
    (model / "model.safetensors").write_bytes(b"\1\0\0")
    check_fails(model, "too short")


def test_bad_header_json_fails(tmp_path: Path):
    model = make_model(tmp_path / "m")
    raw = b"{not json"
    (model / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    check_fails(model, "header is not valid JSON")


def test_header_not_an_object_fails(tmp_path: Path):
    model = make_model(tmp_path / "m")
    raw = b"[1, 2]"
    (model / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    check_fails(model, "header is not a JSON object")


@pytest.mark.parametrize(
    ("entry", "fragment"),
    [
        ({"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}, "data_offsets"),
        ({"dtype": "F32", "shape": [2], "data_offsets": [0]}, "data_offsets"),
        ({"dtype": "F32", "shape": "2", "data_offsets": [0, 8]}, "shape"),
        ({"dtype": 4, "shape": [2], "data_offsets": [0, 8]}, "dtype"),
        ({"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}, "needs 12 bytes"),
        ("oops", "not an object"),
    ],
)
def test_malformed_tensor_entry_fails(tmp_path: Path, entry: Any, fragment: str):
    model = make_model(tmp_path / "m")
    raw = json.dumps({"t": entry}).encode()
    (model / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(8))
    check_fails(model, "tensor 't'", fragment)


def test_unknown_dtype_skips_size_check(tmp_path: Path):
    model = make_model(tmp_path / "m")
    raw = json.dumps({"t": {"dtype": "F4", "shape": [4], "data_offsets": [0, 2]}}).encode()
    (model / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(2))
    assert check_model(model)["bytes"] == 8 + len(raw) + 2


def test_sharded_model(tmp_path: Path):
    model = make_sharded(tmp_path / "m")
    result = check_model(model)
    assert [w["name"] for w in result["weights"]] == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]
    assert result["bytes"] == sum(w["size"] for w in result["weights"])
    assert result["checksums"] == {
        "config.json": sha256(model / "config.json"),
        "model.safetensors.index.json": sha256(model / "model.safetensors.index.json"),
    }


def test_missing_shard_fails(tmp_path: Path):
    model = make_sharded(tmp_path / "m")
    (model / "model-00002-of-00002.safetensors").unlink()
    check_fails(model, "1 of 2 shards missing: model-00002-of-00002.safetensors")


def test_truncated_shard_fails(tmp_path: Path):
    model = make_sharded(tmp_path / "m")
    shard = model / "model-00001-of-00002.safetensors"
    os.truncate(shard, shard.stat().st_size - 1)
    check_fails(model, "model-00001-of-00002.safetensors", "truncated")


def test_empty_shard_fails(tmp_path: Path):
    model = make_sharded(tmp_path / "m")
    (model / "model-00001-of-00002.safetensors").write_bytes(b"")
    check_fails(model, "model-00001-of-00002.safetensors: empty file")


def test_index_names_tensor_absent_from_shard(tmp_path: Path):
    model = make_sharded(tmp_path / "m")
    index_path = model / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"]["d.weight"] = "model-00001-of-00002.safetensors"
    index_path.write_text(json.dumps(index))
    check_fails(model, "1 tensors are not in the shard", "'d.weight'")


@pytest.mark.parametrize(
    ("index_text", "fragment"),
    [
        ("{", "not valid JSON"),
        ("[]", "expected a JSON object"),
        ('{"metadata": {}}', "'weight_map' must be a non-empty object"),
        ('{"weight_map": {"a": "../x.safetensors"}}', "must be a file name"),
    ],
)
def test_bad_index_fails(tmp_path: Path, index_text: str, fragment: str):
    model = make_sharded(tmp_path / "m")
    (model / "model.safetensors.index.json").write_text(index_text)
    check_fails(model, "model.safetensors.index.json", fragment)


def test_no_weights_fails(tmp_path: Path):
    model = make_model(tmp_path / "m")
    (model / "model.safetensors").unlink()
    check_fails(model, "no weights (expected model.safetensors or model.safetensors.index.json)")


@pytest.mark.parametrize(
    ("config_text", "fragment"),
    [(None, "config.json: missing"), ("{", "not valid JSON"), ("[1]", "expected a JSON object")],
)
def test_bad_config_fails(tmp_path: Path, config_text: Optional[str], fragment: str):
    model = make_model(tmp_path / "m")
    if config_text is None:
        (model / "config.json").unlink()
    else:
        (model / "config.json").write_text(config_text)
    check_fails(model, fragment)


def test_not_a_directory_fails(tmp_path: Path):
    check_fails(tmp_path / "absent", "not a directory")


def test_unexpected_architecture_fails(tmp_path: Path):
    model = make_model(tmp_path / "m", config={**QWEN3_CONFIG, "architectures": ["LlamaForX"]})
    check_fails(
        model, "['LlamaForX']", "'Qwen3ForCausalLM'", expect_architecture="Qwen3ForCausalLM"
    )


def test_nested_config_values_of_a_converted_draft(tmp_path: Path):
    config = {
        "architectures": ["DFlashDraftModel"],
        "speculators_model_type": "dflash",
        "transformer_layer_config": {
            "model_type": "qwen3",
            "hidden_size": 128,
            "num_hidden_layers": 1,
            "vocab_size": 1024,
        },
    }
    result = check_model(make_model(tmp_path / "d", config=config))
    assert result["model_type"] is None
    assert (result["hidden_size"], result["num_hidden_layers"], result["vocab_size"]) == (
        128,
        1,
        1024,
    )


def test_main_prints_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    model = make_model(tmp_path / "m")
    assert main([str(model), "--expect-architecture", "Qwen3ForCausalLM"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert json.loads(out[-1])["architectures"] == ["Qwen3ForCausalLM"]


def test_main_reports_reason_and_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    model = make_model(tmp_path / "m")
    os.truncate(model / "model.safetensors", 100)
    assert main([str(model)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("model_check: ")
    assert "model.safetensors" in captured.err
    assert len(captured.err.strip().splitlines()) == 1


def test_cli_runs_as_module(tmp_path: Path):
    model = make_sharded(tmp_path / "m")
    proc = subprocess.run(
        [sys.executable, "-m", "specfleet_helpers.checks.model_check", str(model)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(HELPERS)},
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["path"] == str(model)
