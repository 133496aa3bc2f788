"""Check that a model directory (downloaded or synthesized) is complete before a stage uses it.

A model is complete when:

* ``config.json`` exists and is a JSON object;
* its weights are ``model.safetensors``, or ``model.safetensors.index.json`` whose every
  shard named in ``weight_map`` exists;
* every weight file is non-empty, its safetensors header parses (8-byte little-endian header
  length, then a JSON header) and the file is exactly as long as the header says: header end
  plus the largest tensor end offset. A truncated download fails here;
* for sharded weights, every tensor the index places in a shard is in that shard's header.

Only headers are read, so checking a 16 GB model takes milliseconds. Standard library only:
this runs with the host's own Python before anything is installed.

Output (one JSON line on stdout)::

    {"path", "architectures", "model_type", "num_hidden_layers", "hidden_size", "vocab_size",
     "weights": [{"name", "size"}], "bytes",
     "checksums": {"config.json": sha256, "model.safetensors.index.json": sha256}}

Exit status: 0 complete, 1 incomplete or invalid (the reason on stderr), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any, Optional

from specfleet_helpers import files

CONFIG = "config.json"
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"


class ModelCheckError(Exception):
    """The model directory is incomplete or invalid; the message says what and where."""


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


def load_json_object(path: Path) -> dict[str, Any]:
    """Parse a JSON file that must hold an object; ModelCheckError naming the file otherwise."""
    if not path.is_file():
        raise ModelCheckError(f"{path}: missing")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelCheckError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ModelCheckError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """Parse and check a safetensors file's header against the file's size (files.py's
    reader): the tensor entries without ``__metadata__``, or ModelCheckError naming the file
    and what is wrong (empty, truncated, padded, malformed header)."""
    try:
        return files.read_safetensors_header(path)
    except files.SafetensorsError as exc:
        raise ModelCheckError(str(exc)) from exc


def weight_files(model_dir: Path) -> tuple[list[Path], Optional[Path]]:
    """The weight files of a model and its index (None for a single file); checks the index."""
    single = model_dir / SINGLE
    index_path = model_dir / INDEX
    if index_path.exists():
        index = load_json_object(index_path)
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelCheckError(f"{index_path}: 'weight_map' must be a non-empty object")
        shards = []
        for tensor, shard in weight_map.items():
            if not isinstance(shard, str) or not shard or "/" in shard or shard in (".", ".."):
                raise ModelCheckError(
                    f"{index_path}: weight_map[{tensor!r}] must be a file name, got {shard!r}"
                )
            if shard not in shards:
                shards.append(shard)
        missing = [s for s in shards if not (model_dir / s).is_file()]
        if missing:
            raise ModelCheckError(
                f"{index_path}: {len(missing)} of {len(shards)} shards missing: "
                + ", ".join(missing)
            )
        return [model_dir / s for s in sorted(shards)], index_path
    if single.is_file():
        return [single], None
    raise ModelCheckError(f"{model_dir}: no weights (expected {SINGLE} or {INDEX})")


def config_value(config: dict[str, Any], key: str) -> Any:
    """A config field, looked up top-level first, then in nested text/transformer configs."""
    if key in config:
        return config[key]
    for nested in ("text_config", "transformer_layer_config"):
        sub = config.get(nested)
        if isinstance(sub, dict) and key in sub:
            return sub[key]
    return None


def check_model(model_dir: Path, expect_architecture: Optional[str] = None) -> dict[str, Any]:
    """Check a model directory; return the summary or raise ModelCheckError."""
    if not model_dir.is_dir():
        raise ModelCheckError(f"{model_dir}: not a directory")
    config_path = model_dir / CONFIG
    config = load_json_object(config_path)
    architectures = config.get("architectures")
    if expect_architecture is not None and (
        not isinstance(architectures, list) or expect_architecture not in architectures
    ):
        raise ModelCheckError(
            f"{config_path}: architectures is {architectures!r}, expected it to contain"
            f" {expect_architecture!r}"
        )

    files, index_path = weight_files(model_dir)
    weights = []
    for path in files:
        tensors = read_safetensors_header(path)
        weights.append({"name": path.name, "size": path.stat().st_size, "tensors": tensors})
    if index_path is not None:
        weight_map = load_json_object(index_path)["weight_map"]
        by_name = {w["name"]: w["tensors"] for w in weights}
        absent = [t for t, shard in weight_map.items() if t not in by_name[shard]]
        if absent:
            raise ModelCheckError(
                f"{index_path}: {len(absent)} tensors are not in the shard the index names,"
                f" e.g. {absent[0]!r} in {weight_map[absent[0]]}"
            )

    checksums = {CONFIG: sha256_file(config_path)}
    if index_path is not None:
        checksums[INDEX] = sha256_file(index_path)
    return {
        "path": str(model_dir),
        "architectures": architectures,
        "model_type": config.get("model_type"),
        "num_hidden_layers": config_value(config, "num_hidden_layers"),
        "hidden_size": config_value(config, "hidden_size"),
        "vocab_size": config_value(config, "vocab_size"),
        "weights": [{"name": w["name"], "size": w["size"]} for w in weights],
        "bytes": sum(w["size"] for w in weights),
        "checksums": checksums,
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m specfleet_helpers.checks.model_check",
        description=(
            "Check that a model directory is complete: config.json parses, model.safetensors"
            " (or every shard of model.safetensors.index.json) exists, is non-empty, has a"
            " valid header and exactly the size the header describes. Prints one JSON line"
            " (architectures, sizes, weight files, sha256 of config.json and the index)."
            " Standard library only."
        ),
        epilog="exit status: 0 complete; 1 incomplete or invalid (reason on stderr); 2 bad usage",
    )
    parser.add_argument("model_dir", type=Path, metavar="DIR", help="model directory")
    parser.add_argument(
        "--expect-architecture",
        metavar="NAME",
        help="fail unless config.json's architectures contains NAME, e.g. Qwen3ForCausalLM",
    )
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result = check_model(args.model_dir, args.expect_architecture)
    except ModelCheckError as exc:
        print(f"model_check: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"model_check: {args.model_dir}: cannot read ({exc})", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
