"""Pack the specfleet_helpers package into one reproducible zip for shipping to hosts.

The zip's bytes depend only on the sources (sorted names, fixed timestamps, no bytecode),
so Ansible's copy of it reports `changed` only when a helper really changed. Python imports
straight from it: `PYTHONPATH=specfleet_helpers.zip python -m specfleet_helpers.<module>`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import zipfile
from pathlib import Path
from typing import Optional

from specfleet_helpers.files import atomic_path

FIXED_TIME = (2020, 1, 1, 0, 0, 0)
PACKAGE_DIR = Path(__file__).resolve().parent


def build(out: Path, package_dir: Path = PACKAGE_DIR) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    sources = sorted(p for p in package_dir.rglob("*.py") if "__pycache__" not in p.parts)
    with atomic_path(out) as tmp, zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for path in sources:
            info = zipfile.ZipInfo(
                f"{package_dir.name}/{path.relative_to(package_dir).as_posix()}", FIXED_TIME
            )
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, path.read_bytes())
    return out


def sha1(path: Path) -> str:
    """The zip's sha1: the checksum ansible.builtin.stat reports for its copy on a host."""
    return hashlib.sha1(path.read_bytes()).hexdigest()


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specfleet_helpers.bundle",
        description=(
            "Write a reproducible zip of the specfleet_helpers package; print"
            ' {"path": ..., "sha1": ...} (the sha1 is what Ansible\'s stat reports for the copy'
            " on a host, so the controller needs no stat of its own)."
        ),
    )
    parser.add_argument("--out", type=Path, required=True, help="zip file to write")
    args = parser.parse_args(argv)
    out = build(args.out)
    print(json.dumps({"path": str(out), "sha1": sha1(out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
