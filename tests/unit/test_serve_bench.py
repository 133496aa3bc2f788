"""Tests for specfleet_helpers.stages.serve_bench: the serve stage's measurement, alternating
rounds of the plain verifier and each draft, its figures, and the floors they are held to."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
from specfleet_helpers.stages import serve_bench


def test_rounds_rotate_the_order():
    arms = ["plain", "trained", "yardstick"]
    assert [serve_bench.round_order(arms, i) for i in range(4)] == [
        ["plain", "trained", "yardstick"],
        ["yardstick", "plain", "trained"],
        ["trained", "yardstick", "plain"],
        ["plain", "trained", "yardstick"],
    ]
    # each round starts with the server the round before ended with (kept up in turn)
    for i in range(1, 5):
        assert serve_bench.round_order(arms, i)[0] == serve_bench.round_order(arms, i - 1)[-1]
    assert serve_bench.round_order(["plain", "trained"], 1) == ["trained", "plain"]


class FakeBench:
    """vLLM's client as run() calls it: parse the CLI's arguments, then main(args) saves the
    result file and returns it. The plain server is slow in round 2 (a busy host)."""

    def __init__(self, fail_on: str = "") -> None:
        self.calls: list[tuple[str, str]] = []
        self.fail_on = fail_on

    def parse(self, argv: list[str]) -> argparse.Namespace:
        parser = argparse.ArgumentParser()
        parser.add_argument("--base-url")
        parser.add_argument("--save-result", action="store_true")
        parser.add_argument("--result-dir")
        parser.add_argument("--result-filename")
        parser.add_argument("--num-prompts", type=int)
        return parser.parse_args(argv)

    def main(self, args: argparse.Namespace) -> dict[str, Any]:
        arm = args.result_filename.split("_")[1]
        self.calls.append((arm, args.base_url))
        print("a table vLLM prints")
        if arm == self.fail_on:
            raise ConnectionError("server went away")
        round_number = int(args.result_filename.split("_r")[1].split(".")[0])
        speed = {"plain": 100.0, "trained": 250.0, "yardstick": 300.0}[arm]
        if arm == "plain" and round_number == 2:
            speed = 50.0
        result = {
            "date": f"r{round_number}", "completed": args.num_prompts, "failed": 0,
            "output_throughput": speed, "mean_tpot_ms": 1000 / speed,
        }  # fmt: skip
        if arm != "plain":
            result.update(
                spec_decode_num_drafts=10, spec_decode_draft_tokens=50,
                spec_decode_accepted_tokens=30 if arm == "trained" else 40,
                spec_decode_per_position_acceptance_rates=[0.8, 0.6, 0.6, 0.5, 0.5],
            )  # fmt: skip
        Path(args.result_dir, args.result_filename).write_text(json.dumps(result))
        return result


URLS = {"plain": "http://h:8001", "trained": "http://h:8000", "yardstick": "http://h:8002"}


def test_run_benchmarks_every_arm_each_round_in_one_process(tmp_path, capsys):
    fake = FakeBench()
    serve_bench.run(tmp_path, URLS, [1, 2, 3], ["--num-prompts", "4"], 3, (fake.parse, fake.main))
    assert [arm for arm, _ in fake.calls] == [
        "plain", "trained", "yardstick", "yardstick", "plain", "trained",
        "trained", "yardstick", "plain",
    ]  # fmt: skip
    assert ("trained", "http://h:8000") in fake.calls
    shown = capsys.readouterr().out
    assert "round 2/3 plain     50.0 output tok/s" in shown
    assert "round 1/3 yardstick 300.0 output tok/s, acceptance length" not in shown  # none given
    assert (tmp_path / "bench_plain_r2.log").read_text().startswith("a table vLLM prints")
    summary = serve_bench.summarize(
        tmp_path, 3, {"trained": "/d/trained", "yardstick": "/d/converted"}, "together"
    )
    # Round 2's slow plain server inflates that round's ratio only: the median holds.
    assert summary["trained"]["speedup"]["rounds"] == [2.5, 5.0, 2.5]
    assert summary["trained"]["speedup"]["median"] == 2.5
    assert summary["trained"]["speedup"]["max"] == 5.0
    assert summary["trained"]["mean_acceptance_length"] == pytest.approx(4.0)
    assert summary["yardstick"]["acceptance_rate"] == pytest.approx(0.8)
    assert summary["plain"]["output_throughput"]["median"] == 100.0


def test_one_round_at_a_time_for_servers_in_turn(tmp_path):
    fake = FakeBench()
    serve_bench.run(tmp_path, {"plain": URLS["plain"]}, [2], ["--num-prompts", "4"], 3,
                    (fake.parse, fake.main))  # fmt: skip
    assert fake.calls == [("plain", "http://h:8001")]
    assert (tmp_path / "bench_plain_r2.json").exists()


def test_a_failed_benchmark_names_the_server_the_round_and_the_log(tmp_path):
    fake = FakeBench(fail_on="yardstick")
    with pytest.raises(RuntimeError) as failed:
        serve_bench.run(tmp_path, URLS, [1], ["--num-prompts", "4"], 3, (fake.parse, fake.main))
    text = str(failed.value)
    assert "against the yardstick server (http://h:8002), round 1" in text
    assert "ConnectionError: server went away" in text and "bench_yardstick_r1.log" in text


def test_a_server_that_died_is_an_error_not_a_figure(tmp_path):
    """A dead server answers every request with an error at once; vLLM's client still saves a
    result (0 completed, all failed): that is a failure naming the server and its log."""
    fake = FakeBench()
    dead = fake.main

    def main(args):
        result = dead(args)
        if "trained" in args.result_filename:
            result.update(completed=0, failed=4, output_throughput=0.0)
        return result

    with pytest.raises(RuntimeError) as failed:
        serve_bench.run(
            tmp_path, URLS, [1], ["--num-prompts", "4"], 3, (fake.parse, main),
            server_logs={"trained": "/logs/serve.trained.vllm.log"},
        )  # fmt: skip
    assert "4 of 4 requests failed against the trained server (http://h:8000), round 1" in str(
        failed.value
    )
    assert "its server's log, /logs/serve.trained.vllm.log" in str(failed.value)


def test_a_missing_round_is_an_error_not_a_figure(tmp_path):
    fake = FakeBench()
    serve_bench.run(tmp_path, URLS, [1, 2], ["--num-prompts", "4"], 3, (fake.parse, fake.main))
    with pytest.raises(FileNotFoundError):
        serve_bench.summarize(tmp_path, 3, {"trained": "/d"}, "together")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("yardstick.mal=3", "FIGURE one of"),
        ("verifier.speedup=1", "ARM one of trained, yardstick"),
        ("trained.speedup", "expected ARM.FIGURE=NUMBER"),
        ("trained.speedup=fast", "'fast' is not a number"),
    ],
)
def test_bad_floors_are_named(text, problem):
    with pytest.raises(ValueError, match=problem):
        serve_bench.parse_floor(text)


def test_cli_run_help_and_bad_arm(tmp_path):
    assert serve_bench.main(["run", "--dir", str(tmp_path), "--rounds", "3", "--arm",
                             "other=http://x", "--", "--num-prompts", "1"]) == 1  # fmt: skip
    with pytest.raises(SystemExit) as shown:
        serve_bench.main(["run", "--help"])
    assert shown.value.code == 0
