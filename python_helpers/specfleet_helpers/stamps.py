"""Print every stage stamp under a state directory as one JSON object ({stage: stamp}).

Plays read it once per host so that a run limited with --tags (say `--tags serve`) still
knows where the earlier stages put their artifacts, and which runs produced them.
Standard library only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Optional


def load(state_dir: Path) -> dict[str, Any]:
    stamps: dict[str, Any] = {}
    for path in sorted(state_dir.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # a damaged stamp counts as no stamp: its stage will run again
        if isinstance(data, dict) and data.get("stage") == path.stem:
            stamps[path.stem] = data
    return stamps


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specfleet_helpers.stamps",
        description="Print the stage stamps of a specfleet work root as one JSON object.",
    )
    parser.add_argument("--state-dir", type=Path, required=True, help="<specfleet_root>/state")
    args = parser.parse_args(argv)
    print(json.dumps(load(args.state_dir), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
