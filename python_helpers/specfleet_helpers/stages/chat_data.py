"""Build speculators-format training rows (JSONL of {"input_ids": [...], "loss_mask": [...]}),
the runbook's data step, for ``speculators prepare-data``.

Sources:

* ``smoke`` (default): the runbook's chats, user "Briefly describe AI topic #{i}." and
  assistant "AI is a field of computer science." for i = 0 .. --smoke-rows - 1.
* ``--input FILE.jsonl`` with one kind of row throughout:

  - ``{"conversations": [{"role": ..., "content": ...}, ...]}``: tokenized like the smoke
    chats. Roles are system, user, assistant or tool; the last message must be the
    assistant's.
  - ``{"input_ids": [int, ...], "loss_mask": [0|1, ...]}``: pre-tokenized rows, validated
    (same non-empty length, non-negative ints, mask of 0/1 with at least one 1, ids below the
    model's vocabulary size when --model is given) and passed through. Needs no tokenizer.

Tokenization is the runbook's, with the verifier's chat template::

    prefix_ids = apply_chat_template(conv[:-1], tokenize=True, add_generation_prompt=True)
    full_ids = apply_chat_template(conv, tokenize=True)
    loss_mask = [0] * len(prefix_ids) + [1] * (len(full_ids) - len(prefix_ids))

so the loss is on the last assistant turn only (earlier turns are context), the same rows
prepare-data's render endpoint produces. ``full_ids`` must start with ``prefix_ids``; a chat
template for which it does not is reported as not prefix-stable.

``--max-seq-length N`` makes a longer row an error naming its line; rows are never truncated
here (prepare-data's ``--seq-length`` is where sequences are cut, if at all). Every row is
built and checked before anything is written; the output is written to a temporary file and
renamed into place.

Output (one JSON line on stdout)::

    {"path", "rows", "tokens", "trainable_tokens", "source", "input"}

with ``source`` one of "smoke", "conversations", "pretokenized". Exit status: 0 ok, 2 bad
input (``<file>:<line>: <reason>`` on stderr), 1 other failures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from specfleet_helpers.files import atomic_path

SMOKE_QUESTION = "Briefly describe AI topic #{i}."
SMOKE_ANSWER = "AI is a field of computer science."
ROLES = frozenset({"system", "user", "assistant", "tool"})

SOURCE_SMOKE = "smoke"
KIND_CONVERSATIONS = "conversations"
KIND_PRETOKENIZED = "pretokenized"

Message = dict[str, str]


class DataError(ValueError):
    """Bad input data or options; the message names the file and line (exit 2)."""


class RowError(ValueError):
    """What is wrong with one row; the caller adds where the row came from."""


@dataclass(frozen=True)
class Row:
    input_ids: list[int]
    loss_mask: list[int]

    def to_json(self) -> str:
        return json.dumps({"input_ids": self.input_ids, "loss_mask": self.loss_mask})


@dataclass(frozen=True)
class Record:
    """One input row: where it came from (for messages) and its parsed content."""

    where: str
    kind: str
    conversation: Optional[list[Message]] = None
    row: Optional[Row] = None


def smoke_conversations(count: int) -> list[list[Message]]:
    """The runbook's smoke chats."""
    return [
        [
            {"role": "user", "content": SMOKE_QUESTION.format(i=i)},
            {"role": "assistant", "content": SMOKE_ANSWER},
        ]
        for i in range(count)
    ]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_conversation(obj: dict[str, Any]) -> list[Message]:
    """The messages of a {"conversations": [...]} row; RowError if malformed."""
    messages = obj["conversations"]
    if not isinstance(messages, list):
        raise RowError(f"'conversations' must be a list, got {type(messages).__name__}")
    if not messages:
        raise RowError("'conversations' is empty")
    checked: list[Message] = []
    for index, message in enumerate(messages):
        where = f"conversations[{index}]"
        if not isinstance(message, dict):
            raise RowError(f"{where} must be an object with 'role' and 'content'")
        for key in ("role", "content"):
            if key not in message:
                raise RowError(f"{where} has no '{key}'")
            if not isinstance(message[key], str):
                raise RowError(f"{where}.{key} must be a string")
        if message["role"] not in ROLES:
            raise RowError(
                f"{where}: unknown role {message['role']!r} (expected one of"
                f" {', '.join(sorted(ROLES))})"
            )
        checked.append({"role": message["role"], "content": message["content"]})
    if checked[-1]["role"] != "assistant":
        raise RowError(
            f"the last message must be the assistant's (the turn the loss is on), got"
            f" {checked[-1]['role']!r}"
        )
    if len(checked) < 2:
        raise RowError("a conversation needs at least one message before the assistant's")
    return checked


def validate_pretokenized(obj: dict[str, Any]) -> Row:
    """A pre-tokenized row; RowError if malformed."""
    for key in ("input_ids", "loss_mask"):
        if key not in obj:
            raise RowError(f"pre-tokenized row has no '{key}'")
        if not isinstance(obj[key], list):
            raise RowError(f"'{key}' must be a list, got {type(obj[key]).__name__}")
    input_ids, loss_mask = obj["input_ids"], obj["loss_mask"]
    if not input_ids:
        raise RowError("'input_ids' is empty")
    if len(input_ids) != len(loss_mask):
        raise RowError(
            f"'input_ids' has {len(input_ids)} tokens but 'loss_mask' has {len(loss_mask)}"
        )
    for index, token in enumerate(input_ids):
        if not _is_int(token) or token < 0:
            raise RowError(f"input_ids[{index}] must be a non-negative integer, got {token!r}")
    for index, flag in enumerate(loss_mask):
        if not _is_int(flag) or flag not in (0, 1):
            raise RowError(f"loss_mask[{index}] must be 0 or 1, got {flag!r}")
    if 1 not in loss_mask:
        raise RowError("'loss_mask' has no 1: the row has nothing to train on")
    return Row(list(input_ids), list(loss_mask))


def parse_line(text: str) -> tuple[str, Any]:
    """Kind and validated content of one JSONL line; RowError if malformed."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RowError(f"not valid JSON ({exc.msg} at column {exc.colno})") from exc
    if not isinstance(obj, dict):
        raise RowError(f"expected a JSON object, got {type(obj).__name__}")
    has_conv = "conversations" in obj
    has_tokens = "input_ids" in obj or "loss_mask" in obj
    if has_conv and has_tokens:
        raise RowError("row has both 'conversations' and 'input_ids'/'loss_mask'")
    if has_conv:
        return KIND_CONVERSATIONS, validate_conversation(obj)
    if has_tokens:
        return KIND_PRETOKENIZED, validate_pretokenized(obj)
    raise RowError(
        f"expected 'conversations' or 'input_ids' + 'loss_mask', got keys {sorted(obj) or 'none'}"
    )


def read_input(path: Path) -> list[Record]:
    """Parse and validate every row of a JSONL file; DataError '<file>:<line>: <reason>'."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise DataError(f"--input {path}: no such file") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"--input {path}: cannot read ({exc})") from exc
    records: list[Record] = []
    first_kind: Optional[tuple[str, str]] = None
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            kind, content = parse_line(line)
        except RowError as exc:
            raise DataError(f"{where}: {exc}") from exc
        if first_kind is None:
            first_kind = (kind, where)
        elif kind != first_kind[0]:
            raise DataError(
                f"{where}: {kind} row in a file of {first_kind[0]} rows (first at"
                f" {first_kind[1]}); use one kind per file"
            )
        if kind == KIND_CONVERSATIONS:
            records.append(Record(where, kind, conversation=content))
        else:
            records.append(Record(where, kind, row=content))
    if not records:
        raise DataError(f"--input {path}: no rows")
    return records


def _ids(encoded: Any) -> list[int]:
    """Token ids from apply_chat_template: a list (transformers 4.x) or a BatchEncoding (5.x)."""
    ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    ids = list(ids)
    if ids and isinstance(ids[0], list):  # a batch of one
        if len(ids) != 1:
            raise RowError(f"apply_chat_template returned a batch of {len(ids)}")
        ids = ids[0]
    return [int(i) for i in ids]


def tokenize_conversation(tokenizer: Any, conversation: Sequence[Message]) -> Row:
    """The runbook's rows: loss on the tokens after the generation prompt of the last turn."""
    try:
        prefix_ids = _ids(
            tokenizer.apply_chat_template(
                list(conversation[:-1]), tokenize=True, add_generation_prompt=True
            )
        )
        full_ids = _ids(tokenizer.apply_chat_template(list(conversation), tokenize=True))
    except RowError:
        raise
    except Exception as exc:  # a template may raise anything on a conversation it rejects
        raise RowError(f"the chat template failed: {type(exc).__name__}: {exc}") from exc
    if full_ids[: len(prefix_ids)] != prefix_ids:
        raise RowError(
            "the chat template is not prefix-stable: the tokens of the conversation do not"
            " start with the tokens of its prompt (add_generation_prompt=True), so the"
            " assistant part cannot be located"
        )
    if len(full_ids) == len(prefix_ids):
        raise RowError("the chat template rendered no tokens for the last assistant message")
    loss_mask = [0] * len(prefix_ids) + [1] * (len(full_ids) - len(prefix_ids))
    return Row(full_ids, loss_mask)


def check_row(row: Row, vocab_size: Optional[int], max_seq_length: Optional[int]) -> None:
    """Limits that depend on the model and options; RowError if exceeded."""
    if max_seq_length is not None and len(row.input_ids) > max_seq_length:
        raise RowError(
            f"{len(row.input_ids)} tokens, more than --max-seq-length {max_seq_length}"
            " (rows are not truncated here)"
        )
    if vocab_size is not None:
        too_big = [t for t in row.input_ids if t >= vocab_size]
        if too_big:
            raise RowError(
                f"token id {max(too_big)} is not below the model's vocab_size {vocab_size}"
            )


def model_vocab_size(model_dir: Path) -> Optional[int]:
    """vocab_size from the model's config.json (top level or text_config), None if absent."""
    path = model_dir / "config.json"
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"--model {path}: not valid JSON ({exc})") from exc
    if not isinstance(config, dict):
        raise DataError(f"--model {path}: expected a JSON object")
    value = config.get("vocab_size")
    if value is None and isinstance(config.get("text_config"), dict):
        value = config["text_config"].get("vocab_size")
    return value if _is_int(value) and value > 0 else None


def load_tokenizer(model_dir: Path) -> Any:
    """The model's tokenizer (needs transformers); DataError if unusable."""
    if not model_dir.is_dir():
        raise DataError(f"--model {model_dir}: not a directory")
    from transformers import AutoTokenizer  # heavy; only needed to tokenize

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    except Exception as exc:
        raise DataError(
            f"--model {model_dir}: cannot load a tokenizer ({type(exc).__name__}: {exc})"
        ) from exc
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(f"--model {model_dir}: the tokenizer has no chat template")
    return tokenizer


def build_rows(
    records: Iterable[Record],
    tokenizer: Any,
    vocab_size: Optional[int],
    max_seq_length: Optional[int],
) -> list[Row]:
    """Tokenize conversations, check every row; DataError naming the row's origin."""
    rows = []
    for record in records:
        try:
            if record.row is not None:
                row = record.row
            else:
                row = tokenize_conversation(tokenizer, record.conversation or [])
            check_row(row, vocab_size, max_seq_length)
        except RowError as exc:
            raise DataError(f"{record.where}: {exc}") from exc
        rows.append(row)
    return rows


def write_rows(path: Path, rows: Iterable[Row]) -> None:
    """Write JSONL atomically: a temporary file in the same directory, then rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp, tmp.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(row.to_json() + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def build(
    out: Path,
    model: Optional[Path] = None,
    input_path: Optional[Path] = None,
    smoke_rows: int = 10,
    max_seq_length: Optional[int] = None,
) -> dict[str, Any]:
    """Read or make the chats, build and check every row, then write them; return the summary."""
    if max_seq_length is not None and max_seq_length < 1:
        raise DataError(f"--max-seq-length must be positive, got {max_seq_length}")
    if input_path is None:
        if smoke_rows < 1:
            raise DataError(f"--smoke-rows must be positive, got {smoke_rows}")
        source = SOURCE_SMOKE
        records = [
            Record(f"smoke row {i}", KIND_CONVERSATIONS, conversation=conv)
            for i, conv in enumerate(smoke_conversations(smoke_rows))
        ]
    else:
        records = read_input(input_path)
        source = records[0].kind

    if source == KIND_PRETOKENIZED:
        tokenizer = None
        vocab_size = None
        if model is not None:
            vocab_size = model_vocab_size(model)
            if vocab_size is None:
                vocab_size = len(load_tokenizer(model))
    else:
        if model is None:
            raise DataError("--model is required to tokenize conversations (the verifier dir)")
        tokenizer = load_tokenizer(model)
        vocab_size = model_vocab_size(model)

    rows = build_rows(records, tokenizer, vocab_size, max_seq_length)
    write_rows(out, rows)
    return {
        "path": str(out),
        "rows": len(rows),
        "tokens": sum(len(r.input_ids) for r in rows),
        "trainable_tokens": sum(sum(r.loss_mask) for r in rows),
        "source": source,
        "input": None if input_path is None else str(input_path),
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m specfleet_helpers.stages.chat_data",
        description=(
            "Write speculators training rows (JSONL of input_ids + loss_mask) for"
            " `speculators prepare-data`: the runbook's smoke chats, or a JSONL file of"
            " conversations (tokenized with the verifier's chat template, loss on the last"
            " assistant turn) or of pre-tokenized rows (validated and passed through)."
            " Every row is checked before the output is written (atomically)."
        ),
        epilog=(
            "exit status: 0 ok (one JSON line on stdout: path, rows, tokens,"
            " trainable_tokens, source, input); 2 bad input, reported as <file>:<line>:"
            " <reason>; 1 other failures"
        ),
    )
    parser.add_argument(
        "--model",
        type=Path,
        metavar="VERIFIER_DIR",
        help=(
            "verifier directory (tokenizer, chat template, config.json vocab_size); required"
            " unless --input holds pre-tokenized rows, whose ids are then checked against it"
        ),
    )
    parser.add_argument(
        "--out", type=Path, help="JSONL file to write (required unless --check-only)"
    )
    parser.add_argument(
        "--check-only",
        action="store_true",
        help=(
            "only parse and validate every row of --input (no model, nothing written): what"
            " the settings check runs on the controller before any host work"
        ),
    )
    parser.add_argument(
        "--input",
        type=Path,
        metavar="FILE.jsonl",
        help="rows of {conversations: [...]} or {input_ids, loss_mask}; default: smoke chats",
    )
    parser.add_argument(
        "--smoke-rows",
        type=int,
        default=10,
        metavar="N",
        help="number of smoke chats when no --input is given (default: %(default)s)",
    )
    parser.add_argument(
        "--max-seq-length",
        type=int,
        metavar="N",
        help="fail on a row longer than N tokens (rows are never truncated here)",
    )
    return parser


def check_only(path: Path) -> dict[str, Any]:
    """Every row of a JSONL input parsed and validated, without a model: its kind and count."""
    records = read_input(path)
    return {"input": str(path), "rows": len(records), "kind": records[0].kind}


def main(argv: Optional[list[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.check_only and args.input is None:
        parser.error("--check-only needs --input")
    if not args.check_only and args.out is None:
        parser.error("--out is required (unless --check-only)")
    try:
        if args.check_only:
            result = check_only(args.input)
        else:
            result = build(args.out, args.model, args.input, args.smoke_rows, args.max_seq_length)
    except DataError as exc:
        print(f"chat_data: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"chat_data: cannot write --out {args.out}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
