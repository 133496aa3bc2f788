"""Tests for specfleet_helpers.stages.prompt_set: the synthesized training prompts and the
benchmark prompts kept apart from them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from specfleet_helpers.stages import prompt_set


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_benchmark_prompts_are_never_trained_on():
    every_train = set(
        prompt_set.train_prompts(len(prompt_set.all_prompts()) - prompt_set.BENCH_POOL)
    )
    every_bench = set(prompt_set.bench_prompts(prompt_set.BENCH_POOL))
    assert not every_train & every_bench
    assert len(every_train) + len(every_bench) == len(prompt_set.all_prompts())


def test_the_files_are_the_same_for_the_same_count(tmp_path):
    """The data stage's fingerprint relies on it (and the serve stage's benchmark compares
    hosts on the same prompts)."""
    first = prompt_set.write("train", 100, tmp_path / "a.jsonl")
    second = prompt_set.write("train", 100, tmp_path / "b.jsonl")
    assert first["sha256"] == second["sha256"] and first["rows"] == 100
    rows = read(tmp_path / "a.jsonl")
    assert rows[0]["conversations"][0]["role"] == "user"
    assert len({row["id"] for row in rows}) == 100
    bench = prompt_set.write("bench", 8, tmp_path / "bench.jsonl")
    assert bench["rows"] == 8 and all(
        set(row) == {"prompt"} for row in read(tmp_path / "bench.jsonl")
    )


@pytest.mark.parametrize(("kind", "count"), [("train", 0), ("train", 961), ("bench", 65)])
def test_counts_out_of_range_exit_2(tmp_path, capsys, kind, count):
    assert prompt_set.main([kind, "--count", str(count), "--out", str(tmp_path / "x")]) == 2
    assert f"{kind} --count must be 1.." in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_check_accepts_what_regenerate_responses_reads(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text(
        "\n".join(
            json.dumps(row)
            for row in (
                {"prompt": "Hello"},
                {
                    "messages": [
                        {"role": "system", "content": "be brief"},
                        {"role": "user", "content": "Hi"},
                    ]
                },
                {
                    "conversations": [
                        {"from": "human", "value": "Hi"},
                        {"from": "gpt", "value": "Hello"},
                    ]
                },
            )
        )
        + "\n\n"
    )
    assert prompt_set.check(good) == {"path": str(good), "kind": "check", "rows": 3}


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("{not json", "not JSON"),
        ('{"prompt": "  "}', "no prompt"),
        ('{"messages": [{"role": "assistant", "content": "only me"}]}', "no prompt"),
        ('["Hello"]', "no prompt"),
    ],
)
def test_check_names_the_first_bad_line(tmp_path, capsys, line, reason):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "fine"}\n' + line + "\n")
    assert prompt_set.main(["check", "--input", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:2: {reason}" in err, err


def test_check_refuses_an_empty_file(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert prompt_set.main(["check", "--input", str(empty)]) == 2
    assert "no rows" in capsys.readouterr().err
