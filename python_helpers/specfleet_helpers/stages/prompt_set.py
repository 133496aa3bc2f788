"""specfleet's synthesized prompt set: user prompts for on-policy training data and, disjoint
from them, the fixed prompts the serve stage benchmarks with.

DFlash drafts learn to predict what the verifier itself answers. Without a dataset (no hub
here, and a tiny random verifier on the CPU profile), specfleet asks the verifier to answer
prompts of its own: short chat questions made from templates and topics. The prompts are
enumerated and shuffled with a fixed seed; the first ``BENCH_POOL`` of them are kept for
benchmarking and never trained on, so the acceptance the serve stage measures is on prompts
the draft has not seen (of the same kind).

Two kinds of file::

    python -m specfleet_helpers.stages.prompt_set train --count 1000 --out prompts.jsonl
        {"id": "specfleet-prompt-N", "conversations": [{"role": "user", "content": "..."}]}
        (what `speculators regenerate-responses --dataset FILE` reads)
    python -m specfleet_helpers.stages.prompt_set bench --count 32 --out bench.jsonl
        {"prompt": "..."}  (what `vllm bench serve --dataset-name custom` reads)

Both are deterministic: the same count gives the same file, byte for byte. Prints one JSON
line: {"path", "kind", "rows", "sha256"}.

A prompts file of one's own for regenerate-responses is checked with::

    python -m specfleet_helpers.stages.prompt_set check --input prompts.jsonl

every line a JSON object with a user turn in "messages" or "conversations" (role/content or
from/value pairs), or a non-empty "prompt" string; exit 2 naming the first bad line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from pathlib import Path
from typing import Optional

from specfleet_helpers.files import write_atomic

TEMPLATES = (
    "Briefly describe {topic}.",
    "What is {topic}?",
    "Explain {topic} in one sentence.",
    "Why does {topic} matter?",
    "Give an example of {topic}.",
    "Tell me a fact about {topic}.",
    "How would you teach {topic} to a child?",
    "Write a short note about {topic}.",
    "List three things about {topic}.",
    "What is the history of {topic}?",
    "Compare {topic} with something similar.",
    "Summarize {topic} for an engineer.",
    "Hello! Can you tell me about {topic}?",
    "What are the benefits of {topic}?",
    "Describe {topic} in simple words.",
    "What would happen without {topic}?",
)
TOPICS = (
    "machine learning",
    "the ocean",
    "a compiler",
    "photosynthesis",
    "the moon",
    "jazz",
    "a neural network",
    "rain",
    "the Roman empire",
    "bread",
    "a database index",
    "gravity",
    "volcanoes",
    "chess",
    "a hash table",
    "the heart",
    "solar power",
    "a violin",
    "tea",
    "the internet",
    "a glacier",
    "electric cars",
    "mountains",
    "a sorting algorithm",
    "coffee",
    "the immune system",
    "a bridge",
    "honey bees",
    "the printing press",
    "snow",
    "an operating system",
    "democracy",
    "a rainbow",
    "wind turbines",
    "the desert",
    "a telescope",
    "poetry",
    "the stock market",
    "a lighthouse",
    "vaccines",
    "a river",
    "speculative decoding",
    "a GPU",
    "forests",
    "the piano",
    "cloud computing",
    "a castle",
    "batteries",
    "a marathon",
    "the alphabet",
    "an earthquake",
    "recycling",
    "a library",
    "the brain",
    "submarines",
    "a garden",
    "encryption",
    "the weather",
    "a train",
    "AI topic #3",
    "AI topic #7",
    "AI topic #11",
    "AI topic #19",
    "AI topic #42",
)
SEED = 20261204
# Part of the data stage's fingerprint: bump it when the prompts change.
PROMPT_SET_VERSION = 1
# Prompts reserved for benchmarks, never trained on.
BENCH_POOL = 64


def all_prompts() -> list[str]:
    """Every prompt, in the fixed shuffled order."""
    prompts = [template.format(topic=topic) for template in TEMPLATES for topic in TOPICS]
    random.Random(SEED).shuffle(prompts)
    return prompts


def bench_prompts(count: int) -> list[str]:
    if not 1 <= count <= BENCH_POOL:
        raise ValueError(f"bench --count must be 1..{BENCH_POOL}, got {count}")
    return all_prompts()[:count]


def train_prompts(count: int) -> list[str]:
    available = len(all_prompts()) - BENCH_POOL
    if not 1 <= count <= available:
        raise ValueError(f"train --count must be 1..{available}, got {count}")
    return all_prompts()[BENCH_POOL : BENCH_POOL + count]


def write(kind: str, count: int, out: Path) -> dict[str, object]:
    if kind == "train":
        lines = [
            json.dumps(
                {"id": f"specfleet-prompt-{i}", "conversations": [{"role": "user", "content": p}]}
            )
            for i, p in enumerate(train_prompts(count))
        ]
    else:
        lines = [json.dumps({"prompt": p}) for p in bench_prompts(count)]
    text = "".join(line + "\n" for line in lines)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, text)
    sha = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return {"path": str(out), "kind": kind, "rows": len(lines), "sha256": sha}


def user_turn(row: object) -> bool:
    """Whether regenerate-responses finds a prompt in this row."""
    if not isinstance(row, dict):
        return False
    prompt = row.get("prompt")
    if isinstance(prompt, str) and prompt.strip():
        return True
    for key in ("messages", "conversations", "prompt"):
        turns = row.get(key)
        if isinstance(turns, list):
            for turn in turns:
                if not isinstance(turn, dict):
                    continue
                role = turn.get("role", turn.get("from"))
                content = turn.get("content", turn.get("value"))
                if role in ("user", "human") and isinstance(content, str) and content.strip():
                    return True
    return False


def check(path: Path) -> dict[str, object]:
    """Rows of a prompts file; ValueError naming the first bad line."""
    rows = 0
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from None
            if not user_turn(row):
                raise ValueError(
                    f'{path}:{number}: no prompt: expected a user turn in "messages" or'
                    ' "conversations", or a non-empty "prompt" string'
                )
            rows += 1
    if rows == 0:
        raise ValueError(f"{path}: no rows")
    return {"path": str(path), "kind": "check", "rows": rows}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m specfleet_helpers.stages.prompt_set",
        description=(
            "Write specfleet's synthesized prompts: `train` rows for speculators"
            " regenerate-responses, or `bench` rows for vllm bench serve (disjoint from train)."
        ),
    )
    sub = parser.add_subparsers(dest="kind", required=True)
    for kind, what in (
        ("train", "prompts for speculators regenerate-responses (--dataset)"),
        ("bench", "prompts for vllm bench serve --dataset-name custom"),
    ):
        p = sub.add_parser(kind, help=what)
        p.add_argument("--count", type=int, required=True, help="number of prompts")
        p.add_argument("--out", type=Path, required=True, help="JSONL file to write")
    p = sub.add_parser("check", help="check a prompts file of one's own for regenerate-responses")
    p.add_argument("--input", type=Path, required=True)
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.kind == "check":
            result = check(args.input)
        else:
            result = write(args.kind, args.count, args.out)
    except (OSError, ValueError) as exc:
        print(f"prompt_set: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
