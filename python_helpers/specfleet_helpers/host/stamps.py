"""Print what a specfleet work root records about its stages, as one JSON object.

    {"stamps": {stage: stamp}, "failures": {stage: failure record}, "environment": {...}}

Stamps (`<stage>.json`) are written when a stage succeeds; failure records
(`<stage>.failed.json`) when it fails; `npu_env.json` describes the host. Plays read this
once per host, so a run limited with --tags (say `--tags serve`) still knows where the
earlier stages put their artifacts and which runs produced them, and the fleet report
knows what failed. Standard library only.

With --manifest-counts (what the plays read) each stamp's manifest, the file list only the
verifier on the host reads, is given as its counts ({"files": N, "links": N}): a stage with
one file per row lists thousands, and the controller would carry them in its facts, its
results and every template lookup's copy of the variables, on every run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Optional

FAILURE_SUFFIX = ".failed.json"
ENVIRONMENT_FILE = "npu_env.json"


def _read(path: Path) -> Optional[dict[str, Any]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # a damaged stamp counts as no stamp: its stage will run again
    return data if isinstance(data, dict) else None


def load(state_dir: Path) -> dict[str, Any]:
    """{stage: stamp} for every readable stamp whose "stage" matches its file name."""
    stamps: dict[str, Any] = {}
    for path in sorted(state_dir.glob("*.json")):
        data = _read(path)
        if data is not None and data.get("stage") == path.stem:
            stamps[path.stem] = data
    return stamps


def write(state_dir: Path, stamp: dict[str, Any]) -> Path:
    """Replace `<stage>.json` at once (a temporary sibling renamed): a reader sees the old
    stamp or the new one, never half of one. Same layout as finish.yml's to_nice_json."""
    path = state_dir / f"{stamp['stage']}.json"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(stamp, indent=4, sort_keys=True) + "\n")
    os.chmod(tmp, 0o640)
    os.replace(tmp, path)
    return path


def load_failures(state_dir: Path) -> dict[str, Any]:
    """{stage: failure record} for every readable `<stage>.failed.json`."""
    failures: dict[str, Any] = {}
    for path in sorted(state_dir.glob("*" + FAILURE_SUFFIX)):
        stage = path.name[: -len(FAILURE_SUFFIX)]
        data = _read(path)
        if data is not None and data.get("stage") == stage:
            failures[stage] = data
    return failures


def manifest_counts(stamp: dict[str, Any]) -> dict[str, Any]:
    """The stamp with its manifest given as counts: {"files": N, "links": N}."""
    manifest = stamp.get("manifest")
    if not isinstance(manifest, dict):
        return stamp
    counts = {
        key: len(value) if isinstance(value, (dict, list)) else value
        for key, value in manifest.items()
    }
    return {**stamp, "manifest": counts}


def load_all(state_dir: Path, manifests: bool = True) -> dict[str, Any]:
    """The stamps, failure records and environment; `manifests` False: each manifest as its
    counts (manifest_counts)."""
    stamps = load(state_dir)
    if not manifests:
        stamps = {stage: manifest_counts(stamp) for stage, stamp in stamps.items()}
    return {
        "stamps": stamps,
        "failures": load_failures(state_dir),
        "environment": _read(state_dir / ENVIRONMENT_FILE) or {},
    }


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specfleet_helpers.host.stamps",
        description=(
            "Print the stamps, failure records and environment of a specfleet work root"
            " as one JSON object."
        ),
    )
    parser.add_argument("--state-dir", type=Path, required=True, help="<specfleet_root>/state")
    parser.add_argument(
        "--manifest-counts",
        action="store_true",
        help="give each stamp's manifest as its counts ({files: N, links: N}), not its file list",
    )
    args = parser.parse_args(argv)
    print(json.dumps(load_all(args.state_dir, not args.manifest_counts), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
