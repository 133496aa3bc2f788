"""Start the installed command-line tools (`speculators --version`, `vllm --version`, ...) and
keep the results for as long as the interpreter's installed files are unchanged.

Each start is an interpreter importing torch and transformers: about 10 s of every validation
on a 2-core host, repeated on every no-op run. What decides whether a start still succeeds is
what is installed, so the results are kept in a record keyed by the installed tree, the way
git's index keys a file by its size and modification time:

  * every file under the interpreter's purelib, platlib and scripts directories (bytecode
    caches left out: the tools themselves write them), by path, size and mtime;
  * the interpreter's own version and path, and the commands.

A record is written only when every command ended as expected (`--command` exits 0,
`--command-fails` exits non-zero, e.g. `pip show` of a build that must be absent), so anything
unexpected is started again on the next run, never read back. Anything installed, removed,
upgraded or edited by hand changes the key and the tools are started again. Walking a CPU
venv's ~40,000 files takes about 0.4 s.

Run it with the *target* interpreter (the CPU venv's, or the vllm-ascend image's Python
through run/specfleet-env), so the tree is the one the tools import:

    python -m specfleet_helpers.checks.cli_starts --record ROOT/cache/cli-starts.json \\
        --command speculators='["python", "-m", "speculators", "--version"]' \\
        --command-fails torchvision='["python", "-m", "pip", "show", "torchvision"]'

Prints one JSON object: {"cached": bool, "key": str, "results": {name: {rc, stdout, stderr}}}.
Standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Optional

from specfleet_helpers import files

RECORD_VERSION = 1
START_TIMEOUT_S = 600
# What a result keeps of a tool's output: enough for a version line or an error's tail.
OUTPUT_LIMIT = 4000


def installed_trees() -> list[Path]:
    """The directories this interpreter imports installed code and scripts from."""
    paths = sysconfig.get_paths()
    trees: list[Path] = []
    for key in ("purelib", "platlib", "scripts"):
        path = Path(paths[key]).resolve()
        if path.is_dir() and path not in trees:
            trees.append(path)
    return trees


def tree_key(trees: list[Path], commands: Any) -> str:
    """sha256 over every installed file's path, size and mtime, the interpreter and the commands."""
    digest = hashlib.sha256()
    digest.update(json.dumps([sys.version, sys.executable, commands], sort_keys=True).encode())
    for top in trees:
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for name in sorted(filenames):
                path = os.path.join(dirpath, name)
                try:
                    stat = os.lstat(path)
                except FileNotFoundError:
                    continue  # removed while walking: the key differs either way
                digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def start(argv: list[str]) -> dict[str, Any]:
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, errors="replace", timeout=START_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"rc": 127, "stdout": "", "stderr": f"{argv[0]}: {exc}"}
    return {
        "rc": done.returncode,
        "stdout": done.stdout[-OUTPUT_LIMIT:],
        "stderr": done.stderr[-OUTPUT_LIMIT:],
    }


def read_record(path: Path) -> Optional[dict[str, Any]]:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # missing or damaged: start the tools again
    if not isinstance(record, dict) or record.get("version") != RECORD_VERSION:
        return None
    return record


def run(
    record_path: Path, commands: dict[str, list[str]], failing: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """Start `commands` ({name: argv}), or read back their recorded results. `failing` names
    the commands expected to exit non-zero."""
    key = tree_key(installed_trees(), {"commands": commands, "failing": sorted(failing)})
    record = read_record(record_path)
    if record is not None and record.get("key") == key:
        return {"cached": True, "key": key, "results": record["results"]}
    with ThreadPoolExecutor(max_workers=max(1, len(commands))) as pool:
        started = {name: pool.submit(start, argv) for name, argv in commands.items()}
        results = {name: future.result() for name, future in started.items()}
    if all((result["rc"] != 0) == (name in failing) for name, result in results.items()):
        record_path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
        files.write_json_atomic(
            record_path, {"version": RECORD_VERSION, "key": key, "results": results}, indent=2
        )
    return {"cached": False, "key": key, "results": results}


def parse_command(text: str) -> tuple[str, list[str]]:
    name, sep, argv_json = text.partition("=")
    try:
        argv = json.loads(argv_json) if sep else None
    except ValueError:
        argv = None
    if (
        not name
        or not isinstance(argv, list)
        or not argv
        or not all(isinstance(a, str) for a in argv)
    ):
        raise argparse.ArgumentTypeError(
            f"--command {text!r}: expected NAME=<JSON list of strings>, e.g. "
            'vllm=\'["vllm", "--version"]\''
        )
    return name, argv


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specfleet_helpers.checks.cli_starts",
        description=(
            "Start each command (in parallel) and print the results as JSON; reuse the results "
            "recorded last time while this interpreter's installed files are unchanged."
        ),
    )
    parser.add_argument(
        "--record", type=Path, required=True, help="where the results are kept (JSON)"
    )
    parser.add_argument(
        "--command",
        dest="commands",
        type=parse_command,
        action="append",
        required=True,
        metavar="NAME=ARGV_JSON",
        help="a tool to start, expected to exit 0: its name and argv as a JSON list (repeatable)",
    )
    parser.add_argument(
        "--command-fails",
        dest="failing",
        type=parse_command,
        action="append",
        default=[],
        metavar="NAME=ARGV_JSON",
        help="a command expected to exit non-zero (e.g. pip show of a build that must be absent)",
    )
    args = parser.parse_args(argv)
    commands = dict(args.commands + args.failing)
    if len(commands) != len(args.commands) + len(args.failing):
        parser.error("each command needs its own NAME")
    failing = frozenset(name for name, _ in args.failing)
    print(json.dumps(run(args.record, commands, failing), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
