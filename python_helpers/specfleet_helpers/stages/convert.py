"""Convert a z-lab DFlash draft into a speculators checkpoint (the runbook's convert step), and
check a converted checkpoint.

``run`` does what the runbook does with speculators' Python API::

    convert_model(model=DRAFT, verifier=VERIFIER, algorithm="dflash", output_path=OUT)

with these additions:

* Before any work: both config.json files parse, the draft's ``hidden_size`` equals the
  verifier's (the draft's fc/attention are sized for that verifier), the draft has a
  ``block_size`` (top level or in ``dflash_config``) and weights, and it is not already a
  speculators checkpoint.
* The converter writes into a temporary sibling ``.<OUT name>.partial``; the result is
  checked there and only then renamed to OUT, replacing an older output. An interrupted or
  failed conversion never leaves something at OUT that looks finished.
* The verifier is recorded in the converted config (``speculators_config.verifier.
  name_or_path``) as an absolute path, so the checkpoint does not depend on the working
  directory it was converted from.
* The sha256 of every file of the verified output is recorded in OUT/.specfleet-checksums.json,
  so ``verify`` also notices an edit that still looks like a plausible conversion (say a
  changed ``block_size``), a file removed or a file added. An output without that record
  (converted before specfleet kept one) is checked for consistency only.

``verify`` checks an existing output, so a stage can decide whether a previous conversion is
still valid. Where speculators 0.9.0 writes things in the converted config.json: the fields
``speculators_model_type`` ("dflash"), ``block_size``, ``aux_hidden_state_layer_ids`` (the
z-lab ``dflash_config.target_layer_ids`` shifted by +1, the verifier's last layer dropped) and
``mask_token_id`` are top level; the draft transformer's config (``hidden_size`` ...) is under
``transformer_layer_config``; ``speculative_tokens`` (= block_size - 1) is under
``speculators_config.proposal_methods[0]``; the verifier under ``speculators_config.verifier``.

Output (one JSON line on stdout, for both subcommands)::

    {"path", "speculators_model_type", "block_size", "aux_hidden_state_layer_ids",
     "speculative_tokens", "mask_token_id", "verifier_name_or_path", "verifier_num_layers",
     "files"}

(``speculative_tokens`` / ``mask_token_id`` / ``verifier_name_or_path`` only when present;
``run`` adds ``seconds``). Exit status: 0 ok, 1 conversion failed or output invalid (the
reason on stderr), 2 bad input (caught before converting).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Optional

from specfleet_helpers.checks.model_check import (
    INDEX,
    SINGLE,
    ModelCheckError,
    config_value,
    load_json_object,
    read_safetensors_header,
    sha256_file,
)
from specfleet_helpers.files import replace_dir, write_json_atomic

MODEL_TYPE = "dflash"
CHECKSUMS = ".specfleet-checksums.json"


class ConvertInputError(Exception):
    """The draft, verifier or options are unusable; found before converting (exit 2)."""


class ConvertError(Exception):
    """The conversion failed or its output is invalid (exit 1)."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _model_config(model_dir: Path, option: str) -> dict[str, Any]:
    if not model_dir.is_dir():
        raise ConvertInputError(f"{option} {model_dir}: not a directory")
    try:
        return load_json_object(model_dir / "config.json")
    except ModelCheckError as exc:
        raise ConvertInputError(f"{option}: {exc}") from exc


def _positive_int(config: dict[str, Any], key: str, where: str) -> int:
    value = config_value(config, key)
    if not _is_int(value) or value <= 0:
        raise ConvertInputError(f"{where}: '{key}' must be a positive integer, got {value!r}")
    return int(value)


def draft_block_size(draft_config: dict[str, Any]) -> Optional[int]:
    """block_size of an external DFlash draft: top level (Qwen3, Llama) or in dflash_config."""
    value = draft_config.get("block_size")
    if value is None:
        nested = draft_config.get("dflash_config")
        if isinstance(nested, dict):
            value = nested.get("block_size")
    return value if _is_int(value) else None


def preflight(draft: Path, verifier: Path) -> dict[str, Any]:
    """Check the inputs of a conversion without converting; raise ConvertInputError."""
    draft_config = _model_config(draft, "--draft")
    verifier_config = _model_config(verifier, "--verifier")
    draft_where = f"--draft {draft / 'config.json'}"
    verifier_where = f"--verifier {verifier / 'config.json'}"
    if "speculators_model_type" in draft_config:
        raise ConvertInputError(
            f"{draft_where}: already a speculators checkpoint (speculators_model_type ="
            f" {draft_config['speculators_model_type']!r}); expected an external DFlash draft"
        )
    draft_hidden = _positive_int(draft_config, "hidden_size", draft_where)
    verifier_hidden = _positive_int(verifier_config, "hidden_size", verifier_where)
    if draft_hidden != verifier_hidden:
        raise ConvertInputError(
            f"hidden size mismatch: draft {draft} has hidden_size={draft_hidden} but verifier"
            f" {verifier} has hidden_size={verifier_hidden}; the draft was built for another"
            " verifier"
        )
    block_size = draft_block_size(draft_config)
    if block_size is None or block_size < 1:
        raise ConvertInputError(
            f"{draft_where}: no integer 'block_size' (looked at the top level and in"
            " 'dflash_config')"
        )
    _positive_int(verifier_config, "num_hidden_layers", verifier_where)
    for model_dir, option in ((draft, "--draft"), (verifier, "--verifier")):
        if not (model_dir / SINGLE).is_file() and not (model_dir / INDEX).is_file():
            raise ConvertInputError(f"{option} {model_dir}: no {SINGLE} or {INDEX}")
    return {"hidden_size": draft_hidden, "block_size": block_size}


def speculative_tokens(config: dict[str, Any]) -> Optional[int]:
    speculators_config = config.get("speculators_config")
    if not isinstance(speculators_config, dict):
        return None
    for method in speculators_config.get("proposal_methods") or []:
        if isinstance(method, dict) and _is_int(method.get("speculative_tokens")):
            return int(method["speculative_tokens"])
    return None


def record_checksums(out: Path) -> dict[str, str]:
    """Write OUT/CHECKSUMS: {"files": {name: sha256}} of every file of a verified output."""
    files = {
        p.name: sha256_file(p) for p in sorted(out.iterdir()) if p.is_file() and p.name != CHECKSUMS
    }
    write_json_atomic(out / CHECKSUMS, {"files": files}, indent=1)
    return files


def check_checksums(out: Path) -> bool:
    """Compare OUT with its recorded checksums: ConvertError on any difference, False when
    there is no record (an output converted before specfleet kept one)."""
    record_path = out / CHECKSUMS
    if not record_path.exists():
        return False
    try:
        files = json.loads(record_path.read_text())["files"]
        if not isinstance(files, dict):
            raise TypeError("files is not an object")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConvertError(f"{record_path}: unreadable checksum record: {exc}") from exc
    changed = []
    for name, recorded in sorted(files.items()):
        path = out / name
        if not path.is_file():
            changed.append(f"{name} removed")
        elif sha256_file(path) != recorded:
            changed.append(f"{name} edited (sha256 differs from the conversion's)")
    present = {p.name for p in out.iterdir() if p.is_file() and p.name != CHECKSUMS}
    changed += [f"{name} added" for name in sorted(present - set(files))]
    if changed:
        raise ConvertError(f"{out} changed since it was converted: {'; '.join(changed)}")
    return True


def verify_output(out: Path, verifier: Path) -> dict[str, Any]:
    """Check a converted DFlash checkpoint against its verifier; raise ConvertError if invalid."""
    try:
        verifier_config = load_json_object(verifier / "config.json")
        config = load_json_object(out / "config.json")
    except ModelCheckError as exc:
        raise ConvertError(str(exc)) from exc
    where = out / "config.json"

    model_type = config.get("speculators_model_type")
    if model_type != MODEL_TYPE:
        raise ConvertError(f"{where}: speculators_model_type is {model_type!r}, expected 'dflash'")

    block_size = config.get("block_size")
    if block_size is None and isinstance(config.get("dflash_config"), dict):
        block_size = config["dflash_config"].get("block_size")
    if not _is_int(block_size) or block_size < 1:
        raise ConvertError(f"{where}: block_size must be a positive integer, got {block_size!r}")

    num_layers = config_value(verifier_config, "num_hidden_layers")
    if not _is_int(num_layers) or num_layers <= 0:
        raise ConvertError(
            f"{verifier / 'config.json'}: num_hidden_layers must be a positive integer,"
            f" got {num_layers!r}"
        )
    layer_ids = config.get("aux_hidden_state_layer_ids")
    if not isinstance(layer_ids, list) or not layer_ids or not all(map(_is_int, layer_ids)):
        raise ConvertError(
            f"{where}: aux_hidden_state_layer_ids must be a non-empty list of integers,"
            f" got {layer_ids!r}"
        )
    bad = [i for i in layer_ids if not 0 <= i < num_layers]
    if bad:
        raise ConvertError(
            f"{where}: aux_hidden_state_layer_ids {layer_ids} has ids outside the verifier's"
            f" {num_layers} layers (0..{num_layers - 1}): {bad}"
        )

    draft_hidden = config_value(config, "hidden_size")
    verifier_hidden = config_value(verifier_config, "hidden_size")
    if draft_hidden != verifier_hidden:
        raise ConvertError(
            f"{where}: draft hidden_size={draft_hidden!r} but verifier {verifier} has"
            f" hidden_size={verifier_hidden!r}"
        )

    mask_token_id = config.get("mask_token_id")
    vocab_size = config_value(verifier_config, "vocab_size")
    if mask_token_id is not None and (
        not _is_int(mask_token_id)
        or mask_token_id < 0
        or (_is_int(vocab_size) and mask_token_id >= vocab_size)
    ):
        raise ConvertError(
            f"{where}: mask_token_id {mask_token_id!r} is not a token id of the verifier's"
            f" vocabulary ({vocab_size})"
        )

    weights = out / SINGLE
    if not weights.is_file():
        raise ConvertError(f"{weights}: missing")
    try:
        read_safetensors_header(weights)
    except ModelCheckError as exc:
        raise ConvertError(str(exc)) from exc

    result: dict[str, Any] = {
        "path": str(out),
        "speculators_model_type": model_type,
        "block_size": block_size,
        "aux_hidden_state_layer_ids": layer_ids,
    }
    tokens = speculative_tokens(config)
    if tokens is not None:
        result["speculative_tokens"] = tokens
    if mask_token_id is not None:
        result["mask_token_id"] = mask_token_id
    verifier_entry = (config.get("speculators_config") or {}).get("verifier")
    if isinstance(verifier_entry, dict) and verifier_entry.get("name_or_path"):
        result["verifier_name_or_path"] = verifier_entry["name_or_path"]
    result["verifier_num_layers"] = num_layers
    check_checksums(out)
    result["files"] = sorted(p.name for p in out.iterdir() if p.name != CHECKSUMS)
    return result


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def publish(tmp: Path, out: Path) -> None:
    """Move a complete output from tmp to out, replacing an old out only now."""
    replace_dir(tmp, out)


def run(
    draft: Path, verifier: Path, out: Path, validate_device: Optional[str] = None
) -> dict[str, Any]:
    """Check the inputs, convert into a temporary sibling, verify it, then rename it to out."""
    started = time.monotonic()
    preflight(draft, verifier)
    if out.exists() and not out.is_dir():
        raise ConvertInputError(f"--out {out}: exists and is not a directory")
    out = out.absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.partial")
    _remove(tmp)

    from speculators.convert import convert_model  # heavy: torch, transformers

    try:
        # speculators and transformers log to stderr; keep stdout for the JSON result.
        with contextlib.redirect_stdout(sys.stderr):
            convert_model(
                model=str(draft.resolve()),
                verifier=str(verifier.resolve()),
                algorithm=MODEL_TYPE,
                output_path=str(tmp),
                validate_device=validate_device,
            )
        verify_output(tmp, verifier)
        record_checksums(tmp)
    except ConvertError as exc:
        _remove(tmp)
        raise ConvertError(f"conversion produced an invalid checkpoint: {exc}") from exc
    except Exception as exc:
        _remove(tmp)
        raise ConvertError(f"conversion failed: {type(exc).__name__}: {exc}") from exc
    publish(tmp, out)
    result = verify_output(out, verifier)
    result["seconds"] = round(time.monotonic() - started, 2)
    return result


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m specfleet_helpers.stages.convert",
        description=(
            "Convert a z-lab DFlash draft into a speculators checkpoint with speculators'"
            " convert_model(algorithm='dflash'), or verify an existing conversion. Prints one"
            " JSON line: path, speculators_model_type, block_size, aux_hidden_state_layer_ids,"
            " speculative_tokens, mask_token_id, verifier_num_layers, files."
        ),
        epilog=(
            "exit status: 0 ok; 1 conversion failed or output invalid; 2 bad input (found"
            " before converting, e.g. draft and verifier hidden sizes differ)"
        ),
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{run,verify}")
    run_parser = sub.add_parser(
        "run",
        help="convert DRAFT for VERIFIER into OUT (atomically), then verify OUT",
        description=(
            "Convert into a temporary sibling of OUT, verify it, then rename it to OUT"
            " (an existing OUT is replaced only once the new output is complete)."
        ),
    )
    run_parser.add_argument("--draft", type=Path, required=True, help="z-lab DFlash draft dir")
    run_parser.add_argument("--verifier", type=Path, required=True, help="verifier model dir")
    run_parser.add_argument("--out", type=Path, required=True, help="output directory")
    run_parser.add_argument(
        "--validate-device",
        metavar="DEVICE",
        help=(
            "passed to convert_model; when set, speculators loads the converted checkpoint"
            " back and checks it for NaNs (speculators 0.9.0 loads it on CPU whatever the"
            " value, e.g. 'cpu'). Default: no load-back check, like the runbook"
        ),
    )
    verify_parser = sub.add_parser(
        "verify",
        help="check an existing converted checkpoint against its verifier (exit 1 if invalid)",
        description=(
            "Check a converted checkpoint without converting: speculators_model_type is"
            " 'dflash', block_size is set, every aux hidden-state layer id is a layer of the"
            " verifier, hidden sizes match, mask_token_id is in the verifier's vocabulary and"
            " model.safetensors is complete. Exit 1 with the reason on stderr if not."
        ),
    )
    verify_parser.add_argument("--out", type=Path, required=True, help="converted checkpoint")
    verify_parser.add_argument("--verifier", type=Path, required=True, help="verifier model dir")
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "run":
            result = run(args.draft, args.verifier, args.out, args.validate_device)
        else:
            if not args.out.is_dir():
                raise ConvertError(f"--out {args.out}: not a directory")
            result = verify_output(args.out.absolute(), args.verifier)
    except ConvertInputError as exc:
        print(f"convert: {exc}", file=sys.stderr)
        return 2
    except (ConvertError, OSError) as exc:
        print(f"convert: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
