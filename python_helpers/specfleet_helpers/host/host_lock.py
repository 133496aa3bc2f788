"""Take, refresh and release the host lock that keeps two specfleet runs off one host at once.

Two ansible-playbook runs against the same host must never interleave stages: the second
run's stage supervisor would even end the first run's stage, taking it for a leftover of
an interrupted run. So every run takes ``<specfleet_root>/run/lock.json`` at its start and
holds it for the whole playbook.

Ansible cannot hold a file descriptor open across tasks, so the lock is a FILE naming its
owner by a token (one per playbook run), refreshed by a heartbeat (every stage poll, every
few seconds):

    {"token": ..., "owner": {...}, "acquired": "<ISO UTC>", "heartbeat": "<ISO UTC>",
     "heartbeat_epoch": <float, this host's clock>}

Another run takes the lock over only when it is abandoned: the controller found its owner
process gone (``--break-token``), its heartbeat is older than ``--stale-after-s``, or the file
cannot be read. A run never removes a lock it does not own. Taking a lock over also stops what
the abandoned run left running in the lock's directory (``<root>/run``): its detached stages,
each ended through its recorded process group (procs), which holds everything the stage
started, its vLLM server included. Their stamps were withdrawn when they started, so the new
run redoes them anyway; left running, they would hold the ports, memory and files it needs
(the new run's preflight would find the hidden-states port in use, for one).

A leaf of the host runtime: it imports no runner (stage_run imports it for the heartbeat of
every stage poll), only the process records of procs and the atomic write of files.

Every change is made under ``fcntl.flock`` of a sidecar ``<lock>.guard`` file, so two helpers
on the same host never race between reading the lock and replacing it; the lock itself is
created with ``os.link`` (fails if it exists) and replaced with ``os.rename``, so readers
never see half a file. The guard file stays in place: removing it could let two helpers
lock different inodes. The lock's directory must exist; it is not created here.

Exit status: 0 done; 4 the lock is held by another run (acquire) or no longer ours
(heartbeat); 1 other failures (e.g. the lock's directory is missing); 2 bad usage.
Every subcommand prints one JSON line; errors also go to stderr as one line.
Standard library only.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional, Union

from specfleet_helpers.files import tmp_sibling, write_json_atomic
from specfleet_helpers.host import procs

PROG = "python -m specfleet_helpers.host.host_lock"
EXIT_HELD = 4
DEFAULT_STALE_AFTER_S = 900.0
DEFAULT_POLL_S = 1.0
GUARD_SUFFIX = ".guard"
# Shown first, in this order, when a lock's owner is described; other keys follow.
OWNER_FIELDS = ("controller", "pid", "user", "playbook")

PathLike = Union[str, os.PathLike]


class LockError(Exception):
    """The lock cannot be used at all (missing directory, file system error)."""


# --------------------------------------------------------------------------------------
# The lock file
# --------------------------------------------------------------------------------------


def _iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def _load(path: Path) -> tuple[str, Optional[dict[str, Any]]]:
    """("absent", None), ("corrupt", None) or ("ok", lock).

    A lock counts as readable only with a non-empty string token and a numeric heartbeat:
    without them nobody can tell whose it is or whether it is alive.
    """
    try:
        text = path.read_text()
    except FileNotFoundError:
        return "absent", None
    except OSError:
        return "corrupt", None
    try:
        data = json.loads(text)
    except ValueError:
        return "corrupt", None
    if not isinstance(data, dict):
        return "corrupt", None
    token = data.get("token")
    epoch = data.get("heartbeat_epoch")
    if not isinstance(token, str) or not token:
        return "corrupt", None
    if isinstance(epoch, bool) or not isinstance(epoch, (int, float)):
        return "corrupt", None
    return "ok", data


def _holder(lock: dict[str, Any], now: float) -> dict[str, Any]:
    """The lock as reported to another run: its contents plus how old its heartbeat is."""
    return {**lock, "heartbeat_age_s": round(now - float(lock["heartbeat_epoch"]), 1)}


def describe(holder: dict[str, Any]) -> str:
    """'run TOKEN (owner: controller c1, pid 12, ..., started ...), last heartbeat N s ago'."""
    owner = holder.get("owner")
    owner = owner if isinstance(owner, dict) else {}
    parts = [f"{key} {owner[key]}" for key in OWNER_FIELDS if owner.get(key) not in (None, "")]
    parts += [
        f"{key} {value}"
        for key, value in sorted(owner.items())
        if key not in OWNER_FIELDS
        and isinstance(value, (str, int, float))
        and not isinstance(value, bool)
        and value != ""
    ]
    if holder.get("acquired"):
        parts.append(f"started {holder['acquired']}")
    text = f"run {holder.get('token')}"
    if parts:
        text += f" (owner: {', '.join(parts)})"
    age = holder.get("heartbeat_age_s")
    if isinstance(age, (int, float)):
        text += f", last heartbeat {max(0, round(age))} s ago"
    return text


def _write_tmp(path: Path, data: dict[str, Any]) -> Path:
    tmp = tmp_sibling(path)
    tmp.write_text(json.dumps(data, sort_keys=True) + "\n")
    return tmp


def _create(path: Path, data: dict[str, Any]) -> bool:
    """Create the lock with the complete content; False if a lock file already exists."""
    tmp = _write_tmp(path, data)
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
        # A file system without hard links: exclusive create. A crash mid-write leaves an
        # unreadable lock, which the next run takes over.
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as fh:
            fh.write(tmp.read_text())
        return True
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def _replace(path: Path, data: dict[str, Any]) -> None:
    write_json_atomic(path, data)


@contextlib.contextmanager
def _guard(path: Path) -> Iterator[None]:
    """Hold flock on <lock>.guard: every read-then-change of the lock happens inside it."""
    guard = Path(str(path) + GUARD_SUFFIX)
    # Read-only is enough for flock, so a guard created by another user still works.
    fd = os.open(guard, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the flock


def _check_dir(path: Path) -> None:
    if not path.parent.is_dir():
        raise LockError(f"cannot take host lock {path}: its directory {path.parent} does not exist")


def _new_lock(token: str, owner: dict[str, Any], now: float) -> dict[str, Any]:
    return {
        "token": token,
        "owner": owner,
        "acquired": _iso(now),
        "heartbeat": _iso(now),
        "heartbeat_epoch": now,
    }


def _refreshed(lock: dict[str, Any], now: float) -> dict[str, Any]:
    return {**lock, "heartbeat": _iso(now), "heartbeat_epoch": now}


# --------------------------------------------------------------------------------------
# Operations
# --------------------------------------------------------------------------------------


def read(path: PathLike) -> dict[str, Any]:
    """The lock's contents, or {} when it is absent or unreadable."""
    state, lock = _load(Path(path))
    return lock if state == "ok" and lock is not None else {}


def _held_message(path: Path, holder: dict[str, Any]) -> str:
    return (
        f"host lock {path} is held by {describe(holder)}. Wait for that run to finish, or"
        f" raise specfleet_lock_wait_s; if that run is dead, remove {path}."
    )


def _try_acquire(
    path: Path,
    token: str,
    owner: dict[str, Any],
    stale_after_s: float,
    break_token: Optional[str],
) -> dict[str, Any]:
    """One attempt; the caller holds the guard."""
    for _ in range(3):
        state, lock = _load(path)
        now = time.time()
        if state == "absent":
            if _create(path, _new_lock(token, owner, now)):
                return {"acquired": True, "changed": True, "broke": None}
            continue  # created by someone not using the guard: judge it like any other
        if state == "ok" and lock is not None and lock["token"] == token:
            _replace(path, _refreshed(lock, now))
            return {"acquired": True, "changed": False, "broke": None}
        why = None
        if state == "corrupt" or lock is None:
            why = "unreadable lock file"
        elif break_token and lock["token"] == break_token:
            why = "owner process gone"
        else:
            age = now - float(lock["heartbeat_epoch"])
            if age > stale_after_s:
                why = f"heartbeat {age:.0f} s old"
        if why is None:
            assert lock is not None
            holder = _holder(lock, now)
            return {
                "acquired": False,
                "changed": False,
                "holder": holder,
                "message": _held_message(path, holder),
            }
        broke = {
            "token": lock.get("token") if lock else None,
            "owner": lock.get("owner") if lock else None,
            "heartbeat": lock.get("heartbeat") if lock else None,
            "why": why,
        }
        _replace(path, _new_lock(token, owner, now))
        return {"acquired": True, "changed": True, "broke": broke}
    # Only when something that is not a readable file keeps appearing at PATH (e.g. a
    # dangling symlink): os.link refuses it, yet it cannot be read.
    raise LockError(f"cannot create host lock {path}: something other than a lock file is there")


def end_abandoned_work(run_dir: Path) -> list[str]:
    """Stop what an abandoned run left running under `run_dir`: every stage recorded there
    (NAME.pid), ended through its process group, which takes the servers the stage started
    with it (their records are forgotten then). Returns what was running, e.g.
    ["stage hidden_states", "server hidden_states"]."""
    stopped = []
    for path in sorted(run_dir.glob(f"*{procs.STAGE_RECORD}")):
        record = procs.read_json(path)
        if record is None or "pgid" not in record:
            continue
        name, pgid = path.name[: -len(procs.STAGE_RECORD)], int(record["pgid"])
        servers = [s for s, pids in procs.servers_of_group(run_dir, pgid).items() if pids]
        if procs.end_stage(record):
            stopped.append(f"stage {name}")
            stopped += [f"server {server}" for server in servers]
        procs.forget_dead_servers(run_dir, pgid)
        # Its supervisor is gone, so nobody else removes the record of the ended stage.
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    return stopped


def acquire(
    path: PathLike,
    token: str,
    owner: dict[str, Any],
    wait_s: float = 0.0,
    stale_after_s: float = DEFAULT_STALE_AFTER_S,
    break_token: Optional[str] = None,
    poll_s: float = DEFAULT_POLL_S,
    end_abandoned: bool = True,
) -> dict[str, Any]:
    """Take the lock for `token`, waiting up to `wait_s` for another run to let go.

    Returns {"acquired": True, "changed": bool, "broke": None | {token, owner, heartbeat,
    why, stopped}} or, when another run still holds it, {"acquired": False, "changed": False,
    "holder": {...lock, heartbeat_age_s}, "message": str}. With `end_abandoned`, taking over
    a lock first stops what its run left running (end_abandoned_work): `stopped` lists it,
    and `why` says so.
    """
    path = Path(path)
    if not token:
        raise LockError("the lock token must not be empty")
    _check_dir(path)
    deadline = time.monotonic() + max(0.0, wait_s)
    while True:
        with _guard(path):
            result = _try_acquire(path, token, owner, stale_after_s, break_token)
        broke = result.get("broke")
        if broke is not None:
            # Outside the guard (stopping a server takes seconds); the lock is ours already.
            broke["stopped"] = end_abandoned_work(path.parent) if end_abandoned else []
            if broke["stopped"]:
                broke["why"] += f"; stopped what it left running: {', '.join(broke['stopped'])}"
        remaining = deadline - time.monotonic()
        if result["acquired"] or remaining <= 0:
            return result
        time.sleep(min(poll_s, remaining))


def _lost_message(path: Path, state: str, lock: Optional[dict[str, Any]], now: float) -> str:
    if state == "absent":
        return f"lock lost: host lock {path} no longer exists (released or removed by hand)"
    if state == "corrupt" or lock is None:
        return f"lock lost: host lock {path} is unreadable"
    return (
        f"lock lost: host lock {path} is now held by {describe(_holder(lock, now))}"
        " (this run's heartbeat went stale, or the lock was broken)"
    )


def _not_ours(path: Path, state: str, lock: Optional[dict[str, Any]], key: str) -> dict[str, Any]:
    now = time.time()
    return {
        key: False,
        "holder": _holder(lock, now) if state == "ok" and lock is not None else None,
        "message": _lost_message(path, state, lock, now),
    }


def heartbeat(path: PathLike, token: str) -> dict[str, Any]:
    """Refresh the heartbeat if the lock is ours: {"held": True}.

    Otherwise {"held": False, "holder": lock or None, "message": str}, having only read the
    lock file (no guard, no write): cheap enough for every stage poll.
    """
    path = Path(path)
    state, lock = _load(path)
    if state != "ok" or lock is None or lock["token"] != token:
        return _not_ours(path, state, lock, "held")
    with _guard(path):
        state, lock = _load(path)  # again: it may have been taken over meanwhile
        if state != "ok" or lock is None or lock["token"] != token:
            return _not_ours(path, state, lock, "held")
        _replace(path, _refreshed(lock, time.time()))
    return {"held": True}


def release(path: PathLike, token: str) -> dict[str, Any]:
    """Remove the lock if it is ours: {"released": True, "stopped": [...]}; never remove
    another run's lock ({"released": False, "holder": lock or None}).

    What the run still has running under the lock's directory is ended first, while the lock
    is still held (end_abandoned_work; `stopped` lists it): a job it started ahead of a stage
    that never came (a server started early, before an earlier stage failed) must not outlive
    the run."""
    path = Path(path)
    state, lock = _load(path)
    if state == "ok" and lock is not None and lock["token"] == token:
        stopped = end_abandoned_work(path.parent)
        with _guard(path):
            state, lock = _load(path)
            if state == "ok" and lock is not None and lock["token"] == token:
                path.unlink()
                return {"released": True, "stopped": stopped}
    now = time.time()
    return {
        "released": False,
        "holder": _holder(lock, now) if state == "ok" and lock is not None else None,
    }


# --------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0:  # also rejects nan
        raise argparse.ArgumentTypeError(f"must be >= 0: {text!r}")
    return value


def _positive_seconds(text: str) -> float:
    value = _seconds(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
    return value


def add_acquire_arguments(acq: argparse.ArgumentParser) -> None:
    """The arguments of `acquire`, shared with session open (which takes the lock too)."""
    acq.add_argument("--lock", required=True, type=Path, help="<specfleet_root>/run/lock.json")
    acq.add_argument("--token", required=True, help="this run's token (unique per run)")
    acq.add_argument(
        "--owner",
        required=True,
        type=_json_object,
        metavar="JSON",
        help='JSON object describing this run, e.g. {"controller": ..., "pid": ...,'
        ' "user": ..., "playbook": ...}',
    )
    acq.add_argument(
        "--wait-s",
        type=_seconds,
        default=0.0,
        metavar="N",
        help="seconds to wait for another run to release the lock (default 0)",
    )
    acq.add_argument(
        "--stale-after-s",
        type=_positive_seconds,
        default=DEFAULT_STALE_AFTER_S,
        metavar="M",
        help="take over a lock whose heartbeat is older than this (default %(default).0f)",
    )
    acq.add_argument(
        "--break-token",
        metavar="TOKEN2",
        help="take over the lock if TOKEN2 holds it (the controller found its owner dead)",
    )
    acq.add_argument(
        "--keep-abandoned",
        action="store_true",
        help="when taking over a lock, leave the stages and servers its run left running "
        "(default: stop them)",
    )
    acq.add_argument(
        "--poll-s",
        type=_positive_seconds,
        default=DEFAULT_POLL_S,
        metavar="S",
        help="seconds between looks at the lock while waiting (default %(default).0f)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "Take, refresh, release or read the specfleet host lock "
            "(<specfleet_root>/run/lock.json) that keeps two runs off one host at once. "
            "Prints one JSON line."
        ),
        epilog=(
            "Exit status: 0 done; 4 held by another run (acquire) or no longer ours "
            "(heartbeat); 1 other failures (e.g. the lock's directory is missing); "
            "2 bad usage. Errors are one line on stderr."
        ),
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    acq = sub.add_parser(
        "acquire",
        help="take the lock for TOKEN, waiting for another run up to --wait-s",
        description=(
            "Create the lock for TOKEN, or refresh its heartbeat if TOKEN already holds it. "
            "A lock of another run is taken over when its token is --break-token, its "
            "heartbeat is older than --stale-after-s, or it cannot be read; otherwise wait "
            "up to --wait-s for it to be released. Prints {acquired, changed, broke}; "
            "exit 4 with {acquired: false, holder} if the other run still holds it."
        ),
    )
    add_acquire_arguments(acq)

    hb = sub.add_parser(
        "heartbeat",
        help="refresh the heartbeat of our lock; exit 4 if it is no longer ours",
        description=(
            "Refresh the heartbeat if TOKEN holds the lock and print {held: true}; "
            "otherwise change nothing, print {held: false, holder} and exit 4."
        ),
    )
    rel = sub.add_parser(
        "release",
        help="remove the lock if it is ours",
        description=(
            "Remove the lock if TOKEN holds it ({released: true, stopped}), after ending "
            "what the run still has running under the lock's directory (stopped lists it); "
            "an absent lock or another run's is left alone ({released: false}, exit 0)."
        ),
    )
    for p in (hb, rel):
        p.add_argument("--lock", required=True, type=Path, help="<specfleet_root>/run/lock.json")
        p.add_argument("--token", required=True, help="this run's token")

    rd = sub.add_parser(
        "read",
        help="print the lock, or {} when absent or unreadable",
        description="Print the lock's contents as JSON, or {} when absent or unreadable.",
    )
    rd.add_argument("--lock", required=True, type=Path, help="<specfleet_root>/run/lock.json")
    return parser


def _error(message: str) -> None:
    print(f"host_lock: {' '.join(message.split())}", file=sys.stderr)


RESULT_KEY = {"acquire": "acquired", "heartbeat": "held", "release": "released"}


def run(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    """Run the parsed acquire, heartbeat or release: (exit status, the JSON line's object);
    a failure is also said on stderr."""
    try:
        if args.command == "acquire":
            result = acquire(
                args.lock,
                args.token,
                args.owner,
                wait_s=args.wait_s,
                stale_after_s=args.stale_after_s,
                break_token=args.break_token,
                poll_s=args.poll_s,
                end_abandoned=not args.keep_abandoned,
            )
        elif args.command == "heartbeat":
            result = heartbeat(args.lock, args.token)
        else:
            result = release(args.lock, args.token)
    except (LockError, OSError) as exc:
        message = str(exc) if isinstance(exc, LockError) else f"{args.command} {args.lock}: {exc}"
        key = RESULT_KEY[args.command]
        failed: dict[str, Any] = {key: False, "error": message}
        if args.command == "acquire":
            failed["changed"] = False
        _error(message)
        return 1, failed
    if args.command != "release" and not result[RESULT_KEY[args.command]]:
        _error(result["message"])
        return EXIT_HELD, result
    return 0, result


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "read":
        print(json.dumps(read(args.lock), sort_keys=True))
        return 0
    rc, result = run(args)
    print(json.dumps(result, sort_keys=True))
    return rc


if __name__ == "__main__":
    sys.exit(main())
