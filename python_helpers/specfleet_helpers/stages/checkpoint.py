"""Publish the trained DFlash draft from a speculators save directory, and verify it.

speculators.train (0.9.0) writes, under ``--save-path``::

    <save>/<N>/                config.json, model.safetensors, config.py,
                               optimizer_state_dict.pt, scheduler_state_dict.pt,
                               training_state.json, val_metrics.json, train_command.txt
    <save>/checkpoint_best  -> N   (relative symlink: the epoch with the lowest val loss)
    <save>/epoch<N>_end     -> N   (or epoch<N>_step<M> for a mid-epoch checkpoint)
    <save>/run.yaml, train_command.txt

``publish`` picks the best checkpoint (``checkpoint_best``, else the highest epoch), copies
only ``config.json`` and ``model.safetensors`` (what ``vllm serve --speculative-config
'{"method":"dflash","model":DRAFT_DIR}'`` loads) into a temporary sibling of DRAFT_DIR,
checks the copy, and renames it into place: an existing DRAFT_DIR is swapped atomically
(``renameat2(RENAME_EXCHANGE)`` on Linux; elsewhere two renames with roll-back) and is
only replaced once the new one is complete. If DRAFT_DIR already holds the same two files,
nothing is written (``changed: false``).

Metrics: the checkpoint's ``val_metrics.json`` / ``training_state.json``, and from the
training log every ``val/<name>=<number>`` and ``train/<name>=<number>`` (last value per
key). speculators logs through rich, which wraps long lines at the terminal width (set a
wide ``COLUMNS`` for the trainer) and may add colour codes; both are undone here. The
validation loss is ``loss_epoch`` of the checkpoint's ``val_metrics.json``, else
``val/loss_epoch`` of the log line for the checkpoint's epoch, else the last one logged.

``verify`` checks that DRAFT_DIR holds exactly ``config.json`` (a JSON object) and
``model.safetensors`` (a valid, non-empty safetensors file); with ``--published`` it then
requires the finite validation loss publish recorded and prints that record: the train
stage's verifier, whose output is the stamp's metrics.

Outputs (one JSON line on stdout):
  publish: {"path", "source_checkpoint", "selected_by", "epoch", "changed", "files":
           [{"name", "size", "sha256"}], "metrics": {"val_loss", "val_loss_finite",
           "val_loss_source", "log", "val_metrics", "training_state"}}
  verify:  {"path", "ok", "problems", "files": [{"name", "size"}], "tensors"}
Exit status: 0 done, 1 failed (no usable checkpoint, val loss not finite with
--require-finite-loss, DRAFT_DIR not valid), 2 bad input (missing paths, DRAFT_DIR
overlapping the save directory). Errors are one line on stderr.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Optional

from specfleet_helpers import files

PROG = "python -m specfleet_helpers.stages.checkpoint"
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
PUBLISHED_FILES = (CONFIG_FILE, WEIGHTS_FILE)
BEST_LINK = "checkpoint_best"
VAL_METRICS_FILE = "val_metrics.json"
TRAINING_STATE_FILE = "training_state.json"

_EPOCH_DIR = re.compile(r"^\d+$")
_EPOCH_LINK = re.compile(r"^epoch(\d+)_(?:end|step\d+)$")
_COPY_CHUNK = 8 * 1024 * 1024


class BadInput(Exception):
    """The arguments cannot be acted on (exit 2)."""


class CheckpointError(Exception):
    """Training left no publishable checkpoint, or a check failed (exit 1)."""


# --------------------------------------------------------------------------------------
# Checkpoint selection
# --------------------------------------------------------------------------------------


def select_checkpoint(save_path: Path) -> dict[str, Any]:
    """Pick the checkpoint to publish from a speculators save directory.

    ``checkpoint_best`` (a symlink to an epoch directory, or a directory) wins; otherwise
    the highest epoch among the numbered directories ``<N>/`` and the ``epoch<N>_end`` /
    ``epoch<N>_step<M>`` symlinks. Returns ``{"path": resolved dir, "epoch": int or None,
    "selected_by": "checkpoint_best" | "latest_epoch"}``. Raises CheckpointError when
    there is none, or when ``checkpoint_best`` dangles.
    """
    best = save_path / BEST_LINK
    if best.is_symlink() or best.exists():
        if not best.is_dir():
            target = os.readlink(best) if best.is_symlink() else "not a directory"
            raise CheckpointError(
                f"{best} does not lead to a checkpoint directory ({target}); "
                "expected a symlink to an epoch directory"
            )
        resolved = best.resolve()
        return {
            "path": resolved,
            "epoch": _epoch_of(resolved.name),
            "selected_by": BEST_LINK,
        }

    candidates: dict[int, Path] = {}
    for entry in save_path.iterdir():
        if _EPOCH_DIR.match(entry.name) and entry.is_dir() and not entry.is_symlink():
            candidates.setdefault(int(entry.name), entry.resolve())
        link = _EPOCH_LINK.match(entry.name)
        if link and entry.is_symlink() and entry.is_dir():
            resolved = entry.resolve()
            epoch = _epoch_of(resolved.name)
            candidates.setdefault(int(link.group(1)) if epoch is None else epoch, resolved)
    if not candidates:
        raise CheckpointError(
            f"no checkpoint under {save_path}: expected {BEST_LINK}, epoch directories "
            "<N>/ or epoch<N>_end symlinks written by speculators.train"
        )
    epoch = max(candidates)
    return {"path": candidates[epoch], "epoch": epoch, "selected_by": "latest_epoch"}


def _epoch_of(name: str) -> Optional[int]:
    return int(name) if _EPOCH_DIR.match(name) else None


# --------------------------------------------------------------------------------------
# Draft file checks
# --------------------------------------------------------------------------------------


# How the draft check words each problem of the shared reader, after the file's name.
_SAFETENSORS_WORDING = {
    "empty": "is empty",
    "short": "is too short for a safetensors file",
    "header_length": "has a bad safetensors header length",
    "header": "has an unreadable safetensors header",
    "size": "is not as long as its safetensors header says",
}


def safetensors_tensor_count(path: Path) -> int:
    """Number of tensors in a safetensors file (files.py's reader checks its header against
    its size); ValueError, worded to follow the file's name, when it is not one."""
    try:
        tensors = files.read_safetensors_header(path)
    except files.SafetensorsError as exc:
        if exc.tensor is not None:  # an entry, or the data it points at, is wrong
            text = f"has a bad safetensors entry for tensor {exc.tensor!r}"
        else:
            text = _SAFETENSORS_WORDING[exc.kind]
        raise ValueError(f"{text}: {exc.problem}") from exc
    if not tensors:
        raise ValueError("holds no tensors")
    return len(tensors)


def file_problems(directory: Path) -> list[str]:
    """Problems with the two draft files in ``directory`` (other files are ignored)."""
    problems: list[str] = []
    config = directory / CONFIG_FILE
    weights = directory / WEIGHTS_FILE
    if not config.is_file():
        problems.append(f"{CONFIG_FILE} is missing")
    else:
        try:
            parsed = json.loads(config.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            problems.append(f"{CONFIG_FILE} does not parse as JSON ({exc})")
        else:
            if not isinstance(parsed, dict):
                problems.append(f"{CONFIG_FILE} is not a JSON object")
    if not weights.is_file():
        problems.append(f"{WEIGHTS_FILE} is missing")
    else:
        try:
            safetensors_tensor_count(weights)
        except (OSError, ValueError) as exc:
            problems.append(f"{WEIGHTS_FILE} {exc}")
    return problems


def draft_dir_problems(directory: Path) -> list[str]:
    """Problems with a published draft: it must hold exactly the two files, both valid."""
    if not directory.exists():
        return [f"{directory} does not exist"]
    if not directory.is_dir():
        return [f"{directory} is not a directory"]
    entries = sorted(os.listdir(directory))
    problems: list[str] = []
    extra = [name for name in entries if name not in PUBLISHED_FILES]
    if extra:
        problems.append(f"unexpected entries: {', '.join(extra)}")
    flagged: set[str] = set()
    for name in PUBLISHED_FILES:
        path = directory / name
        if path.is_symlink():
            problems.append(f"{name} is a symlink, expected a regular file")
            flagged.add(name)
        elif path.exists() and not path.is_file():
            problems.append(f"{name} is not a regular file")
            flagged.add(name)
    problems.extend(
        problem for problem in file_problems(directory) if problem.split(" ", 1)[0] not in flagged
    )
    return problems


def verify(out: Path) -> dict[str, Any]:
    """Check a published draft directory; ``ok`` is False with ``problems`` when not."""
    problems = draft_dir_problems(out)
    result: dict[str, Any] = {
        "path": os.path.abspath(out),
        "ok": not problems,
        "problems": problems,
    }
    if not problems:
        result["files"] = [
            {"name": name, "size": (out / name).stat().st_size} for name in PUBLISHED_FILES
        ]
        result["tensors"] = safetensors_tensor_count(out / WEIGHTS_FILE)
    return result


# --------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------

# A rich log record: "[time] LEVEL    message ... file.py:123"; the time is blank when it
# repeats the previous record's.
_RICH_RECORD = re.compile(r"^(?:\[[^\]]*\]\s+|\s+)?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+(?=\S)")
_RICH_PATH = re.compile(r"\s{2,}[\w.<>-]+:\d+$")
_NUMBER = r"[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|(?i:nan|inf(?:inity)?))"
_METRIC = re.compile(r"(?<![\w/.-])((?:train|val)/[\w./-]+)=(" + _NUMBER + r")(?![\w.])")
_EPOCH = re.compile(r"(?<![\w/.-])epoch=(\d+)(?![\w.])")
VAL_LOSS_KEY = "val/loss_epoch"


def log_records(text: str) -> list[str]:
    """Split log text into records, undoing colour codes and rich's line wrapping.

    A rich record continues on the following lines that are indented to its message
    column; a wrap after ", " is joined with a space, any other wrap (inside a word) with
    nothing. The path column rich prints at the right of a record's first line is dropped.
    Lines that are not rich records (plain logging, warnings, tracebacks) are records of
    their own.
    """
    records: list[str] = []
    current: Optional[list[str]] = None
    column = 0
    for raw in re.split(r"\r\n|\r|\n", files.strip_ansi(text)):
        line = raw.rstrip()
        head = _RICH_RECORD.match(line)
        if head:
            if current is not None:
                records.append(_join_wrapped(current))
            column = head.end()
            current = [_RICH_PATH.sub("", line[column:])]  # the path is on the first line
            continue
        if (
            current is not None
            and len(line) > column
            and line[:column].isspace()
            and not line[column].isspace()
        ):
            current.append(line[column:])
            continue
        if current is not None:
            records.append(_join_wrapped(current))
            current = None
        if line:
            records.append(line)
    if current is not None:
        records.append(_join_wrapped(current))
    return records


def _join_wrapped(parts: list[str]) -> str:
    text = ""
    for part in parts:
        part = part.rstrip()
        if text and text.endswith(","):
            text += " " + part
        else:
            text += part
    return text


def parse_log_metrics(text: str) -> dict[str, Any]:
    """Metrics logged by speculators.train.

    Returns ``{"metrics": {key: last value}, "val_loss_by_epoch": {epoch: val loss}}``
    for every ``train/...=number`` and ``val/...=number`` in the log; ``val_loss_by_epoch``
    pairs ``val/loss_epoch`` with the ``epoch=N`` of the same record. Values may be nan or
    inf (speculators prints them so).
    """
    metrics: dict[str, float] = {}
    by_epoch: dict[int, float] = {}
    for record in log_records(text):
        found = _METRIC.findall(record)
        if not found:
            continue
        for key, value in found:
            metrics[key] = float(value)
        epoch = _EPOCH.search(record)
        values = dict(found)
        if epoch and VAL_LOSS_KEY in values:
            by_epoch[int(epoch.group(1))] = float(values[VAL_LOSS_KEY])
    return {"metrics": metrics, "val_loss_by_epoch": by_epoch}


def _read_json_object(path: Path) -> Optional[dict[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def collect_metrics(
    checkpoint: Path, epoch: Optional[int], log_text: Optional[str]
) -> dict[str, Any]:
    """Checkpoint and log metrics, and the validation loss of this checkpoint."""
    val_metrics = _read_json_object(checkpoint / VAL_METRICS_FILE)
    training_state = _read_json_object(checkpoint / TRAINING_STATE_FILE)
    parsed = parse_log_metrics(log_text) if log_text is not None else None

    val_loss: Optional[float] = None
    source: Optional[str] = None
    if val_metrics is not None and _is_number(val_metrics.get("loss_epoch")):
        val_loss, source = float(val_metrics["loss_epoch"]), VAL_METRICS_FILE
    elif parsed is not None and epoch is not None and epoch in parsed["val_loss_by_epoch"]:
        val_loss, source = parsed["val_loss_by_epoch"][epoch], f"log (epoch {epoch})"
    elif parsed is not None and VAL_LOSS_KEY in parsed["metrics"]:
        val_loss, source = parsed["metrics"][VAL_LOSS_KEY], "log (last value)"

    return {
        "val_loss": val_loss,
        "val_loss_finite": val_loss is not None and math.isfinite(val_loss),
        "val_loss_source": source,
        "log": parsed["metrics"] if parsed is not None else None,
        "val_metrics": val_metrics,
        "training_state": training_state,
    }


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def json_safe(value: Any) -> Any:
    """Replace non-finite floats (not valid JSON) by None, recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value


# --------------------------------------------------------------------------------------
# Publishing
# --------------------------------------------------------------------------------------


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_COPY_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def copy_file(source: Path, destination: Path) -> str:
    """Copy bytes (not permissions: the copy gets the umask's mode), fsync; returns sha256."""
    digest = hashlib.sha256()
    with open(source, "rb") as src, open(destination, "xb") as dst:
        for chunk in iter(lambda: src.read(_COPY_CHUNK), b""):
            digest.update(chunk)
            dst.write(chunk)
        dst.flush()
        os.fsync(dst.fileno())
    return digest.hexdigest()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _check_out_path(save_path: Path, checkpoint: Path, out: Path) -> None:
    save_r, ckpt_r, out_r = save_path.resolve(), checkpoint.resolve(), out.resolve()
    if out_r == save_r or out_r in save_r.parents:
        raise BadInput(f"--out {out} would replace the save directory {save_path}")
    if out_r == ckpt_r or ckpt_r in out_r.parents or out_r in ckpt_r.parents:
        raise BadInput(f"--out {out} overlaps the checkpoint {checkpoint}")
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise BadInput(f"--out {out} exists and is not a directory")


def _same_files(out: Path, digests: dict[str, str]) -> bool:
    if draft_dir_problems(out):
        return False
    return all(sha256_of(out / name) == digest for name, digest in digests.items())


def publish(
    save_path: Path,
    out: Path,
    log_path: Optional[Path] = None,
    require_finite_loss: bool = False,
) -> dict[str, Any]:
    """Copy the best checkpoint's config.json + model.safetensors to ``out``, atomically."""
    if not save_path.is_dir():
        raise BadInput(f"--save-path {save_path} is not a directory")
    log_text: Optional[str] = None
    if log_path is not None:
        try:
            log_text = log_path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise BadInput(f"cannot read --log {log_path}: {exc.strerror or exc}") from exc

    selection = select_checkpoint(save_path)
    checkpoint: Path = selection["path"]
    _check_out_path(save_path, checkpoint, out)
    problems = file_problems(checkpoint)
    if problems:
        raise CheckpointError(f"checkpoint {checkpoint} is not usable: {'; '.join(problems)}")

    metrics = collect_metrics(checkpoint, selection["epoch"], log_text)
    if require_finite_loss and not metrics["val_loss_finite"]:
        found = "no validation loss found" if metrics["val_loss"] is None else None
        raise CheckpointError(
            f"checkpoint {checkpoint}: "
            + (found or f"validation loss is {metrics['val_loss']} (not finite)")
            + f"; {out} left unchanged"
        )

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        digests = {name: copy_file(checkpoint / name, staging / name) for name in PUBLISHED_FILES}
        staged_problems = draft_dir_problems(staging)
        if staged_problems:
            raise CheckpointError(f"copy in {staging} is not valid: {'; '.join(staged_problems)}")
        changed = not _same_files(out, digests)
        if changed:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(staging, 0o777 & ~umask)  # mkdtemp creates 0700
            _fsync_dir(staging)
            files.replace_dir(staging, out)
            _fsync_dir(out.parent)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)

    return json_safe(
        {
            "path": os.path.abspath(out),
            "source_checkpoint": str(checkpoint),
            "selected_by": selection["selected_by"],
            "epoch": selection["epoch"],
            "changed": changed,
            "files": [
                {"name": name, "size": (out / name).stat().st_size, "sha256": digests[name]}
                for name in PUBLISHED_FILES
            ],
            "metrics": metrics,
        }
    )


# --------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------


# speculators' checkpoint of a run stopped by a signal (graceful_shutdown), which speculators
# itself skips on resume ("rename it to an epoch number"): model, optimizer and scheduler, no
# training state.
INTERRUPTED = "interrupted"


def finished_epochs(save_path: Path) -> list[int]:
    """The epochs speculators saved whole (<save>/<N>/, not its descriptive symlinks)."""
    if not save_path.is_dir():
        return []
    return sorted(
        epoch
        for path in save_path.iterdir()
        if path.is_dir() and not path.is_symlink()
        for epoch in [_epoch_of(path.name)]
        if epoch is not None
    )


def resume(save_path: Path) -> dict[str, Any]:
    """Make speculators resume a stopped run where it was, not from its last whole epoch.

    speculators resumes after the highest epoch directory it finds, and only mid-epoch when
    that epoch's training_state.json says so. Its `interrupted` checkpoint becomes that
    epoch's directory, with a training state one step into it: speculators then resumes mid-
    epoch from the interrupted weights, optimizer and scheduler, and goes through the epoch's
    remaining batches (the ones seen before the stop are seen again; none is left out). The
    published draft is thus trained on every epoch asked for. Prints what is reused."""
    done = finished_epochs(save_path)
    interrupted = save_path / INTERRUPTED
    if not (interrupted / "model.safetensors").is_file():
        if interrupted.exists():
            shutil.rmtree(interrupted)  # saved only in part: the save itself was cut short
        return {"resumed_from": f"epoch {done[-1]}" if done else None, "epochs_done": done}
    epoch = done[-1] + 1 if done else 0
    previous = _read_json_object(save_path / str(epoch - 1) / "training_state.json") or {}
    state = {"epoch": epoch, "local_step": 1, "global_step": int(previous.get("global_step") or 0)}
    # The state first, then the rename: an epoch directory without it would read as a whole
    # epoch to speculators, and a stop in between leaves `interrupted` for the next run.
    files.write_json_atomic(interrupted / "training_state.json", state)
    interrupted.rename(save_path / str(epoch))
    return {"resumed_from": f"the interrupted checkpoint, in epoch {epoch}", "epochs_done": done}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "Publish the trained draft from a speculators.train save directory "
            "(config.json + model.safetensors of the best checkpoint, atomically), or "
            "verify a published draft. Prints one JSON line."
        ),
        epilog=(
            "Exit status: 0 done, 1 failed (no usable checkpoint, validation loss not "
            "finite with --require-finite-loss, draft directory not valid), 2 bad input. "
            "Errors are one line on stderr."
        ),
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    res = sub.add_parser(
        "resume",
        help="before speculators.train: resume a stopped run from its interrupted checkpoint",
        description=(
            "Turn <save>/interrupted (speculators' checkpoint of a run stopped by a signal) into "
            "the epoch it was saved in, with a training state that makes speculators resume "
            "within that epoch; print the epochs done and what is resumed from."
        ),
    )
    res.add_argument("--save-path", required=True, type=Path, help="speculators' --save-path")
    pub = sub.add_parser(
        "publish",
        help="copy the best checkpoint's config.json + model.safetensors to --out",
        description=(
            "Pick <save>/checkpoint_best, else the highest epoch (<save>/<N>/ or "
            "epoch<N>_end), copy only config.json and model.safetensors into a temporary "
            "sibling of --out, check them, then rename into place (an existing --out is "
            "replaced only once the new copy is complete). Prints path, source_checkpoint, "
            "selected_by, epoch, changed, files and metrics (val_loss from the "
            "checkpoint's val_metrics.json or the log, all train/... and val/... values "
            "found in the log)."
        ),
    )
    pub.add_argument(
        "--save-path",
        required=True,
        type=Path,
        metavar="CKPT_DIR",
        help="the --save-path given to speculators.train",
    )
    pub.add_argument(
        "--out",
        required=True,
        type=Path,
        metavar="DRAFT_DIR",
        help="directory to publish the draft to (created or replaced)",
    )
    pub.add_argument(
        "--log",
        type=Path,
        metavar="FILE",
        help="the training log, for train/... and val/... metrics (write it with a wide "
        "COLUMNS so rich wraps less; wrapped lines are handled)",
    )
    pub.add_argument(
        "--require-finite-loss",
        action="store_true",
        help="fail (exit 1, --out untouched) unless a finite validation loss is found",
    )
    ver = sub.add_parser(
        "verify",
        help="check --out holds exactly config.json + model.safetensors, both valid",
        description=(
            "Exit 0 when DRAFT_DIR holds exactly config.json (a JSON object) and "
            "model.safetensors (a valid, non-empty safetensors file), else exit 1 with "
            "the reason. Prints path, ok, problems, files and tensors."
        ),
    )
    ver.add_argument("--out", required=True, type=Path, metavar="DRAFT_DIR")
    ver.add_argument(
        "--published",
        type=Path,
        metavar="PUBLISH_JSON",
        help="also require the finite validation loss publish recorded (its output's last "
        "line, in this file) and print that line instead: the train stage's verifier",
    )
    return parser


def published_record(path: Path) -> dict[str, Any]:
    """The last line publish wrote to `path`, which must hold a finite validation loss
    (CheckpointError naming the loss and the file when not)."""
    try:
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        record = json.loads(lines[-1]) if lines else None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path} holds no publish record: {exc}") from exc
    if not isinstance(record, dict) or not isinstance(record.get("metrics"), dict):
        raise CheckpointError(f"{path} holds no publish record with metrics")
    metrics = record["metrics"]
    if not metrics.get("val_loss_finite"):
        raise CheckpointError(
            f"the validation loss is {metrics.get('val_loss', 'missing')}, expected a finite "
            f"number (see {metrics.get('log') or path})"
        )
    return record


def _error(message: str) -> None:
    print(f"checkpoint: {' '.join(message.split())}", file=sys.stderr)


def main(argv: Optional[Iterable[str]] = None) -> int:
    args = build_parser().parse_args(None if argv is None else list(argv))
    if args.command == "resume":
        print(json.dumps(resume(args.save_path)))
        return EXIT_OK
    if args.command == "verify":
        result = verify(args.out)
        if not result["ok"]:
            print(json.dumps(result))
            _error(f"{args.out} is not a published draft: {'; '.join(result['problems'])}")
            return EXIT_FAILED
        if args.published is not None:
            try:
                result = published_record(args.published)
            except CheckpointError as exc:
                _error(f"train: {exc}")
                return EXIT_FAILED
        print(json.dumps(result))
        return EXIT_OK
    try:
        result = publish(args.save_path, args.out, args.log, args.require_finite_loss)
    except BadInput as exc:
        _error(str(exc))
        return EXIT_BAD_INPUT
    except CheckpointError as exc:
        _error(str(exc))
        return EXIT_FAILED
    except OSError as exc:
        _error(f"publishing to {args.out} failed: {exc}")
        return EXIT_FAILED
    print(json.dumps(result))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
