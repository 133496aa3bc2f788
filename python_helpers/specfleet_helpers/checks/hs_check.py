"""Verify the hidden-state files `speculators generate-offline-data` wrote.

One `hs_<i>.safetensors` per dataset row, each holding `token_ids` [T] and `hidden_states`
[T, L, H] where L is the number of target layers plus the verifier's last layer (the
extract_hidden_states config appends it) and H the verifier's hidden size. A truncated or
missing file fails here, so the next run regenerates instead of training on it.

A host of a job (specfleet_job) dumps one share of the rows, ``--first`` onwards
(generate-offline-data --world-size/--rank), into a directory of its own: then exactly those
rows are checked, and with ``--links DIR`` that each of them is linked from DIR (the job's
rows/ directory, which train reads), as the stage left it.
Standard library only (safetensors headers are read directly).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Optional

from specfleet_helpers.checks.model_check import ModelCheckError, read_safetensors_header


def _index(path: Path) -> int:
    try:
        return int(path.stem.split("_", 1)[1])
    except (IndexError, ValueError):
        return -1


def check(
    hs_dir: Path,
    rows: int,
    layers: Optional[int],
    hidden_size: Optional[int],
    first: Optional[int] = None,
    links: Optional[Path] = None,
) -> dict[str, Any]:
    """The facts of the hidden-state files; ValueError naming the first problem. Without
    `first`, the directory holds exactly `rows` files; with it, hs_<first>.. hs_<first+rows-1>
    are checked (a share of the job's rows) and, with `links`, each is linked from there."""
    if not hs_dir.is_dir():
        raise ValueError(f"{hs_dir} does not exist")
    files = sorted(hs_dir.glob("hs_*.safetensors"), key=_index)
    if first is None:
        if len(files) != rows:
            raise ValueError(f"{hs_dir} has {len(files)} hs_*.safetensors files, expected {rows}")
    else:
        wanted = range(first, first + rows)
        have = {_index(p) for p in files}
        missing = [i for i in wanted if i not in have]
        if missing:
            raise ValueError(
                f"{hs_dir} lacks {len(missing)} of rows {first}..{first + rows - 1}"
                f" (first missing: hs_{missing[0]}.safetensors)"
            )
        files = [p for p in files if _index(p) in wanted]
        if links is not None:
            for path in files:
                link = links / path.name
                if not link.exists() or link.resolve() != path.resolve():
                    raise ValueError(f"{link} does not lead to {path}")
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
        "first": 0 if first is None else first,
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
    parser.add_argument(
        "--first", type=int, help="a share of the rows: check hs_<first>.. only (--rows of them)"
    )
    parser.add_argument(
        "--links", type=Path, help="with --first: the directory that must link each of them"
    )
    args = parser.parse_args(argv)
    if args.links is not None and args.first is None:
        parser.error("--links needs --first")
    try:
        result = check(args.dir, args.rows, args.layers, args.hidden_size, args.first, args.links)
    except (OSError, ValueError) as exc:
        print(f"hidden-state check failed: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
