"""Tests for specfleet_helpers.stages.serve_result: combine the serve checks into result.json and
verify it, including the API key check (a server with a key must have refused a request
without it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from specfleet_helpers.stages import serve_result

HELPERS = Path(__file__).resolve().parents[2] / "python_helpers"

CHAT = {"ok": True, "content": "hi there", "completion_tokens": 8, "finish_reason": "length"}
METRICS = {
    "ok": True,
    "num_drafts": 5.0,
    "num_draft_tokens": 15.0,
    "num_accepted_tokens": 3.0,
    "acceptance_rate": 0.2,
    "mean_acceptance_length": 1.6,
}
AUTH_OK = {
    "ok": True,
    "api_key_enforced": True,
    "path": "/v1/chat/completions",
    "without_key": 401,
    "wrong_key": 401,
}


def write(path: Path, data: dict[str, Any]) -> Path:
    # As the serve script leaves them: the check's progress, then its JSON line last.
    path.write_text("noise\n" + json.dumps(data) + "\n")
    return path


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "specfleet_helpers.stages.serve_result", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(HELPERS)},
    )


@pytest.fixture
def checks(tmp_path: Path) -> dict[str, Path]:
    return {
        "chat": write(tmp_path / "chat.json", CHAT),
        "metrics": write(tmp_path / "metrics.json", METRICS),
        "auth": write(tmp_path / "auth.json", AUTH_OK),
        "out": tmp_path / "result.json",
    }


def test_without_a_key_nothing_is_required_and_enforcement_is_recorded_false(checks):
    serve_result.combine(checks["chat"], checks["metrics"], None, None, checks["out"])
    summary = serve_result.verify(checks["out"], 8, require_lossless=False)
    assert summary["api_key_enforced"] is False
    assert summary["completion_tokens"] == 8
    with pytest.raises(ValueError, match="did not refuse a request without its API key: no check"):
        serve_result.verify(checks["out"], 8, require_lossless=False, require_api_key=True)


def test_a_refused_request_is_recorded_and_passes(checks):
    combined = serve_result.combine(
        checks["chat"], checks["metrics"], None, None, checks["out"], auth=checks["auth"]
    )
    assert combined["auth"] == AUTH_OK
    summary = serve_result.verify(checks["out"], 8, False, require_api_key=True)
    assert summary["api_key_enforced"] is True


def test_an_unenforced_key_fails_verify_with_the_check_error(checks, tmp_path):
    bad = {
        "ok": False,
        "api_key_enforced": False,
        "without_key": 200,
        "wrong_key": 200,
        "error": "the server does not enforce its API key: POST ... -> HTTP 200, expected 401",
    }
    serve_result.combine(
        checks["chat"],
        checks["metrics"],
        None,
        None,
        checks["out"],
        auth=write(tmp_path / "bad.json", bad),
    )
    assert serve_result.verify(checks["out"], 8, False)["api_key_enforced"] is False
    with pytest.raises(ValueError, match="does not enforce its API key"):
        serve_result.verify(checks["out"], 8, False, require_api_key=True)


def test_cli_combine_and_verify_with_require_api_key(checks):
    args = ["--chat", str(checks["chat"]), "--metrics", str(checks["metrics"])]
    assert run_cli("combine", *args, "--out", str(checks["out"])).returncode == 0
    verify = ["verify", "--result", str(checks["out"]), "--max-tokens", "8"]
    plain = run_cli(*verify)
    assert plain.returncode == 0, plain.stderr
    assert json.loads(plain.stdout)["api_key_enforced"] is False
    required = run_cli(*verify, "--require-api-key")
    assert required.returncode == 1
    assert "did not refuse a request without its API key" in required.stderr

    combined = run_cli("combine", *args, "--auth", str(checks["auth"]), "--out", str(checks["out"]))
    assert combined.returncode == 0, combined.stderr
    passed = run_cli(*verify, "--require-api-key")
    assert passed.returncode == 0, passed.stderr
    assert json.loads(passed.stdout)["api_key_enforced"] is True


def test_verify_still_checks_the_smoke_completion(checks, tmp_path):
    short = write(
        tmp_path / "short.json", {**CHAT, "finish_reason": "stop", "completion_tokens": 3}
    )
    serve_result.combine(short, checks["metrics"], None, None, checks["out"], auth=checks["auth"])
    with pytest.raises(ValueError, match=r"finish_reason is .stop.*completion_tokens is 3"):
        serve_result.verify(checks["out"], 8, False, require_api_key=True)
