"""Tests for specfleet_helpers.host.npu_memory: the memory settings a host's HBM allows (from
recorded npu-smi outputs), and the wait for a stopped server's memory before the next start
(against a MOCK npu-smi: a script that replays recorded outputs, busy first, then idle)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from procutil import run_helper
from specfleet_helpers.host import npu_memory, npu_smi

FIXTURES = Path(__file__).parent.parent / "fixtures" / "npu-smi"


def summary(name: str) -> dict:
    return npu_smi.summarize(npu_smi.parse_info((FIXTURES / name).read_text()))


def test_an_idle_910b4_cannot_give_0_9():
    """The runbook's case: an idle 910B4 holds ~2.9 of 32 GB. 0.9 would leave ~1 % beside it
    (vllm-ascend refuses to start below total x share free); the plan gives 0.88, a context
    and a batch that fit 32 GB."""
    memory = summary("a2_910b4_1npu_idle_26.0.rc1_container_pid_col.txt")["memory"]
    assert memory == {
        "hbm_total_mb": 32768,
        "idle_used_mb": 2871,
        "gpu_memory_utilization": 0.88,
        "max_model_len": 8192,
        "max_num_batched_tokens": 4096,
        "max_num_seqs": 128,
    }
    assert 32768 - 2871 - npu_memory.HEADROOM_MB < 32768 * 0.9  # what 0.9 would ask


@pytest.mark.parametrize(
    "name", ["a2_910b1_8npu_idle_24.1.rc3.txt", "a3_ascend910_8npu_16die_idle_24.1.rc3.5.txt"]
)
def test_64_gb_parts_keep_the_defaults(name):
    memory = summary(name)["memory"]
    assert memory["hbm_total_mb"] == 65536 and memory["gpu_memory_utilization"] == 0.93
    assert memory["max_model_len"] is None and memory["max_num_batched_tokens"] == 8192


def test_busy_devices_do_not_shrink_the_plan():
    """A device with a process listed (a server left running, the service of an earlier run)
    says nothing about what an idle one can give; with every device busy there is no plan."""
    assert summary("a2_910b4_8npu_busy_multiproc_noname_25.2.3.txt")["memory"] is None
    assert npu_memory.utilization(32768, 2922, 0.9) == 0.87  # the runbook's idle reading
    assert npu_memory.utilization(65536, 3373, 0.9) == 0.9


BUSY = "a2_910b4_8npu_busy_multiproc_noname_25.2.3.txt"
IDLE = "a2_910b4_8npu_idle_25.0.rc1.1.txt"


def mock_npu_smi(tmp_path: Path, outputs: list[str]) -> Path:
    """MOCK npu-smi (there is no NPU here): `info` prints the recorded outputs in turn, the
    last one from then on."""
    for n, name in enumerate(outputs):
        (tmp_path / f"out{n}.txt").write_text((FIXTURES / name).read_text())
    script = tmp_path / "npu-smi"
    script.write_text(
        "#!/bin/sh\n"
        f'd={tmp_path}; n=$(cat "$d/count" 2>/dev/null || echo 0)\n'
        f'[ -f "$d/out$n.txt" ] || n={len(outputs) - 1}\n'
        'cat "$d/out$n.txt"; echo $((n + 1)) > "$d/count"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_wait_returns_once_the_memory_is_back(tmp_path, monkeypatch):
    idle = summary(IDLE)["chips"]
    busy = summary(BUSY)["chips"]
    readings = iter([busy, busy, idle])
    slept: list[float] = []
    done = npu_memory.wait(0.85, {0, 1}, 60, lambda: next(readings), slept.append)
    assert done["free"] is True and len(slept) == 2


def test_wait_names_the_devices_still_short(tmp_path):
    busy = summary(BUSY)["chips"]
    clock = iter([0.0, 0.0, 100.0])
    with pytest.raises(ValueError) as failed:
        npu_memory.wait(0.85, {1, 5}, 30, lambda: busy, lambda _: None, lambda: next(clock))
    text = str(failed.value)
    assert text.startswith("device memory not free after 30 s for gpu_memory_utilization 0.85")
    assert "device 1 (NPU 1 chip 0): 29267 of 32768 MB used" in text
    assert "device 0 " not in text  # not watched


def test_cli_wait_against_a_mock_npu_smi(tmp_path):
    script = mock_npu_smi(tmp_path, [BUSY, IDLE])
    done = run_helper(
        "specfleet_helpers.host.npu_memory", "wait", "--utilization", "0.85", "--devices", "all",
        "--timeout", "30", "--npu-smi", str(script), timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["free"] is True
    stuck = mock_npu_smi(tmp_path / "s", [BUSY]) if (tmp_path / "s").mkdir() is None else None
    failed = run_helper(
        "specfleet_helpers.host.npu_memory", "wait", "--utilization", "0.85", "--devices", "3",
        "--timeout", "0", "--npu-smi", str(stuck), timeout=60,
    )  # fmt: skip
    assert failed.returncode == 1 and "device 3 (NPU 3 chip 0)" in failed.stderr
    planned = run_helper(
        "specfleet_helpers.host.npu_memory", "plan", "--utilization", "0.9",
        "--input", str(FIXTURES / IDLE), timeout=60,
    )  # fmt: skip
    assert planned.returncode == 0, planned.stderr
    assert json.loads(planned.stdout)["hbm_total_mb"] == 32768
