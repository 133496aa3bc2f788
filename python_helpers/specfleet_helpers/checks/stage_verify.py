"""The one verifier of a stage's published artifacts, from its stamp alone.

A stamp (`<state>/<stage>.json`, written by roles/stage/tasks/finish.yml) lists what the stage
published (`manifest`: every file with its size, and its sha256 up to HASH_LIMIT_BYTES) and the
stage's own checker (`verify_argv`). Verifying a stage:

  1. every listed file is still there with the recorded size (and checksum where recorded);
  2. the checker runs again on the artifacts; the facts it re-reads (rows, counts, shapes:
     every key it prints except timings) must equal the stamp's metrics.

The skip decision (roles/stage/tasks/begin.yml), playbooks/validate.yml and the testinfra
suite all run this module, so validation finds exactly what a re-run would redo.

Checksums are not recomputed for a file that is unchanged on disk since they were last
computed (git's index does the same): the hash index (<root>/cache/sha256-index.json, a cache
that can be deleted at any time) keeps each file's size, mtime, ctime, inode and device with
the sha256 computed then, and a file whose stat matches is not read again. Any write, truncate,
replace or `touch` changes the stat and the file is hashed again; a file modified within
RACY_WINDOW_NS of its hashing is never trusted from the index (a coarse clock could hide a
second write). On an NPU host this is what keeps a no-op run from re-reading gigabytes.

The checkers' passing results are kept the same way (<root>/cache/checker-results.json): a
checker is not started again while its argv, the stamp, the helpers' sources and every file
under the stage's artifacts keep their stat. An artifact the manifest does not list file by
file counts as a venv counts in the work root's signature (speculators_install's: its
configuration, bin/ and package directories, whose modification times any install or removal
changes; its checker reads the installed distributions' metadata) or, for a file (the
interpreter), by its stat and its target's; any other such artifact (a source tree) means the
checker runs every time, as does a file modified within RACY_WINDOW_NS; a checker that failed
is never kept.

Stamps written before manifests existed (specfleet_stamp_version 1 without `manifest`) are
verified by the checker alone; with --record-missing (begin.yml) a passing check writes the
manifest and the checker into the stamp, so later validations check the files too. Without a
checker either, such a stamp is `unverified`, which the report does not count as passed.

    python -m specfleet_helpers.checks.stage_verify manifest PATH...
    python -m specfleet_helpers.checks.stage_verify check --state-dir D --stage S [--index F]
        [--checker-results F]
    python -m specfleet_helpers.checks.stage_verify check-all --state-dir D [--skip S,...]
        [--files-only] [--index F] [--checker-results F]

Standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

from specfleet_helpers import files as atomic
from specfleet_helpers.host import stamps

# Files up to this size are checksummed. Bigger ones (a verifier's multi-GB shards, long rows'
# hidden states on NPU) are checked by size only: hashing them at every skip decision and every
# validation would cost minutes per host, and a truncated or missing shard changes the size.
# No mtime either: copies and restores (rsync, the controller models source) change it without
# changing a byte, and a false "damaged" would redo a multi-GB download.
HASH_LIMIT_BYTES = 64 * 1024 * 1024
MANIFEST_VERSION = 1
INDEX_VERSION = 1
CHECKER_RESULTS_VERSION = 1
# A file modified this close to its hashing may have been written again within one tick of a
# coarse file-system clock (FAT: 2 s), so its stat proves nothing: it is hashed next time too.
RACY_WINDOW_NS = 3_000_000_000
CHECKER_TIMEOUT_S = 900
# What stands for a venv's ~50,000 files (relative to it): an install or a removal changes
# them (the work root's signature counts a venv the same way: host/session.py).
VENV_MARKERS = ("pyvenv.cfg", "bin", "lib/python*/site-packages", "lib64/python*/site-packages")
# Metrics that are not facts of the files: how long something took, when it happened.
TIMING_KEY = re.compile(r"(^|_)(s|ms|seconds|time|elapsed|duration|started|ended|at)$")
# A checker's top-level keys that report the present state of something running (the serve
# stage's deployed service: its pid, its restarts), not what the files hold: never compared
# with the stamp, never kept (the checker runs every time), and passed on with the check.
LIVE_PREFIX = "live_"


def live_part(fresh: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fresh.items() if k.startswith(LIVE_PREFIX)}


OK, DAMAGED, UNVERIFIED, MISSING = "ok", "damaged", "unverified", "missing"


class VerifyError(Exception):
    """An artifact does not match its stamp; the message names what and how. `output` is a
    failed checker's own output (begin.yml shows it as the reason, as it always did)."""

    output: Optional[str] = None


# --- the manifest ---------------------------------------------------------------------------


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_cache(path: Optional[Path], version: int, field: str) -> dict[str, Any]:
    """`field` of a cache file of this `version`; {} when there is none, or it is damaged or
    of another version (everything is then computed again)."""
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if isinstance(data, dict) and data.get("version") == version:
        return data.get(field) or {}
    return {}


def write_cache(path: Path, version: int, field: str, content: dict[str, Any], what: str) -> None:
    try:
        path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
        atomic.write_json_atomic(path, {"version": version, field: content})
    except OSError as exc:  # a cache: the check's result stands without it
        print(f"stage_verify: {what} {path} not written: {exc}", file=sys.stderr)


class HashIndex:
    """The sha256 of files as last computed, with the stat they had then (see the module doc).
    `path` None: nothing is kept, every file is hashed."""

    def __init__(self, path: Optional[Path]) -> None:
        self.path = path
        self.entries: dict[str, Any] = read_cache(path, INDEX_VERSION, "files")
        self.changed = False

    @staticmethod
    def _stat_key(stat: os.stat_result) -> list[int]:
        return [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino, stat.st_dev]

    def sha256(self, path: Path, stat: os.stat_result) -> str:
        """The file's sha256; `stat` is its stat, taken by the caller."""
        key = self._stat_key(stat)
        entry = self.entries.get(str(path))
        if entry and entry.get("stat") == key:
            return str(entry["sha256"])
        digest = sha256_of(path)
        if self.path is not None:
            hashed_at = time.time_ns()
            if max(stat.st_mtime_ns, stat.st_ctime_ns) < hashed_at - RACY_WINDOW_NS:
                self.entries[str(path)] = {"stat": key, "sha256": digest}
            else:
                self.entries.pop(str(path), None)
            self.changed = True
        return digest

    def save(self) -> None:
        """Write the index once, when it changed; entries of files gone are dropped."""
        if self.path is None or not self.changed:
            return
        kept = {name: entry for name, entry in self.entries.items() if os.path.lexists(name)}
        write_cache(self.path, INDEX_VERSION, "files", kept, "hash index")
        self.changed = False


def _stat_entry(path: Path) -> list[Any]:
    stat = os.lstat(path)
    return [str(path), stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino, stat.st_dev]


def unlisted_entries(top: Path) -> Optional[list[list[Any]]]:
    """The stat entries that stand for an artifact the manifest does not list file by file: a
    venv's markers, or a file and its target; None for anything else (the checker's result
    is then not kept)."""
    if top.is_dir() and not top.is_symlink():
        if not (top / "pyvenv.cfg").is_file():
            return None
        return [_stat_entry(m) for pattern in VENV_MARKERS for m in sorted(top.glob(pattern))]
    if top.is_file():
        return [_stat_entry(top)] + ([_stat_entry(top.resolve())] if top.is_symlink() else [])
    return None


def helpers_sources() -> list[list[Any]]:
    """What identifies this package's sources (a changed checker is a different checker): the
    stat of the source tree's files, or the sha256 of the zip the session ships (a run
    that ships new helpers checks with them beside the old ones, then moves them in place:
    a new path and ctime, the same checkers)."""
    package = Path(__file__).resolve().parents[1]
    if package.is_dir():
        return [_stat_entry(path) for path in sorted(package.rglob("*.py"))]
    archive = next(p for p in package.parents if p.is_file() or not p.name)
    return [["zip", hashlib.sha256(archive.read_bytes()).hexdigest()]]


class CheckerResults:
    """The checkers' passing results, each kept with the stat of what it read (the module doc).
    `path` None: nothing is kept, every checker runs."""

    def __init__(self, path: Optional[Path]) -> None:
        self.path = path
        self.stages: dict[str, Any] = read_cache(path, CHECKER_RESULTS_VERSION, "stages")
        self.changed = False

    @staticmethod
    def key(stamp: dict[str, Any], argv: list[str]) -> Optional[str]:
        """What the checker's result depends on, hashed; None when it may not be kept: an
        artifact path the manifest does not list (a venv), or a file changed too recently."""
        recorded = stamp.get("manifest")
        if not recorded or "stage" not in stamp:
            return None
        listed = set(recorded.get("files", {})) | set(recorded.get("links", {}))
        entries: list[list[Any]] = []
        try:
            for value in sorted(
                v for v in (stamp.get("artifacts") or {}).values() if isinstance(v, str) and v
            ):
                top = Path(value)
                # An artifact the manifest lists nothing of or under (a venv) is not walked.
                inside = value.rstrip(os.sep) + os.sep
                if value not in listed and not any(path.startswith(inside) for path in listed):
                    unlisted = unlisted_entries(top)
                    if unlisted is None:
                        return None
                    entries += unlisted
                    continue
                paths = [top]
                if top.is_dir() and not top.is_symlink():
                    paths = []
                    for dirpath, dirnames, filenames in os.walk(top):
                        here = Path(dirpath)
                        paths += [here / n for n in filenames]
                        paths += [here / d for d in dirnames if (here / d).is_symlink()]
                # An artifact the manifest skips (a venv): the stat of its files proves nothing
                # the checker relies on. Files added beside listed ones are in the key, listed
                # or not: a checker may count them.
                if not any(str(path) in listed for path in paths):
                    return None
                entries += [_stat_entry(path) for path in sorted(paths)]
        except OSError:
            return None  # a file went missing: the manifest check names it
        newest = max((max(e[2], e[3]) for e in entries), default=0)
        if newest >= time.time_ns() - RACY_WINDOW_NS:
            return None
        material = {
            "argv": list(argv),
            "run_id": stamp.get("run_id"),
            "fingerprint": stamp.get("fingerprint"),
            "metrics": stamp.get("metrics"),
            "artifacts": entries,
            "helpers": helpers_sources(),
        }
        return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()

    def get(self, stage: str, key: str) -> Optional[dict[str, Any]]:
        entry = self.stages.get(stage)
        if (
            isinstance(entry, dict)
            and entry.get("key") == key
            and isinstance(entry.get("fresh"), dict)
        ):
            return dict(entry["fresh"])
        return None

    def put(self, stage: str, key: str, fresh: dict[str, Any]) -> None:
        self.stages[stage] = {"key": key, "fresh": fresh}
        self.changed = True

    def save(self) -> None:
        if self.path is None or not self.changed:
            return
        write_cache(self.path, CHECKER_RESULTS_VERSION, "stages", self.stages, "checker results")
        self.changed = False


def default_index(state_dir: Path) -> Path:
    """<root>/cache/sha256-index.json beside <root>/state (roles/specfleet/vars/main/paths.yml)."""
    return state_dir.parent / "cache" / "sha256-index.json"


def default_checker_results(state_dir: Path) -> Path:
    """<root>/cache/checker-results.json, beside the hash index."""
    return state_dir.parent / "cache" / "checker-results.json"


def _file_entry(path: Path, index: HashIndex) -> dict[str, Any]:
    stat = path.stat()
    entry: dict[str, Any] = {"size": stat.st_size}
    if stat.st_size <= HASH_LIMIT_BYTES:
        entry["sha256"] = index.sha256(path, stat)
    return entry


def manifest(paths: list[Path], index: Optional[HashIndex] = None) -> dict[str, Any]:
    """What the artifact paths (files or directories) hold now. Symlinks are recorded as links
    (a checkpoint's `checkpoint_best` names an epoch directory listed on its own). With
    `index`, the checksums computed go into it, so the next verification does not read the
    files again."""
    index = index or HashIndex(None)
    files: dict[str, Any] = {}
    links: dict[str, str] = {}

    def add(path: Path) -> None:
        if path.is_symlink():
            links[str(path)] = os.readlink(path)
        elif path.is_file():
            files[str(path)] = _file_entry(path, index)

    for top in paths:
        if top.is_dir() and not top.is_symlink():
            for dirpath, dirnames, filenames in os.walk(top):
                dirnames.sort()
                for name in sorted(filenames) + [
                    d for d in dirnames if (Path(dirpath) / d).is_symlink()
                ]:
                    add(Path(dirpath) / name)
        elif top.is_symlink() or top.exists():
            add(top)
        else:
            raise VerifyError(f"artifact {top} does not exist")
    return {
        "version": MANIFEST_VERSION,
        "hash_limit_bytes": HASH_LIMIT_BYTES,
        "files": files,
        "links": links,
    }


def check_manifest(recorded: dict[str, Any], index: Optional[HashIndex] = None) -> int:
    """Raise VerifyError naming the first file that differs from the manifest; return the
    number of files checked. With `index`, a file unchanged since its last hashing is not
    read again."""
    index = index or HashIndex(None)
    for name, target in sorted(recorded.get("links", {}).items()):
        path = Path(name)
        if not path.is_symlink():
            raise VerifyError(f"{name} is missing (the stamp lists a link to {target})")
        if os.readlink(path) != target:
            raise VerifyError(f"{name} links to {os.readlink(path)}, the stamp recorded {target}")
    files = recorded.get("files", {})
    for name, entry in sorted(files.items()):
        path = Path(name)
        if not path.is_file():
            raise VerifyError(f"{name} is missing (the stamp lists {entry['size']} bytes)")
        stat = path.stat()
        if stat.st_size != entry["size"]:
            raise VerifyError(
                f"{name} has {stat.st_size} bytes, the stamp recorded {entry['size']}"
            )
        if "sha256" in entry and index.sha256(path, stat) != entry["sha256"]:
            raise VerifyError(f"{name} changed: its sha256 differs from the stamp's")
    return len(files)


# --- the checker ----------------------------------------------------------------------------


def _last_json(stdout: str) -> Optional[dict[str, Any]]:
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        return None
    try:
        data = json.loads(lines[-1])
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def compare_metrics(fresh: dict[str, Any], recorded: dict[str, Any], where: str = "") -> list[str]:
    """Keys (dotted) whose re-read value differs from the stamp's; timings are skipped, and so
    are keys the stamp does not have (a newer checker may print more)."""
    differ = []
    for key, value in sorted(fresh.items()):
        name = f"{where}{key}"
        if (
            TIMING_KEY.search(key)
            or key not in recorded
            or (not where and key.startswith(LIVE_PREFIX))
        ):
            continue
        old = recorded[key]
        if isinstance(value, dict) and isinstance(old, dict):
            differ += compare_metrics(value, old, name + ".")
        elif value != old and not (_is_num(value) and _is_num(old) and float(value) == float(old)):
            differ.append(
                f"{name} is {json.dumps(value)} in the files, {json.dumps(old)} in the stamp"
            )
    return differ


def _is_num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def run_checker(argv: list[str]) -> dict[str, Any]:
    """Run the stage's checker; raise VerifyError when it fails (its own output in `.output`).
    Returns the facts it printed (its last line, when that is a JSON object), else {}."""
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=CHECKER_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise VerifyError(f"checker {argv[0]} could not run: {exc}") from exc
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()
        error = VerifyError(
            f"checker exited {done.returncode}: {said[-1] if said else 'no output'}"
        )
        error.output = f"{done.stdout} {done.stderr}".strip()
        raise error
    return _last_json(done.stdout) or {}


# --- one stage ------------------------------------------------------------------------------


def verify(
    stamp: dict[str, Any],
    checker: Optional[list[str]] = None,
    use_checker: bool = True,
    index: Optional[HashIndex] = None,
    results: Optional[CheckerResults] = None,
) -> dict[str, Any]:
    """{"status": ok|damaged|unverified, "problem": str|None, "files": n, "metrics": [...],
    "checker": ran|kept|none}. `checker` overrides the stamp's recorded verify_argv (begin.yml
    passes the role's); `results` serves and keeps the checker's passing result."""
    argv = checker if checker is not None else stamp.get("verify_argv")
    recorded = stamp.get("manifest")
    out: dict[str, Any] = {"status": OK, "problem": None, "files": None, "metrics": []}
    if recorded is None and not argv:
        if checker is not None:
            return out  # the role has no checker for it: the stamp decides, as it always did
        out.update(
            status=UNVERIFIED,
            problem="the stamp lists no files and no checker (written by an older specfleet);"
            " the next site.yml run verifies the stage and records them",
        )
        return out
    # The checker first: where it fails, its message says more than a size or a checksum.
    key = results.key(stamp, list(argv)) if results and argv and use_checker else None
    kept = results.get(str(stamp["stage"]), key) if results and key else None
    out["checker"] = "kept" if kept is not None else "ran" if argv and use_checker else "none"
    try:
        fresh = (
            kept if kept is not None else run_checker(list(argv)) if argv and use_checker else {}
        )
        if recorded is not None:
            out["files"] = check_manifest(recorded, index)
        metrics = stamp.get("metrics") or {}
        differ = compare_metrics(fresh, metrics)
        if differ:
            raise VerifyError("metrics disagree with the files: " + "; ".join(differ))
        out["metrics"] = sorted(
            k
            for k in fresh
            if k in metrics and not TIMING_KEY.search(k) and not k.startswith(LIVE_PREFIX)
        )
        live = live_part(fresh)
        if live:
            out["live"] = live
        elif results and key and kept is None:
            results.put(str(stamp["stage"]), key, fresh)
    except VerifyError as exc:
        out.update(status=DAMAGED, problem=str(exc))
        if exc.output:
            out["output"] = exc.output
    return out


def run_id(fingerprint: str, ended: Optional[str]) -> str:
    """A stage's run id: new every time it really runs (downstream stages fingerprint it), the
    sha256 of its fingerprint and its end (now, for a stage without a script), 16 digits."""
    ended = ended or datetime.now(timezone.utc).isoformat()
    return hashlib.sha256(f"{fingerprint}{ended}".encode()).hexdigest()[:16]


def publish(
    state_dir: Path,
    stamp: dict[str, Any],
    paths: list[Path],
    checker: Optional[list[str]] = None,
    metrics: Optional[dict[str, Any]] = None,
    index: Optional[HashIndex] = None,
    results: Optional[CheckerResults] = None,
) -> dict[str, Any]:
    """Stamp a stage that just ran (roles/stage/tasks/finish.yml): its checker on the new
    artifacts (or the `metrics` its role already read), the manifest of `paths`, then the
    stamp, written at once. {"ok", "run_id", "metrics", "files", "output"}: `output` is the
    checker's own words when it failed; nothing is written then. With `index` and `results`,
    the checksums and the checker's result are kept as a verification keeps them: the next
    run's verification of these artifacts reads them again only where they changed."""
    try:
        fresh = run_checker(checker) if checker is not None else dict(metrics or {})
        listed = manifest(paths, index)
    except VerifyError as exc:
        return {
            "ok": False,
            "run_id": None,
            "metrics": None,
            "files": None,
            "output": exc.output or str(exc),
        }
    rid = stamp.get("run_id") or run_id(str(stamp["fingerprint"]), stamp.get("ended"))
    written = {**stamp, "run_id": rid, "metrics": fresh, "manifest": listed}
    stamps.write(state_dir, written)
    (state_dir / f"{written['stage']}.failed.json").unlink(missing_ok=True)
    if results is not None and checker is not None and not live_part(fresh):
        key = results.key(written, list(checker))
        if key is not None:
            results.put(str(written["stage"]), key, fresh)
    return {
        "ok": True,
        "run_id": rid,
        "metrics": fresh,
        "files": len(listed["files"]),
        "output": "",
    }


def record_missing(
    state_dir: Path,
    stamp: dict[str, Any],
    checker: list[str],
    unlisted: frozenset[str] = frozenset(),
) -> bool:
    """Give a manifest-less stamp its manifest and checker, once they verified; True if
    written. Artifacts named in `unlisted` (a venv: its own checker covers it) are left out,
    as finish.yml leaves them out of a new stamp."""
    if "manifest" in stamp:
        return False
    paths = [
        Path(v)
        for k, v in (stamp.get("artifacts") or {}).items()
        if isinstance(v, str) and v and k not in unlisted
    ]
    stamp = {
        **stamp,
        "manifest": manifest([p for p in paths if p.exists() or p.is_symlink()]),
        "verify_argv": checker,
    }
    stamps.write(state_dir, stamp)
    return True


def line(stage: str, result: dict[str, Any]) -> str:
    if result["status"] == OK:
        files = "" if result["files"] is None else f"{result['files']} files as stamped"
        how = (
            "as last re-read (checker result kept)"
            if result.get("checker") == "kept"
            else "re-read"
        )
        metrics = f"metrics {', '.join(result['metrics'])} {how}" if result["metrics"] else ""
        return f"{stage}: ok" + (
            f" ({'; '.join(x for x in (files, metrics) if x)})" if files or metrics else ""
        )
    return f"{stage}: {result['status']}: {result['problem']}"


def check_all(
    state_dir: Path,
    skip: set[str],
    use_checker: bool = True,
    index: Optional[HashIndex] = None,
    results: Optional[CheckerResults] = None,
) -> dict[str, dict[str, Any]]:
    """Every stamped stage of a work root except `skip`, in stamp-file order."""
    return {
        stage: verify(stamp, use_checker=use_checker, index=index, results=results)
        for stage, stamp in stamps.load(state_dir).items()
        if stage not in skip
    }


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specfleet_helpers.checks.stage_verify",
        description="Verify a stage's artifacts against its stamp (files, then its checker).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("manifest", help="print the manifest of artifact paths as JSON")
    m.add_argument("paths", nargs="*", type=Path)
    pub = sub.add_parser(
        "publish",
        help="stamp a stage that just ran: its checker (or --metrics-json), the file list, then"
        " the stamp; print {ok, run_id, metrics, files, output}",
    )
    pub.add_argument("--state-dir", type=Path, required=True, help="<specfleet_root>/state")
    pub.add_argument(
        "--stamp-json",
        required=True,
        help="the stamp but its manifest and metrics (finish.yml); its run_id is made here when"
        " it has none",
    )
    given = pub.add_mutually_exclusive_group(required=True)
    given.add_argument("--checker-json", help="the stage's checker argv as a JSON list")
    given.add_argument("--metrics-json", help="the metrics its role already read, as JSON")
    pub.add_argument("paths", nargs="*", type=Path, help="the artifact paths the stamp lists")
    c = sub.add_parser("check", help="verify one stage; exit 1 with one line when it does not")
    c.add_argument("--state-dir", type=Path, required=True, help="<specfleet_root>/state")
    c.add_argument("--stage", required=True)
    c.add_argument(
        "--checker-json",
        help="the checker argv as a JSON list instead of the stamp's (begin.yml: the role's)",
    )
    c.add_argument(
        "--reason",
        action="store_true",
        help="print only what is wrong (a failed checker's own output), for begin.yml's reason",
    )
    c.add_argument(
        "--record-missing",
        action="store_true",
        help="write the manifest and checker into an older stamp that has none, once it verified",
    )
    c.add_argument(
        "--unlisted",
        default="",
        help="with --record-missing: comma-separated artifact names not to list file by file",
    )
    a = sub.add_parser("check-all", help="verify every stamped stage; print {stage: result}")
    a.add_argument("--state-dir", type=Path, required=True, help="<specfleet_root>/state")
    a.add_argument("--skip", default="", help="comma-separated stages not to verify")
    a.add_argument(
        "--files-only",
        action="store_true",
        help="check the listed files only, not the checkers (the testinfra suite's form)",
    )
    for command in (pub, c, a):
        command.add_argument(
            "--index",
            type=Path,
            help="the hash index (default: <state-dir>/../cache/sha256-index.json); 'none': hash"
            " every file",
        )
        command.add_argument(
            "--checker-results",
            type=Path,
            help="the checkers' kept results (default: <state-dir>/../cache/checker-results.json);"
            " 'none': run every checker",
        )
    args = parser.parse_args(argv)

    if args.command == "manifest":
        try:
            print(json.dumps(manifest(args.paths), sort_keys=True))
        except (OSError, VerifyError) as exc:
            print(f"manifest: {exc}", file=sys.stderr)
            return 1
        return 0
    index = HashIndex(
        None if str(args.index) == "none" else args.index or default_index(args.state_dir)
    )
    kept = CheckerResults(
        None
        if str(args.checker_results) == "none"
        else args.checker_results or default_checker_results(args.state_dir)
    )
    if args.command == "publish":
        result = publish(
            args.state_dir,
            json.loads(args.stamp_json),
            args.paths,
            checker=json.loads(args.checker_json) if args.checker_json else None,
            metrics=json.loads(args.metrics_json) if args.metrics_json else None,
            index=index,
            results=kept,
        )
        index.save()
        kept.save()
        print(json.dumps(result, sort_keys=True))
        return 0 if result["ok"] else 1
    if args.command == "check-all":
        skip = {s for s in args.skip.split(",") if s}
        results = check_all(args.state_dir, skip, not args.files_only, index, kept)
        index.save()
        kept.save()
        print(json.dumps(results, sort_keys=True))
        return 0
    stamp = stamps.load(args.state_dir).get(args.stage)
    if stamp is None:
        print(f"{args.stage}: {MISSING}: no readable stamp in {args.state_dir}")
        return 1
    checker = json.loads(args.checker_json) if args.checker_json else None
    result = verify(stamp, checker, index=index, results=kept)
    index.save()
    kept.save()
    if (
        result["status"] == OK
        and args.record_missing
        and checker is not None
        and record_missing(
            args.state_dir, stamp, checker, frozenset(u for u in args.unlisted.split(",") if u)
        )
    ):
        result["recorded"] = True
    if args.reason and result["status"] != OK:
        print(result.get("output") or result["problem"])
    else:
        print(line(args.stage, result) + (" (manifest recorded)" if result.get("recorded") else ""))
    return 0 if result["status"] == OK else 1


if __name__ == "__main__":
    sys.exit(main())
