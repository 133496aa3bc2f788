"""Tests for specfleet_helpers.stages.chat_data.

Validation, JSONL parsing and the mask construction run in-process (no torch/transformers; a
fake tokenizer stands in for the chat template). The real tokenization runs the module's CLI
with the CPU venv's Python (SPECFLEET_TEST_VENV_PYTHON) on a tiny byte-level BPE tokenizer
with Qwen special tokens and a Qwen3-style chat template, built by the test.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from specfleet_helpers.stages.chat_data import (
    SMOKE_ANSWER,
    DataError,
    Record,
    RowError,
    build,
    build_rows,
    main,
    model_vocab_size,
    read_input,
    smoke_conversations,
    tokenize_conversation,
    write_rows,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
HELPERS = REPO_ROOT / "python_helpers"
VENV_PYTHON = Path(
    os.environ.get(
        "SPECFLEET_TEST_VENV_PYTHON", str(REPO_ROOT / ".work" / "local" / "venv" / "bin" / "python")
    )
)

# Qwen3-style chat template: assistant turns carry an empty think block.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' + message['content']"
    " + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
THINK = "<think>\n\n</think>\n\n"


def render(messages: list[dict[str, str]], add_generation_prompt: bool = False) -> str:
    """What CHAT_TEMPLATE renders, in Python."""
    text = ""
    for message in messages:
        if message["role"] == "assistant":
            text += f"<|im_start|>assistant\n{THINK}{message['content']}<|im_end|>\n"
        else:
            text += f"<|im_start|>{message['role']}\n{message['content']}<|im_end|>\n"
    return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


class FakeTokenizer:
    """One token per character (id = code point); returns like transformers 5.x or 4.x."""

    def __init__(self, batch_encoding: bool = True, generation_prompt: str = "") -> None:
        self.batch_encoding = batch_encoding
        self.generation_prompt = generation_prompt  # extra text: breaks prefix stability

    def apply_chat_template(
        self, messages: list[dict[str, str]], tokenize: bool, add_generation_prompt: bool = False
    ) -> Any:
        assert tokenize
        text = render(messages, add_generation_prompt)
        if add_generation_prompt:
            text += self.generation_prompt
        ids = [ord(c) for c in text]
        return {"input_ids": ids, "attention_mask": [1] * len(ids)} if self.batch_encoding else ids


def decode_fake(ids: list[int]) -> str:
    return "".join(map(chr, ids))


def conversation(*turns: tuple[str, str]) -> list[dict[str, str]]:
    return [{"role": role, "content": content} for role, content in turns]


def write_jsonl(path: Path, lines: list[Any]) -> Path:
    path.write_text(
        "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    )
    return path


CHAT = {"conversations": conversation(("user", "Hi"), ("assistant", "Hello"))}
PRETOK = {"input_ids": [5, 6, 7, 8], "loss_mask": [0, 0, 1, 1]}


# --- smoke chats and the mask construction --------------------------------------------------


def test_smoke_conversations_are_the_runbook_chats():
    chats = smoke_conversations(10)
    assert len(chats) == 10
    assert chats[3] == [
        {"role": "user", "content": "Briefly describe AI topic #3."},
        {"role": "assistant", "content": "AI is a field of computer science."},
    ]


@pytest.mark.parametrize("batch_encoding", [True, False], ids=["transformers5", "transformers4"])
def test_mask_covers_the_assistant_answer(batch_encoding: bool):
    chat = smoke_conversations(1)[0]
    row = tokenize_conversation(FakeTokenizer(batch_encoding=batch_encoding), chat)
    prompt = render(chat[:1], add_generation_prompt=True)
    assert decode_fake(row.input_ids) == render(chat)
    assert row.loss_mask == [0] * len(prompt) + [1] * (len(row.input_ids) - len(prompt))
    trained = [t for t, m in zip(row.input_ids, row.loss_mask) if m]
    assert decode_fake(trained) == f"{THINK}{SMOKE_ANSWER}<|im_end|>\n"


def test_multi_turn_loss_on_last_assistant_turn_only():
    chat = conversation(
        ("system", "Be brief."),
        ("user", "Q1"),
        ("assistant", "A1"),
        ("user", "Q2"),
        ("assistant", "A2"),
    )
    row = tokenize_conversation(FakeTokenizer(), chat)
    trained = [t for t, m in zip(row.input_ids, row.loss_mask) if m]
    assert decode_fake(trained) == f"{THINK}A2<|im_end|>\n"
    assert row.loss_mask == sorted(row.loss_mask)  # zeros, then ones


def test_template_that_is_not_prefix_stable_fails():
    with pytest.raises(RowError, match="not prefix-stable"):
        tokenize_conversation(FakeTokenizer(generation_prompt="!"), CHAT["conversations"])


def test_template_that_renders_nothing_for_the_answer_fails():
    class NoAnswer(FakeTokenizer):
        def apply_chat_template(self, messages, tokenize, add_generation_prompt=False):
            return super().apply_chat_template(messages[:1], tokenize, True)

    with pytest.raises(RowError, match="rendered no tokens"):
        tokenize_conversation(NoAnswer(), CHAT["conversations"])


def test_template_error_is_reported():
    class Raising(FakeTokenizer):
        def apply_chat_template(self, messages, tokenize, add_generation_prompt=False):
            raise ValueError("No user query found in messages.")

    with pytest.raises(RowError, match="chat template failed: ValueError: No user query"):
        tokenize_conversation(Raising(), CHAT["conversations"])


# --- JSONL parsing: every malformed row names its file and line -----------------------------


@pytest.mark.parametrize(
    ("bad_line", "reason"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object, got list"),
        ({"text": "hi"}, "expected 'conversations' or 'input_ids' + 'loss_mask', got keys"),
        ({**CHAT, **PRETOK}, "both 'conversations' and 'input_ids'"),
        ({"conversations": "hi"}, "'conversations' must be a list"),
        ({"conversations": []}, "'conversations' is empty"),
        ({"conversations": ["hi"]}, "conversations[0] must be an object"),
        ({"conversations": [{"content": "x"}]}, "conversations[0] has no 'role'"),
        ({"conversations": [{"role": "user"}]}, "conversations[0] has no 'content'"),
        (
            {"conversations": [{"role": "user", "content": 3}]},
            "conversations[0].content must be a string",
        ),
        (
            {"conversations": conversation(("user", "x"), ("robot", "y"))},
            "conversations[1]: unknown role 'robot'",
        ),
        (
            {"conversations": conversation(("user", "x"), ("assistant", "y"), ("user", "z"))},
            "the last message must be the assistant's",
        ),
        ({"conversations": conversation(("assistant", "y"))}, "at least one message before"),
    ],
)
def test_bad_conversation_row_names_file_and_line(tmp_path: Path, bad_line: Any, reason: str):
    path = write_jsonl(tmp_path / "in.jsonl", [CHAT, bad_line, CHAT])
    with pytest.raises(DataError) as info:
        read_input(path)
    assert str(info.value).startswith(f"{path}:2: ")
    assert reason in str(info.value)


@pytest.mark.parametrize(
    ("bad_row", "reason"),
    [
        ({"input_ids": [1, 2]}, "pre-tokenized row has no 'loss_mask'"),
        ({"loss_mask": [1]}, "pre-tokenized row has no 'input_ids'"),
        ({"input_ids": "12", "loss_mask": [1]}, "'input_ids' must be a list, got str"),
        ({"input_ids": [], "loss_mask": []}, "'input_ids' is empty"),
        ({"input_ids": [1, 2, 3], "loss_mask": [0, 1]}, "has 3 tokens but 'loss_mask' has 2"),
        ({"input_ids": [1, 2.5], "loss_mask": [0, 1]}, "input_ids[1] must be a non-negative"),
        ({"input_ids": [1, True], "loss_mask": [0, 1]}, "input_ids[1] must be a non-negative"),
        ({"input_ids": ["1", 2], "loss_mask": [0, 1]}, "input_ids[0] must be a non-negative"),
        ({"input_ids": [-1, 2], "loss_mask": [0, 1]}, "input_ids[0] must be a non-negative"),
        ({"input_ids": [1, 2], "loss_mask": [0, 2]}, "loss_mask[1] must be 0 or 1, got 2"),
        ({"input_ids": [1, 2], "loss_mask": [0, True]}, "loss_mask[1] must be 0 or 1"),
        ({"input_ids": [1, 2], "loss_mask": [0, 0]}, "'loss_mask' has no 1"),
    ],
)
def test_bad_pretokenized_row_names_file_and_line(tmp_path: Path, bad_row: Any, reason: str):
    path = write_jsonl(tmp_path / "in.jsonl", [PRETOK, PRETOK, bad_row])
    with pytest.raises(DataError) as info:
        read_input(path)
    assert str(info.value).startswith(f"{path}:3: ")
    assert reason in str(info.value)


def test_mixed_kinds_fail(tmp_path: Path):
    path = write_jsonl(tmp_path / "in.jsonl", [PRETOK, CHAT])
    with pytest.raises(DataError) as info:
        read_input(path)
    assert str(info.value) == (
        f"{path}:2: conversations row in a file of pretokenized rows (first at {path}:1);"
        " use one kind per file"
    )


def test_blank_lines_are_skipped_and_line_numbers_kept(tmp_path: Path):
    path = write_jsonl(tmp_path / "in.jsonl", [PRETOK, "", "   ", PRETOK])
    records = read_input(path)
    assert [r.where for r in records] == [f"{path}:1", f"{path}:4"]
    assert records[1].row is not None
    assert records[1].row.loss_mask == [0, 0, 1, 1]


@pytest.mark.parametrize(
    ("content", "reason"), [(None, "no such file"), ("", "no rows"), ("\n\n", "no rows")]
)
def test_missing_or_empty_input_fails(tmp_path: Path, content: Any, reason: str):
    path = tmp_path / "in.jsonl"
    if content is not None:
        path.write_text(content)
    with pytest.raises(DataError, match=reason):
        read_input(path)


# --- building and writing -------------------------------------------------------------------


def test_pretokenized_rows_pass_through_without_a_tokenizer(tmp_path: Path):
    other = {"input_ids": [1], "loss_mask": [1], "source": "extra keys are dropped"}
    path = write_jsonl(tmp_path / "in.jsonl", [PRETOK, other])
    out = tmp_path / "out" / "prompts.jsonl"
    result = build(out, input_path=path)
    assert result == {
        "path": str(out),
        "rows": 2,
        "tokens": 5,
        "trainable_tokens": 3,
        "source": "pretokenized",
        "input": str(path),
    }
    assert [json.loads(line) for line in out.read_text().splitlines()] == [
        PRETOK,
        {"input_ids": [1], "loss_mask": [1]},
    ]
    assert sorted(p.name for p in out.parent.iterdir()) == ["prompts.jsonl"]


def test_token_ids_must_be_below_the_model_vocab(tmp_path: Path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"vocab_size": 9}))
    path = write_jsonl(tmp_path / "in.jsonl", [PRETOK, {"input_ids": [7, 9], "loss_mask": [0, 1]}])
    out = tmp_path / "prompts.jsonl"
    out.write_text("old\n")
    with pytest.raises(DataError) as info:
        build(out, model=model, input_path=path)
    assert str(info.value) == f"{path}:2: token id 9 is not below the model's vocab_size 9"
    assert out.read_text() == "old\n"  # nothing written on error


def test_max_seq_length_fails_with_the_line(tmp_path: Path):
    long_row = {"input_ids": list(range(9)), "loss_mask": [1] * 9}
    path = write_jsonl(tmp_path / "in.jsonl", [PRETOK, long_row])
    out = tmp_path / "prompts.jsonl"
    with pytest.raises(DataError, match=r":2: 9 tokens, more than --max-seq-length 8"):
        build(out, input_path=path, max_seq_length=8)
    assert not out.exists()
    assert build(out, input_path=path, max_seq_length=9)["rows"] == 2


def test_conversation_errors_name_the_line_after_tokenizing(tmp_path: Path):
    long_chat = {"conversations": conversation(("user", "x" * 50), ("assistant", "y"))}
    path = write_jsonl(tmp_path / "in.jsonl", [CHAT, long_chat])
    records = read_input(path)
    limit = len(render(CHAT["conversations"]))  # the fake tokenizer: one token per character
    with pytest.raises(
        DataError, match=rf"^{path}:2: {len(render(long_chat['conversations']))} tokens, more than"
    ):
        build_rows(records, FakeTokenizer(), None, limit)
    with pytest.raises(DataError, match=rf"^{path}:1: token id \d+ is not below"):
        build_rows(records, FakeTokenizer(), 100, None)
    with pytest.raises(DataError, match=rf"^{path}:1: the chat template is not prefix-stable"):
        build_rows(records, FakeTokenizer(generation_prompt="!"), None, None)
    assert [len(r.input_ids) for r in build_rows(records[:1], FakeTokenizer(), 128, limit)] == [
        limit
    ]


def test_smoke_records_are_named_in_errors():
    records = [
        Record(f"smoke row {i}", "conversations", conversation=c)
        for i, c in enumerate(smoke_conversations(2))
    ]
    with pytest.raises(DataError, match=r"^smoke row 0: the chat template is not prefix-stable"):
        build_rows(records, FakeTokenizer(generation_prompt="!"), None, None)


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({}, "--model is required to tokenize conversations"),
        ({"smoke_rows": 0}, "--smoke-rows must be positive"),
        ({"max_seq_length": 0}, "--max-seq-length must be positive"),
        ({"model": Path("/nonexistent-specfleet-model")}, "not a directory"),
    ],
)
def test_bad_options_fail(tmp_path: Path, kwargs: dict[str, Any], reason: str):
    with pytest.raises(DataError, match=reason):
        build(tmp_path / "out.jsonl", **kwargs)


def test_model_vocab_size(tmp_path: Path):
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"vocab_size": 77}}))
    assert model_vocab_size(tmp_path) == 77
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 1024}))
    assert model_vocab_size(tmp_path) == 1024
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(DataError, match=r"config\.json: not valid JSON"):
        model_vocab_size(tmp_path)
    (tmp_path / "config.json").unlink()
    assert model_vocab_size(tmp_path) is None


def test_write_rows_replaces_atomically(tmp_path: Path):
    out = tmp_path / "prompts.jsonl"
    out.write_text("old\n")
    records = read_input(write_jsonl(tmp_path / "in.jsonl", [PRETOK]))
    write_rows(out, build_rows(records, None, None, None))
    assert json.loads(out.read_text()) == PRETOK
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "prompts.jsonl"]


def test_main_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    bad = write_jsonl(tmp_path / "bad.jsonl", [PRETOK, PRETOK, {"input_ids": [1]}])
    assert main(["--out", str(tmp_path / "o.jsonl"), "--input", str(bad)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"chat_data: {bad}:3: pre-tokenized row has no 'loss_mask'\n"

    good = write_jsonl(tmp_path / "good.jsonl", [PRETOK])
    assert main(["--out", str(tmp_path / "o.jsonl"), "--input", str(good)]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == 1


def test_check_only_validates_rows_without_a_model_or_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    good = write_jsonl(tmp_path / "good.jsonl", [CHAT, CHAT])
    assert main(["--check-only", "--input", str(good)]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "input": str(good),
        "rows": 2,
        "kind": "conversations",
    }
    bad = write_jsonl(tmp_path / "bad.jsonl", [CHAT, "{not json", CHAT])
    assert main(["--check-only", "--input", str(bad)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"chat_data: {bad}:2: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "good.jsonl"]


def test_check_only_needs_input_and_build_needs_out(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit):
        main(["--check-only"])
    assert "--check-only needs --input" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([])
    assert "--out is required" in capsys.readouterr().err


# --- the real thing: CLI in the CPU venv with a tiny Qwen-style tokenizer --------------------

BUILD_TOKENIZER = """
import sys
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

# Qwen2/Qwen3 pre-tokenizer split, then byte-level
pattern = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
    r"| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
)
tokenizer = Tokenizer(models.BPE())
tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
    pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
])
tokenizer.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(
    vocab_size=400,
    special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    show_progress=False,
)
corpus = [
    "Briefly describe AI topic #1. AI is a field of computer science.",
    "You are a helpful assistant. What is a token? A piece of text.",
]
tokenizer.train_from_iterator(corpus * 20, trainer)
tokenizer.save(sys.argv[1])
"""


def byte_decoder() -> dict[str, int]:
    """GPT-2 byte-level alphabet: printable character -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def tokenizer_decoder(model_dir: Path) -> Callable[[list[int]], str]:
    """Decode ids with tokenizer.json alone (stdlib), independently of the code under test."""
    data = json.loads((model_dir / "tokenizer.json").read_text())
    tokens = {i: t for t, i in data["model"]["vocab"].items()}
    specials = {t["id"]: t["content"] for t in data["added_tokens"]}
    to_byte = byte_decoder()

    def decode(ids: list[int]) -> str:
        raw = bytearray()
        for i in ids:
            if i in specials:
                raw += specials[i].encode()
            else:
                raw += bytes(to_byte[c] for c in tokens[i])
        return raw.decode("utf-8")

    return decode


@functools.cache
def venv_problem() -> str:
    """Why the CPU venv cannot run the real tokenization ("" when it can)."""
    if not VENV_PYTHON.exists():
        return (
            f"CPU venv python {VENV_PYTHON} not found (set SPECFLEET_TEST_VENV_PYTHON to a"
            " Python with transformers and tokenizers)"
        )
    probe = subprocess.run(
        [
            str(VENV_PYTHON),
            "-c",
            "import importlib.util, sys; sys.exit(any(importlib.util.find_spec(m) is None"
            " for m in ('tokenizers', 'transformers')))",
        ],
        capture_output=True,
        timeout=60,
    )
    return f"{VENV_PYTHON} lacks tokenizers or transformers" if probe.returncode else ""


def venv_python() -> Path:
    problem = venv_problem()
    if problem:
        pytest.skip(problem)
    return VENV_PYTHON


def run_venv(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(venv_python()), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(HELPERS), "HF_HUB_OFFLINE": "1"},
    )


@pytest.fixture(scope="module")
def verifier_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A verifier directory as chat_data sees it: tokenizer files and config.json."""
    model = tmp_path_factory.mktemp("tiny-qwen3")
    proc = run_venv("-c", BUILD_TOKENIZER, str(model / "tokenizer.json"))
    assert proc.returncode == 0, proc.stderr
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 4096,
        "chat_template": CHAT_TEMPLATE,
    }
    (model / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    config = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 512}
    (model / "config.json").write_text(json.dumps(config))
    return model


MULTI_TURN_CHATS = [
    conversation(
        ("system", "You are a helpful assistant."),
        ("user", "What is a token?"),
        ("assistant", "A piece of text."),
        ("user", "Briefly describe AI topic #7."),
        ("assistant", SMOKE_ANSWER),
    ),
    conversation(("user", "What is a token?"), ("assistant", "A piece of text.")),
]

CliRun = tuple[dict[str, Any], list[dict[str, list[int]]]]


@pytest.fixture(scope="module")
def cli_runs(verifier_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, CliRun]:
    """The CLI on the smoke chats and on a conversations file, run side by side (each spends
    most of its time importing transformers)."""
    work = tmp_path_factory.mktemp("chat-data")
    chats = write_jsonl(work / "chats.jsonl", [{"conversations": c} for c in MULTI_TURN_CHATS])
    commands = {
        "smoke": ["--out", str(work / "smoke.jsonl")],
        "conversations": ["--out", str(work / "chats-out.jsonl"), "--input", str(chats)],
    }
    cli = [str(venv_python()), "-m", "specfleet_helpers.stages.chat_data"]
    cli += ["--model", str(verifier_dir)]
    procs = {
        name: subprocess.Popen(
            [*cli, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(HELPERS), "HF_HUB_OFFLINE": "1"},
        )
        for name, args in commands.items()
    }
    runs = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"chat_data {name} failed:\n{stderr}"
        result = json.loads(stdout.strip().splitlines()[-1])
        rows = [json.loads(line) for line in Path(result["path"]).read_text().splitlines()]
        runs[name] = (result, rows)
    return runs


def split_row(row: dict[str, list[int]]) -> tuple[list[int], list[int]]:
    ids, mask = row["input_ids"], row["loss_mask"]
    assert len(ids) == len(mask)
    first = mask.index(1)
    assert mask == [0] * first + [1] * (len(mask) - first), "mask must be 0s then 1s"
    return ids[:first], ids[first:]


def test_cli_smoke_rows(verifier_dir: Path, cli_runs: dict[str, CliRun]):
    result, rows = cli_runs["smoke"]
    decode = tokenizer_decoder(verifier_dir)
    assert len(rows) == 10
    assert result["path"].endswith("smoke.jsonl")
    assert (result["rows"], result["source"], result["input"]) == (10, "smoke", None)
    assert result["tokens"] == sum(len(r["input_ids"]) for r in rows)
    assert result["trainable_tokens"] == sum(sum(r["loss_mask"]) for r in rows)
    for i, row in enumerate(rows):
        prompt, answer = split_row(row)
        assert decode(prompt) == (
            f"<|im_start|>user\nBriefly describe AI topic #{i}.<|im_end|>\n<|im_start|>assistant\n"
        )
        assert decode(answer) == f"{THINK}{SMOKE_ANSWER}<|im_end|>\n"


def test_cli_conversations_file(verifier_dir: Path, cli_runs: dict[str, CliRun]):
    result, rows = cli_runs["conversations"]
    decode = tokenizer_decoder(verifier_dir)
    assert (result["rows"], result["source"]) == (2, "conversations")
    for chat, row in zip(MULTI_TURN_CHATS, rows):
        prompt, answer = split_row(row)
        assert decode(prompt) == render(chat[:-1], add_generation_prompt=True)
        assert decode(answer) == f"{THINK}{chat[-1]['content']}<|im_end|>\n"


def test_cli_in_the_venv_rejects_bad_rows_before_writing(verifier_dir: Path, tmp_path: Path):
    path = write_jsonl(tmp_path / "in.jsonl", [CHAT, {"input_ids": [1], "loss_mask": [1]}])
    out = tmp_path / "p.jsonl"
    proc = run_venv(
        "-m",
        "specfleet_helpers.stages.chat_data",
        "--model",
        str(verifier_dir),
        "--out",
        str(out),
        "--input",
        str(path),
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr == (
        f"chat_data: {path}:2: pretokenized row in a file of conversations rows"
        f" (first at {path}:1); use one kind per file\n"
    )
    assert not out.exists()


def test_help_runs_without_heavy_imports():
    proc = subprocess.run(
        [sys.executable, "-m", "specfleet_helpers.stages.chat_data", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(HELPERS)},
    )
    assert proc.returncode == 0
    assert "--max-seq-length" in proc.stdout
