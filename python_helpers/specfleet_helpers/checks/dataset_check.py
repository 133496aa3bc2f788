"""Verify what `speculators prepare-data` produced: the dataset's row count and token_freq.pt.

The runbook checks `len(load_from_disk(data_path))` and that token_freq.pt exists and loads
with `torch.load(..., weights_only=True)`. The expected row count is the number of prompt rows
(capped by --max-samples), so a run that silently dropped rows fails here.
Runs in the target Python (needs `datasets` and `torch`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Optional


def count_lines(path: Path) -> int:
    with path.open() as fh:
        return sum(1 for line in fh if line.strip())


def check(data: Path, prompts: Optional[Path], max_samples: Optional[int]) -> dict[str, Any]:
    import torch  # noqa: PLC0415 - heavy; only in the target environment
    from datasets import load_from_disk  # noqa: PLC0415

    if not data.is_dir():
        raise ValueError(f"{data} does not exist")
    dataset = load_from_disk(str(data))
    rows = len(dataset)
    freq_path = data / "token_freq.pt"
    if not freq_path.is_file() or freq_path.stat().st_size == 0:
        raise ValueError(
            f"{freq_path} is missing or empty (prepare-data needs --no-skip-token-freq)"
        )
    freq = torch.load(freq_path, weights_only=True)
    result: dict[str, Any] = {
        "path": str(data),
        "rows": rows,
        "columns": sorted(dataset.column_names),
        "token_freq": {
            "bytes": freq_path.stat().st_size,
            "type": type(freq).__name__,
            "entries": len(freq),
        },
    }
    if prompts is not None:
        expected = count_lines(prompts)
        if max_samples is not None:
            expected = min(expected, max_samples)
        result["expected_rows"] = expected
        if rows != expected:
            raise ValueError(f"{data} has {rows} rows, expected {expected} (from {prompts})")
    if rows == 0:
        raise ValueError(f"{data} has no rows")
    return result


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specfleet_helpers.checks.dataset_check",
        description="Check a prepare-data output directory: row count and token_freq.pt.",
    )
    parser.add_argument("--data", type=Path, required=True, help="prepare-data --output directory")
    parser.add_argument("--prompts", type=Path, help="the JSONL given to prepare-data")
    parser.add_argument("--max-samples", type=int, help="prepare-data --max-samples")
    args = parser.parse_args(argv)
    try:
        result = check(args.data, args.prompts, args.max_samples)
    except (OSError, ValueError) as exc:
        print(f"dataset check failed: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
