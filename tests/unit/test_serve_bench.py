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
                             "other=http://x", "--model", "m", "--tokenizer", "t",
                             "--prompts", "p.jsonl", "--num-prompts", "1",
                             "--output-len", "1"]) == 1  # fmt: skip
    with pytest.raises(SystemExit) as shown:
        serve_bench.main(["run", "--help"])
    assert shown.value.code == 0


def test_bench_argv_sends_the_prompts_untemplated_to_the_chat_endpoint(tmp_path):
    argv = serve_bench.bench_argv("Qwen/Qwen3-8B", "/m/v", tmp_path / "p.jsonl", 16, 256, 1, True)
    assert argv[argv.index("--backend") + 1] == "openai-chat"
    assert argv[argv.index("--endpoint") + 1] == "/v1/chat/completions"
    assert "--skip-chat-template" in argv and "--ignore-eos" in argv
    assert argv[argv.index("--dataset-path") + 1] == str(tmp_path / "p.jsonl")
    assert "--ignore-eos" not in serve_bench.bench_argv("m", "t", tmp_path, 1, 1, 1, False)


# --- what a server receives from the real client ----------------------------------------------

REPO = Path(__file__).resolve().parents[2]
CPU_VENV_PYTHON = REPO / ".work" / "local" / "venv" / "bin" / "python"
# The tiny verifier `make run` synthesized: its tokenizer carries a Qwen3-style chat template.
VERIFIER = REPO / ".work" / "local" / "models" / "verifier"


class RecordingChatServer:
    """A MOCK OpenAI-compatible server (no model: what matters is what it receives): it keeps
    every /v1/chat/completions body and streams a two-token answer with its usage, as vLLM's
    server does; /metrics is empty (no spec-decode counters)."""

    def __init__(self) -> None:
        import http.server
        import threading

        self.bodies: list[dict[str, Any]] = []
        bodies = self.bodies

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                bodies.append(body)
                chunks = [
                    {"choices": [{"delta": {"content": "hi"}}]},
                    {"choices": [{"delta": {"content": " there"}}]},
                    {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2}},
                ]
                stream = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Content-Length", str(len(stream.encode())))
                self.end_headers()
                self.wfile.write(stream.encode())

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.skipif(
    not (CPU_VENV_PYTHON.exists() and (VERIFIER / "tokenizer.json").exists()),
    reason="needs the CPU venv (vLLM's benchmark client) and the tiny verifier of `make run`",
)
def test_the_server_receives_each_prompt_as_the_user_message_templated_by_nobody(tmp_path):
    """serve_bench run, as the serve stage runs it (vLLM's own client, in the stage's Python),
    against a server that records what it receives: each benchmark prompt arrives as the user
    message, byte for byte, once, so the server's chat template is the only one applied.
    (Without --skip-chat-template the client rendered the chat template into the message.)"""
    import os
    import subprocess

    prompts = tmp_path / "bench_prompts.jsonl"
    sent = ["Briefly describe AI topic #7.", "What is 12 + 30? Answer with the number."]
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in sent))
    server = RecordingChatServer()
    try:
        done = subprocess.run(
            [str(CPU_VENV_PYTHON), "-m", "specfleet_helpers.stages.serve_bench", "run",
             "--dir", str(tmp_path / "bench"), "--rounds", "3", "--round", "1",
             "--arm", f"plain={server.url}", "--model", "Qwen/Qwen3-8B",
             "--tokenizer", str(VERIFIER), "--prompts", str(prompts), "--num-prompts", "2",
             "--output-len", "2", "--concurrency", "1", "--ignore-eos"],
            capture_output=True, text=True, timeout=300,
            env={**os.environ, "PYTHONPATH": str(REPO / "python_helpers")},
        )  # fmt: skip
    finally:
        server.close()
    log = (tmp_path / "bench" / "bench_plain_r1.log").read_text(errors="replace")[-3000:]
    assert done.returncode == 0, done.stderr[-3000:] + log
    # The client's readiness check sends the first prompt once more before the run.
    users = [[m for m in body["messages"] if m["role"] == "user"] for body in server.bodies]
    assert all(len(u) == 1 for u in users), server.bodies
    texts = [
        "".join(part["text"] for part in u[0]["content"])
        if isinstance(u[0]["content"], list)
        else u[0]["content"]
        for u in users
    ]
    assert set(texts) == set(sent) and texts[-2:] == sent, texts
    assert not any("<|im_start|>" in t or "<|im_end|>" in t for t in texts), texts
    assert all(b["model"] == "Qwen/Qwen3-8B" and b.get("ignore_eos") for b in server.bodies)
