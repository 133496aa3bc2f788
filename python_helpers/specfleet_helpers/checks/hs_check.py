"""Verify the hidden-state files `speculators generate-offline-data` wrote.

One `hs_<i>.safetensors` per dataset row, each holding `token_ids` [T] and `hidden_states`
[T, L, H] where L is the number of target layers plus the verifier's last layer (the
extract_hidden_states config appends it) and H the verifier's hidden size. A truncated or
missing file fails here, so the next run regenerates instead of training on it.
Standard library only (safetensors headers are read directly).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Optional

from specfleet_helpers.checks.model_check import ModelCheckError, read_safetensors_header


def check(
    hs_dir: Path, rows: int, layers: Optional[int], hidden_size: Optional[int]
) -> dict[str, Any]:
    if not hs_dir.is_dir():
        raise ValueError(f"{hs_dir} does not exist")
    files = sorted(hs_dir.glob("hs_*.safetensors"), key=lambda p: int(p.stem.split("_")[1]))
    if len(files) != rows:
        raise ValueError(f"{hs_dir} has {len(files)} hs_*.safetensors files, expected {rows}")
    tokens = 0
    total_bytes = 0
    shape = None
    for path in files:
        try:
            header = read_safetensors_header(path)
        except ModelCheckError as exc:
            raise ValueError(str(exc)) from exc
        missing = {"token_ids", "hidden_states"} - header.keys()
        if missing:
            raise ValueError(f"{path} lacks {sorted(missing)} (has {sorted(header)})")
        hs_shape = header["hidden_states"]["shape"]
        ids_shape = header["token_ids"]["shape"]
        if len(hs_shape) != 3 or len(ids_shape) != 1 or hs_shape[0] != ids_shape[0]:
            raise ValueError(
                f"{path}: hidden_states {hs_shape} and token_ids {ids_shape} do not match"
                " ([T, layers, hidden] and [T])"
            )
        if layers is not None and hs_shape[1] != layers:
            raise ValueError(f"{path}: {hs_shape[1]} layers of hidden states, expected {layers}")
        if hidden_size is not None and hs_shape[2] != hidden_size:
            raise ValueError(f"{path}: hidden size {hs_shape[2]}, expected {hidden_size}")
        tokens += ids_shape[0]
        total_bytes += path.stat().st_size
        shape = hs_shape
    return {
        "path": str(hs_dir),
        "files": len(files),
        "tokens": tokens,
        "bytes": total_bytes,
        "layers": shape[1] if shape else None,
        "hidden_size": shape[2] if shape else None,
        "dtype_hidden_states": header["hidden_states"]["dtype"] if files else None,
    }


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specfleet_helpers.checks.hs_check",
        description="Check generate-offline-data's hs_*.safetensors files: count, keys, shapes.",
    )
    parser.add_argument("--dir", type=Path, required=True, help="generate-offline-data --output")
    parser.add_argument("--rows", type=int, required=True, help="dataset rows (files expected)")
    parser.add_argument("--layers", type=int, help="layers per token: target layers + 1")
    parser.add_argument("--hidden-size", type=int, help="the verifier's hidden size")
    args = parser.parse_args(argv)
    try:
        result = check(args.dir, args.rows, args.layers, args.hidden_size)
    except (OSError, ValueError) as exc:
        print(f"hidden-state check failed: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
