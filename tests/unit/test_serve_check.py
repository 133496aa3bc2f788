"""Tests for specfleet_helpers.checks.serve_check: the Prometheus parser and acceptance math on
literal text, and the client paths against a small fake OpenAI-compatible server on
127.0.0.1 (a real HTTP server in a thread)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from specfleet_helpers.checks import serve_check
from specfleet_helpers.checks.serve_check import (
    ACCEPTED,
    DRAFT_TOKENS,
    DRAFTS,
    CheckError,
    Client,
    metric_sums,
    parse_prometheus,
    spec_decode_stats,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
HELPERS = REPO_ROOT / "python_helpers"

# Shaped like vLLM 0.32's /metrics (prometheus_client): HELP/TYPE comments, _created
# samples, label sets per engine, a histogram with le="+Inf", escaped label values.
METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 0.0
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="tiny"} 50.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="tiny"} 20.0
# HELP vllm:spec_decode_num_drafts_created Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_created gauge
vllm:spec_decode_num_drafts_created{engine="0",model_name="tiny"} 1.7645e+09
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="tiny"} 150.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="tiny"} 60.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="tiny"} 40.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="tiny"} 14.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny",position="0"} 26.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="tiny"} 4.0
weird_metric{path="C:\\\\dir",quote="say \\"hi\\"",multi="a\\nb",comma="x,y"} NaN 1712345678000
no_labels_metric 3
"""

PLAIN_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 0.0
"""


def test_parser_reads_names_labels_values_and_skips_comments():
    samples = parse_prometheus(METRICS)
    names = [name for name, _labels, _value in samples]
    assert not any(name.startswith("#") for name in names)
    assert names.count(DRAFTS) == 2
    assert samples[0] == ("vllm:num_requests_running", {"engine": "0", "model_name": "tiny"}, 0.0)
    by_name = {name: (labels, value) for name, labels, value in samples}
    assert by_name["vllm:spec_decode_num_drafts_created"][1] == 1.7645e09
    assert by_name["vllm:e2e_request_latency_seconds_bucket"][0]["le"] == "+Inf"
    weird_labels, weird_value = by_name["weird_metric"]
    assert weird_labels == {
        "path": "C:\\dir",
        "quote": 'say "hi"',
        "multi": "a\nb",
        "comma": "x,y",
    }
    assert math.isnan(weird_value)
    assert by_name["no_labels_metric"] == ({}, 3.0)


def test_parser_rejects_garbage_with_the_line_number():
    with pytest.raises(ValueError, match="line 2"):
        parse_prometheus("# TYPE x counter\nthis is not a sample\n")
    with pytest.raises(ValueError, match="line 1"):
        parse_prometheus('x{a="1} 2\n')


def test_sums_over_label_sets_and_vllm_acceptance_math():
    sums = metric_sums(METRICS)
    assert sums == {DRAFTS: 70.0, DRAFT_TOKENS: 210.0, ACCEPTED: 54.0}
    stats = spec_decode_stats(sums)
    assert stats["num_drafts"] == 70.0
    assert stats["acceptance_rate"] == pytest.approx(54 / 210)  # 25.7 %
    assert stats["mean_acceptance_length"] == pytest.approx(1 + 54 / 70)  # 1.77
    assert stats["spec_decode_metrics_present"] is True


def test_absent_or_zero_counters_give_none_not_a_division_error():
    absent = spec_decode_stats(metric_sums(PLAIN_METRICS))
    assert absent["num_drafts"] is None
    assert absent["acceptance_rate"] is None
    assert absent["mean_acceptance_length"] is None
    assert absent["spec_decode_metrics_present"] is False
    zero = spec_decode_stats({DRAFTS: 0.0, DRAFT_TOKENS: 0.0, ACCEPTED: 0.0})
    assert zero["acceptance_rate"] is None
    assert zero["mean_acceptance_length"] is None
    assert zero["spec_decode_metrics_present"] is True


# ---------------------------------------------------------------- fake server


class FakeServer:
    """Answers like vLLM; `behaviour` selects the answers, `requests` records them."""

    def __init__(self) -> None:
        self.behaviour = "ok"
        self.metrics = METRICS
        self.requests: list[dict[str, Any]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, code: int, body: Any, ctype: str = "application/json") -> None:
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                fake.requests.append({"path": self.path, "headers": dict(self.headers)})
                if self.path == "/metrics":
                    self._send(200, fake.metrics.encode(), "text/plain; version=0.0.4")
                else:
                    self._send(404, {"detail": "Not Found"})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length))
                fake.requests.append(
                    {"path": self.path, "headers": dict(self.headers), "body": body}
                )
                if self.path != "/v1/chat/completions":
                    self._send(404, {"detail": "Not Found"})
                    return
                self._send(*fake.answer(body))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def answer(self, body: dict[str, Any]) -> tuple[int, Any]:
        max_tokens = body["max_tokens"]
        prompt = body["messages"][0]["content"]
        ids = [(len(prompt) * 7 + i) % 1000 for i in range(max_tokens)]
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": f"echo {prompt}"},
            "finish_reason": "length",
        }
        usage = {"prompt_tokens": 9, "completion_tokens": max_tokens, "total_tokens": 9}
        if self.behaviour == "ok" and body.get("return_token_ids"):
            choice["token_ids"] = ids
        if self.behaviour == "stop":
            choice["finish_reason"] = "stop"
            usage["completion_tokens"] = 3
        if self.behaviour == "error":
            return 400, {"error": {"message": "max_tokens is too large", "code": 400}}
        if self.behaviour == "no_usage":
            return 200, {"choices": [choice]}
        if self.behaviour == "no_choices":
            return 200, {"choices": [], "usage": usage}
        if self.behaviour == "not_json":
            return 200, b"<html>proxy error</html>"
        authorization = self.requests[-1]["headers"].get("Authorization")
        if self.behaviour == "auth" and authorization != "Bearer s3cret":
            return 401, {"error": "Unauthorized"}
        if self.behaviour == "any_key" and not authorization:
            return 401, {"error": "Unauthorized"}
        return 200, {
            "id": "chatcmpl-1",
            "model": body["model"],
            "choices": [choice],
            "usage": usage,
        }

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fake():
    server = FakeServer()
    yield server
    server.close()


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "specfleet_helpers.checks.serve_check", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(HELPERS), **(env or {})},
    )


def test_chat_passes_when_cut_at_max_tokens(fake):
    result = serve_check.check_chat(Client(fake.url), "tiny", "Hello", 8)
    assert result["ok"] is True
    assert result["content"] == "echo Hello"
    assert result["completion_tokens"] == 8
    assert result["finish_reason"] == "length"
    sent = fake.requests[-1]["body"]
    assert sent["messages"] == [{"role": "user", "content": "Hello"}]
    assert sent["max_tokens"] == 8
    assert sent["model"] == "tiny"


def test_chat_cli_fails_on_finish_reason_stop_unless_relaxed(fake):
    fake.behaviour = "stop"
    proc = run_cli("chat", "--url", fake.url, "--model", "tiny", "--max-tokens", "8")
    assert proc.returncode == 1
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["ok"] is False
    assert "finish_reason is 'stop'" in out["error"]
    assert "completion_tokens is 3, expected 8" in out["error"]
    assert proc.stderr.count("\n") == 1 and "chat check failed" in proc.stderr

    relaxed = run_cli(
        "chat", "--url", fake.url, "--model", "tiny", "--allow-stop", "--allow-fewer-tokens"
    )
    assert relaxed.returncode == 0, relaxed.stderr
    assert json.loads(relaxed.stdout)["ok"] is True


def test_chat_cli_ok_prints_one_json_line(fake):
    proc = run_cli("chat", "--url", fake.url + "/v1", "--model", "tiny", "--prompt", "Hi")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1
    out = json.loads(lines[0])
    assert out["ok"] is True
    assert out["completion_tokens"] == 8
    assert out["content"] == "echo Hi"
    assert fake.requests[-1]["path"] == "/v1/chat/completions"  # trailing /v1 tolerated


@pytest.mark.parametrize(
    ("behaviour", "message"),
    [
        ("error", 'HTTP 400: {"error": {"message": "max_tokens is too large"'),
        ("no_usage", "no usage.completion_tokens"),
        ("no_choices", "response has no choices"),
        ("not_json", "response is not JSON"),
    ],
)
def test_chat_reports_bad_answers(fake, behaviour, message):
    fake.behaviour = behaviour
    with pytest.raises(CheckError, match="POST /v1/chat/completions") as info:
        serve_check.check_chat(Client(fake.url), "tiny", "Hello", 8)
    assert message in str(info.value)
    proc = run_cli("chat", "--url", fake.url, "--model", "tiny")
    assert proc.returncode == 1
    assert message in json.loads(proc.stdout)["error"]
    assert proc.stderr.startswith("error: ")


def test_unreachable_server_is_a_clear_failure():
    # A port that nothing listens on: bind, note, close.
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = run_cli("metrics", "--url", f"http://127.0.0.1:{port}", "--timeout", "5")
    assert proc.returncode == 1
    assert "cannot reach" in json.loads(proc.stdout)["error"]


def test_api_key_comes_from_the_named_env_var_only(fake):
    fake.behaviour = "auth"
    without = run_cli("chat", "--url", fake.url, "--model", "tiny")
    assert without.returncode == 1
    assert "HTTP 401" in json.loads(without.stdout)["error"]

    proc = run_cli(
        "chat",
        "--url",
        fake.url,
        "--model",
        "tiny",
        "--api-key-env",
        "MY_VLLM_KEY",
        env={"MY_VLLM_KEY": "s3cret"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "s3cret" not in proc.stdout + proc.stderr

    missing = run_cli("chat", "--url", fake.url, "--model", "tiny", "--api-key-env", "NOPE_KEY")
    assert missing.returncode == 2
    assert "NOPE_KEY" in missing.stderr

    assert run_cli("chat", "--url", fake.url, "--model", "x", "--api-key", "k").returncode == 2


def test_auth_passes_only_when_requests_without_the_key_get_401(fake):
    fake.behaviour = "auth"
    proc = run_cli("auth", "--url", fake.url, "--model", "tiny", env={"VLLM_API_KEY": "s3cret"})
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out == {
        "ok": True,
        "api_key_enforced": True,
        "path": "/v1/chat/completions",
        "without_key": 401,
        "wrong_key": 401,
    }
    sent = fake.requests[-2:]
    assert "Authorization" not in sent[0]["headers"]
    wrong = sent[1]["headers"]["Authorization"]
    assert wrong.startswith("Bearer specfleet-wrong-key-")
    # The real key is never sent (nor read: the subcommand takes no --api-key-env).
    assert all("s3cret" not in json.dumps(r["headers"]) for r in sent)
    assert all(r["body"]["max_tokens"] == 1 for r in sent)
    assert "s3cret" not in proc.stdout + proc.stderr
    assert run_cli("auth", "--url", fake.url, "--model", "t", "--api-key-env", "X").returncode == 2


@pytest.mark.parametrize(
    ("behaviour", "without", "wrong"), [("ok", 200, 200), ("any_key", 401, 200)]
)
def test_auth_fails_when_the_server_answers_without_a_valid_key(fake, behaviour, without, wrong):
    fake.behaviour = behaviour
    proc = run_cli("auth", "--url", fake.url, "--model", "tiny")
    assert proc.returncode == 1
    out = json.loads(proc.stdout)
    assert out["ok"] is False and out["api_key_enforced"] is False
    assert (out["without_key"], out["wrong_key"]) == (without, wrong)
    assert "does not enforce its API key" in out["error"]
    if without != 401:
        assert "without an API key -> HTTP 200, expected 401" in out["error"]
    assert "with a wrong API key -> HTTP 200, expected 401" in out["error"]
    assert proc.stderr.startswith("error: the server does not enforce its API key")


def test_auth_against_an_unreachable_server_is_a_failure_not_a_pass():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = run_cli("auth", "--url", f"http://127.0.0.1:{port}", "--model", "m", "--timeout", "5")
    assert proc.returncode == 1
    assert "cannot reach" in json.loads(proc.stdout)["error"]


def test_metrics_cli(fake):
    proc = run_cli("metrics", "--url", fake.url, "--require-spec-decode")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["metrics"] == {DRAFTS: 70.0, DRAFT_TOKENS: 210.0, ACCEPTED: 54.0}
    assert out["acceptance_rate"] == pytest.approx(0.2571, abs=1e-4)
    assert out["mean_acceptance_length"] == pytest.approx(1.7714, abs=1e-4)

    fake.metrics = PLAIN_METRICS
    plain = run_cli("metrics", "--url", fake.url)
    assert plain.returncode == 0
    assert json.loads(plain.stdout)["spec_decode_metrics_present"] is False
    required = run_cli("metrics", "--url", fake.url, "--require-spec-decode")
    assert required.returncode == 1
    assert "no speculative decoding" in json.loads(required.stdout)["error"]

    fake.metrics = "garbage line here\n"
    bad = run_cli("metrics", "--url", fake.url)
    assert bad.returncode == 1
    assert "not a Prometheus sample" in json.loads(bad.stdout)["error"]


def test_greedy_returns_token_ids_per_prompt_and_falls_back_to_text(fake):
    proc = run_cli(
        *("greedy", "--url", fake.url, "--model", "tiny"),
        *("--prompt", "a", "--prompt", "bbb", "--max-tokens", "4"),
    )
    assert proc.returncode == 0, proc.stderr
    outputs = json.loads(proc.stdout)["outputs"]
    assert [o["prompt"] for o in outputs] == ["a", "bbb"]
    assert outputs[0]["token_ids"] == [7, 8, 9, 10]
    assert outputs[1]["token_ids"] == [21, 22, 23, 24]
    assert all(o["compare_by"] == "token_ids" for o in outputs)
    for request in fake.requests[-2:]:
        assert request["body"]["temperature"] == 0.0
        assert request["body"]["return_token_ids"] is True

    fake.behaviour = "ids_unsupported"
    outputs = serve_check.greedy(Client(fake.url), "tiny", ["a"], 4)
    assert outputs[0]["token_ids"] is None
    assert outputs[0]["compare_by"] == "text"
    assert outputs[0]["text"] == "echo a"


def test_bad_input_exit_2():
    assert run_cli("chat", "--url", "ftp://x", "--model", "m").returncode == 2
    zero = run_cli("chat", "--url", "http://127.0.0.1:1", "--model", "m", "--max-tokens", "0")
    assert zero.returncode == 2
    help_text = run_cli("--help")
    assert help_text.returncode == 0
    for command in ("chat", "metrics", "greedy", "auth"):
        assert command in help_text.stdout
