"""A play's start and end on a host, each one process (one Ansible task, one connection).

``open`` (plugins/action/specfleet_session.py, first in every play):
    the work root's layout, the host lock (host_lock acquire), what earlier runs left
    (stamps), the checksums of the files the play writes, and the verification of the
    stamped stages the play may skip (stage_verify):
    a stage of the play whose inputs are unchanged then needs no host call of its own to be
    found up to date (roles/stage/tasks/begin.yml uses the result while the checker is the
    one the role would run).
``close`` (roles/validate/tasks/collect.yml, at the report):
    the verification of the stamped stages this run did not check, what the work root
    records, the installed versions, the work root's signature (``--restore-modes``: with the
    write bit for others taken off whatever had it, in the same walk), then the host lock
    released.

The signature (``close --signature-root``) is a sha256 of what is on disk under the work
root, read from stat alone, as git's index tells a changed file: every entry's path and type,
a file's size, modification time, inode and mode, a directory's mode (not its modification
time: its entries are listed), a link's target. Left out: the host lock (every run takes it),
the logs (a service left serving appends to its log; no check reads a log), the verifier's
caches (cache/: the hash index and kept checker results a verification updates as it goes;
what they stand for is the files, which are in) and the venv's thousands of files, which
count by its configuration and its package directories' modification times (an install or
removal changes them; the installed versions are reported beside). The validate role reuses
the artifact suite's verdict for a host while its signature and the rest of what the suite
reads are unchanged (specfleet_helpers.report.artifact_suite).

Prints one JSON line; the lock part is host_lock's own (acquire: {acquired, changed, broke},
release: {released}), with ``state`` ({stamps, failures, environment}: each stamp's manifest as
its counts, stamps.manifest_counts), ``verification``
({stage: stage_verify result}) and, for open, ``files`` ({path: {sha1, mode} | null}), for
close, ``versions``, ``signature`` and ``restored_modes`` added (and ``warnings``, lines
for the run's output, when a mode was set again). Exit status as host_lock:
0 done; 4 held by another run (open); 1 other failures; 2 bad usage.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

from specfleet_helpers.checks import stage_verify
from specfleet_helpers.host import host_lock, stamps

PROG = "python -m specfleet_helpers.host.session"
LAYOUT_MODE = 0o750
# What the signature leaves out, relative to the work root: the lock every run takes, the logs
# (appended to by a service left serving), the verifier's caches (updated by a verification),
# and the venv, which counts by VENV_MARKERS.
SIGNATURE_SKIP = ("run/lock.json", "logs", "cache", "venv")
VENV_MARKERS = stage_verify.VENV_MARKERS
VERSIONS_CACHE_VERSION = 1


def lay_out(dirs: list[Path]) -> list[str]:
    """Create the work root's directories that are missing, and give the ones whose mode was
    changed theirs again (0750, as the file task that creates them on a first run): a
    directory someone made world-writable is the project's to set right. Returns what was
    set again, as "<dir> (0777 -> 0750)"."""
    restored = []
    for path in dirs:
        if not path.is_dir():
            path.mkdir(parents=True, exist_ok=True)
            os.chmod(path, LAYOUT_MODE)
            continue
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode != LAYOUT_MODE:
            os.chmod(path, LAYOUT_MODE)
            restored.append(f"{path} ({mode:04o} -> {LAYOUT_MODE:04o})")
    return restored


def file_facts(paths: list[Path]) -> dict[str, Optional[dict[str, str]]]:
    """{path: {"sha1": ..., "mode": "0640"}} of each regular file, None when it is missing:
    what Ansible's copy and template compare before writing, so that a play can leave an
    unchanged file alone without a round trip of its own."""
    facts: dict[str, Optional[dict[str, str]]] = {}
    for path in paths:
        try:
            data = path.read_bytes()
            mode = stat.S_IMODE(path.stat().st_mode)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            facts[str(path)] = None
            continue
        facts[str(path)] = {"sha1": hashlib.sha1(data).hexdigest(), "mode": f"{mode:04o}"}
    return facts


def _entry(name: str, path: str, info: os.stat_result) -> str:
    mode = f"{stat.S_IMODE(info.st_mode):04o}"
    if stat.S_ISDIR(info.st_mode):
        return f"d {mode} {name}"
    if stat.S_ISLNK(info.st_mode):
        return f"l {name} -> {os.readlink(path)}"
    kind = f"{stat.S_IFMT(info.st_mode):o}"
    return f"f{kind} {mode} {info.st_size} {info.st_mtime_ns} {info.st_ino} {name}"


def _walk(root: Path, skip: set[str]) -> Iterator[tuple[str, str]]:
    """(relative path, path) of everything under `root`, sorted, but the relative paths in
    `skip` and what lies under them."""
    for top, dirs, files in os.walk(root):
        relative_top = os.path.relpath(top, root)
        dirs[:] = sorted(
            d for d in dirs if os.path.normpath(os.path.join(relative_top, d)) not in skip
        )
        for name in dirs + sorted(files):
            relative = os.path.normpath(os.path.join(relative_top, name))
            if relative not in skip:
                yield relative, os.path.join(top, name)


def not_world_writable(path: str, info: os.stat_result) -> Optional[str]:
    """Take the write bit for others off a directory or file that has it (a link's mode is not
    its own); "<path> (0777 -> 0775)" when it did."""
    mode = stat.S_IMODE(info.st_mode)
    if stat.S_ISLNK(info.st_mode) or not mode & stat.S_IWOTH:
        return None
    os.chmod(path, mode & ~stat.S_IWOTH)
    return f"{path} ({mode:04o} -> {mode & ~stat.S_IWOTH:04o})"


def tree_signature(root: Path, restore_modes: bool = False) -> tuple[Optional[str], list[str]]:
    """sha256 of the stat facts of `root` and everything under it (module docstring), None
    when `root` is not a directory. Entries that vanish while it walks are left out.

    With `restore_modes`, the same walk takes the write bit for others off whatever has it
    under the work root but the venv (what the artifact suite's test_work_root_not_world_writable
    holds the work root to: the project lays all of it out with umask 027), before it is
    counted; the second value lists what it set again. The signature is then the repaired
    tree's, so the suite runs again on it."""
    if not root.is_dir():
        return None, []
    restored: list[str] = []
    info = os.lstat(root)
    if restore_modes and (done := not_world_writable(str(root), info)):
        restored.append(done)
        info = os.lstat(root)
    lines = [_entry(".", str(root), info)]
    skip_counted = set(SIGNATURE_SKIP)
    for relative, path in _walk(root, {"venv"} if restore_modes else skip_counted):
        try:
            info = os.lstat(path)
            if restore_modes and (done := not_world_writable(path, info)):
                restored.append(done)
                info = os.lstat(path)
        except OSError:
            continue
        if relative in skip_counted or any(relative.startswith(f"{s}/") for s in skip_counted):
            continue
        lines.append(_entry(relative, path, info))
    for pattern in VENV_MARKERS:
        for marker in sorted((root / "venv").glob(pattern)):
            with contextlib.suppress(OSError):
                info = marker.stat()
                relative = str(marker.relative_to(root))
                lines.append(f"venv {info.st_size} {info.st_mtime_ns} {relative}")
    digest = hashlib.sha256("\n".join(lines).encode("utf-8", "surrogateescape")).hexdigest()
    return digest, restored


def _stages(text: str) -> set[str]:
    return {s for s in text.split(",") if s}


def verification(state_dir: Path, only: Optional[set[str]], skip: set[str]) -> dict[str, Any]:
    """stage_verify's result for every stamped stage in `only` (every one when None) but not
    in `skip`, with the work root's hash index and kept checker results."""
    index = stage_verify.HashIndex(stage_verify.default_index(state_dir))
    kept = stage_verify.CheckerResults(stage_verify.default_checker_results(state_dir))
    stamped = set(stamps.load(state_dir))
    leave_out = skip | (stamped - only if only is not None else set())
    results = stage_verify.check_all(state_dir, leave_out, index=index, results=kept)
    index.save()
    kept.save()
    return results


def versions_key(python: str, venv: Any) -> Optional[str]:
    """What the interpreter's installed versions depend on, hashed: the interpreter, its venv's
    package directories (an install or a removal changes them: stage_verify's VENV_MARKERS)
    and the helpers' sources; None without a venv (an image's own Python: nothing stat-able
    stands for its packages), and the versions are asked every time."""
    if not isinstance(venv, str) or not venv:
        return None
    entries = [
        stage_verify.unlisted_entries(Path(python)),
        stage_verify.unlisted_entries(Path(venv)),
    ]
    if any(entry is None for entry in entries):
        return None
    material = {"python": python, "entries": entries, "helpers": stage_verify.helpers_sources()}
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def installed_versions(state: dict[str, Any], cache: Optional[Path] = None) -> dict[str, Any]:
    """stack_report's versions of the stage interpreter speculators_install's stamp names; {}
    without that stamp or when the interpreter cannot tell (the report then shows none). With
    `cache`, kept there while nothing they depend on changed (versions_key)."""
    install = state["stamps"].get("speculators_install") or {}
    artifacts = install.get("artifacts") or {}
    python = artifacts.get("python")
    if not isinstance(python, str) or not python:
        return {}
    key = versions_key(python, artifacts.get("venv")) if cache is not None else None
    if key is not None:
        kept = stage_verify.read_cache(cache, VERSIONS_CACHE_VERSION, "versions")
        if kept.get("key") == key and isinstance(kept.get("versions"), dict):
            return kept["versions"]
    versions = _ask_versions(python)
    if key is not None and versions:
        stage_verify.write_cache(
            cache,
            VERSIONS_CACHE_VERSION,
            "versions",
            {"key": key, "versions": versions},
            "versions",
        )
    return versions


def _ask_versions(python: str) -> dict[str, Any]:
    try:
        done = subprocess.run(
            [python, "-m", "specfleet_helpers.checks.stack_report"],
            capture_output=True,
            text=True,
            check=False,
        )
        versions = json.loads(done.stdout) if done.returncode == 0 else {}
    except (OSError, ValueError):
        return {}
    return versions if isinstance(versions, dict) else {}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    op = sub.add_parser(
        "open",
        help="lay out the work root, take the host lock, print the stamps and the verification",
        description=(
            "Create the --layout directories, take the host lock as host_lock acquire does, and"
            " once it is held print the work root's state and the verification of the stamped"
            " stages named by --verify."
        ),
    )
    host_lock.add_acquire_arguments(op)
    op.add_argument(
        "--layout",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="a directory of the work root to create when missing (repeatable)",
    )
    op.add_argument("--state-dir", type=Path, required=True, help="<specfleet_root>/state")
    op.add_argument(
        "--file",
        type=Path,
        action="append",
        default=[],
        metavar="FILE",
        help="a file the play writes when it changed: print its sha1 and mode under `files`"
        " (repeatable)",
    )
    op.add_argument(
        "--verify",
        default="",
        metavar="STAGES",
        help="comma-separated stages to verify when stamped (the play's stages it may skip)",
    )
    cl = sub.add_parser(
        "close",
        help="verify the stamped stages not checked yet, print the state, release the lock",
        description=(
            "Print the verification of every stamped stage but --skip, the work root's state and"
            " (--versions) the stage interpreter's versions, then release the host lock when"
            " --token is given (validate.yml on its own holds none)."
        ),
    )
    cl.add_argument("--state-dir", type=Path, required=True, help="<specfleet_root>/state")
    cl.add_argument(
        "--skip",
        default="",
        metavar="STAGES",
        help="comma-separated stages this run already checked",
    )
    cl.add_argument(
        "--versions",
        action="store_true",
        help="also print the installed versions of the interpreter that speculators_install's"
        " stamp names (stack_report)",
    )
    cl.add_argument(
        "--signature-root",
        type=Path,
        metavar="ROOT",
        help="also print the signature of this work root (<specfleet_root>): a sha256 of its"
        " files' stat facts",
    )
    cl.add_argument(
        "--restore-modes",
        action="store_true",
        help="with --signature-root: first take the write bit for others off whatever has it"
        " under the work root but its venv, listed under restored_modes (and warnings)",
    )
    cl.add_argument("--lock", type=Path, help="<specfleet_root>/run/lock.json")
    cl.add_argument("--token", help="this run's token: release the lock when it holds it")
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "open":
        try:
            restored = lay_out(args.layout)
        except OSError as exc:
            message = f"cannot lay out the work root: {exc}"
            print(json.dumps({"acquired": False, "changed": False, "error": message}))
            print(f"session: {message}", file=sys.stderr)
            return 1
        args.command = "acquire"
        rc, result = host_lock.run(args)
        if rc == 0:
            result["state"] = stamps.load_all(args.state_dir, manifests=False)
            result["verification"] = verification(args.state_dir, _stages(args.verify), set())
            result["files"] = file_facts(args.file)
        result["restored_modes"] = restored
        print(json.dumps(result, sort_keys=True))
        return rc
    if (args.lock is None) != (args.token is None):
        parser.error("close: --lock and --token go together")
    result = {
        "verification": verification(args.state_dir, None, _stages(args.skip)),
        "state": stamps.load_all(args.state_dir, manifests=False),
    }
    if args.versions:
        cache = args.state_dir.parent / "cache" / "installed-versions.json"
        result["versions"] = installed_versions(result["state"], cache)
    if args.signature_root is not None:
        result["signature"], restored = tree_signature(args.signature_root, args.restore_modes)
        if args.restore_modes:
            result["restored_modes"] = restored
            if restored:
                result["warnings"] = [
                    "the work root had what others may write to; set the mode again: "
                    + ", ".join(restored)
                ]
    elif args.restore_modes:
        parser.error("close: --restore-modes goes with --signature-root")
    rc = 0
    if args.token is not None:
        args.command = "release"
        rc, released = host_lock.run(args)
        result.update(released)
    print(json.dumps(result, sort_keys=True))
    return rc


if __name__ == "__main__":
    sys.exit(main())
