"""Tests for specfleet_helpers.checks.stack_report against the interpreter running the tests."""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from procutil import HELPERS, run_helper
from specfleet_helpers.checks import stack_report
from specfleet_helpers.checks.stack_report import (
    check_expectations,
    constraints,
    distribution_versions,
    soc_version,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
MISSING = "specfleet-no-such-distribution"
PYTEST_VERSION = pytest.__version__


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return run_helper("specfleet_helpers.checks.stack_report", *args)


def test_distribution_versions_installed_and_missing():
    assert distribution_versions(["pytest", MISSING]) == {"pytest": PYTEST_VERSION, MISSING: None}


def test_constraints_pins_sorted_and_skips_missing():
    versions = {"vllm": "0.9.1", "torch": "2.5.1", "torch_npu": None, "triton": ""}
    assert constraints(versions) == ["torch==2.5.1", "vllm==0.9.1"]
    assert constraints({}) == []


def test_check_expectations_all_met():
    assert check_expectations([f"pytest=={PYTEST_VERSION}"], [MISSING]) == []


def test_check_expectations_wrong_version():
    assert check_expectations(["pytest==0.0.1"], []) == [
        f"pytest is {PYTEST_VERSION}, expected 0.0.1"
    ]


def test_check_expectations_missing_distribution():
    assert check_expectations([f"{MISSING}==1.0"], []) == [
        f"{MISSING} is not installed, expected 1.0"
    ]


def test_check_expectations_unexpectedly_present():
    assert check_expectations([], ["pytest"]) == [
        f"pytest {PYTEST_VERSION} is installed, expected absent"
    ]


def test_check_expectations_reports_every_problem():
    problems = check_expectations(["pytest==0.0.1", f"{MISSING}==2"], ["pytest"])
    assert len(problems) == 3


def test_cli_expect_met_prints_the_report():
    proc = run_cli(f"--expect=pytest=={PYTEST_VERSION}", "--dist=pytest", f"--dist={MISSING}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["python"] == platform.python_version()
    assert report["versions"] == {"pytest": PYTEST_VERSION, MISSING: None}
    assert "npu_available" not in report
    assert "constraints" not in report


def test_cli_default_distributions_are_the_runbook_list():
    proc = run_cli()
    assert proc.returncode == 0, proc.stderr
    versions = json.loads(proc.stdout)["versions"]
    assert {"torch", "torch_npu", "vllm", "vllm-ascend", "transformers"} <= set(versions)


def test_cli_expect_wrong_version_exits_1():
    proc = run_cli("--expect=pytest==0.0.1")
    assert proc.returncode == 1
    assert proc.stdout.strip() == f"pytest is {PYTEST_VERSION}, expected 0.0.1"


def test_cli_expect_absent_exits_1():
    proc = run_cli("--expect-absent=pytest")
    assert proc.returncode == 1
    assert proc.stdout.strip() == f"pytest {PYTEST_VERSION} is installed, expected absent"


def test_cli_constraints_out(tmp_path):
    out = tmp_path / "constraints.txt"
    proc = run_cli("--dist=pytest", f"--dist={MISSING}", f"--constraints-out={out}")
    assert proc.returncode == 0, proc.stderr
    lines = out.read_text().splitlines()
    assert lines[0].startswith("#")
    assert lines[1:] == [f"pytest=={PYTEST_VERSION}"]
    assert json.loads(proc.stdout)["constraints"] == [f"pytest=={PYTEST_VERSION}"]


@pytest.mark.skipif(
    importlib.util.find_spec("torch_npu") is not None, reason="torch_npu is installed here"
)
def test_cli_npu_without_torch_npu():
    proc = run_cli("--npu", "--dist=pytest")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["npu_available"] is False
    assert report["npu_count"] == 0
    assert "ModuleNotFoundError" in report["npu_error"]


def _fake_dist(site, name: str, editable: bool | None) -> None:
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    if editable is not None:
        url = {"url": "file:///src/x", "dir_info": {"editable": editable}}
        (info / "direct_url.json").write_text(json.dumps(url))


def test_editable_expectations(tmp_path):
    site = tmp_path / "site"
    _fake_dist(site, "fromgit", editable=True)
    _fake_dist(site, "fromwheel", editable=None)
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{HELPERS}"}

    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "specfleet_helpers.checks.stack_report", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )

    assert run("--expect-editable=fromgit", "--expect-not-editable=fromwheel").returncode == 0
    wrong = run("--expect-not-editable=fromgit")
    assert wrong.returncode == 1
    assert "fromgit is an editable install, expected a regular one" in wrong.stdout
    wrong = run("--expect-editable=fromwheel")
    assert wrong.returncode == 1
    assert "fromwheel is not an editable install" in wrong.stdout


# -- torch_npu's SoC version (issue 9) --------------------------------------------------------

MOCK_NPU = REPO_ROOT / "tests" / "integration" / "mock_npu"


def test_soc_version_reads_what_vllm_ascend_reads():
    fake = SimpleNamespace(npu=SimpleNamespace(get_soc_version=lambda: 251))
    assert soc_version(fake) == (251, None)


def test_soc_version_falls_back_to_the_c_binding():
    fake = SimpleNamespace(
        npu=SimpleNamespace(), _C=SimpleNamespace(_npu_get_soc_version=lambda: 224)
    )
    assert soc_version(fake) == (224, None)


def test_soc_version_unreadable_says_why():
    def broken() -> int:
        raise RuntimeError("no device")

    soc, error = soc_version(SimpleNamespace(npu=SimpleNamespace(get_soc_version=broken)))
    assert soc is None
    assert "torch_npu.npu.get_soc_version(): RuntimeError: no device" in error
    soc, error = soc_version(SimpleNamespace())
    assert soc is None and "neither" in error


def test_cli_npu_reports_the_soc_and_the_visible_devices():
    """With the MOCK torch/torch_npu of tests/integration/mock_npu (NPU hardware mocked)."""
    env = {
        **os.environ,
        "PYTHONPATH": f"{HELPERS}{os.pathsep}{MOCK_NPU}",
        "ASCEND_TOOLKIT_HOME": "/nonexistent/mock",
        "MOCK_NPU_COUNT": "8",
        "MOCK_NPU_SOC_VERSION": "260",
        "ASCEND_RT_VISIBLE_DEVICES": "0,1",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "specfleet_helpers.checks.stack_report", "--npu", "--dist=pytest"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["npu_available"] is True
    assert report["npu_count"] == 2
    assert report["soc_version"] == 260
    assert report["soc_error"] is None


VLLM_ASCEND = Path(__file__).parent.parent / "fixtures" / "vllm_ascend"


@pytest.mark.parametrize(("release", "gate"), [("v0.23.0", "present"), ("v0.20.2rc1", "absent")])
def test_the_dflash_lm_head_gate_is_read_from_the_installed_source(release, gate):
    """vllm-ascend v0.23.0 keeps a reduced-vocabulary DFlash draft's lm_head (the d2t gate);
    v0.20.2rc1 replaces it (issue #11374). Read within the function only: `propose` mentions
    draft_id_to_target_id in both."""
    found = stack_report.dflash_lm_head_gate(str(VLLM_ASCEND / release))
    assert found["gate"] == gate, found
    assert found["file"].endswith("spec_decode/llm_base_proposer.py")


def test_the_gate_is_unknown_without_the_function_and_absent_package_said(tmp_path):
    (tmp_path / "spec_decode").mkdir()
    (tmp_path / "spec_decode" / "llm_base_proposer.py").write_text("def other():\n    pass\n")
    assert stack_report.dflash_lm_head_gate(str(tmp_path))["gate"] == "unknown"
    assert stack_report.dflash_lm_head_gate(None)["gate"] == "not_installed"
    assert stack_report.vllm_ascend_dir() is None  # not on this machine
