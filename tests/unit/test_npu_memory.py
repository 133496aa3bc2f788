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


def chips(name: str) -> list[dict]:
    return summary(name)["chips"]


# The runbook's host: one 910B4 (32 GB), idle; and the same host with the DFlash endpoint
# (serve_mode service) serving on its only device: DERIVED from the idle capture by adding the
# endpoint's process row (tests/fixtures/npu-smi/SOURCES.md), 27170 MB beside 2922 of its own.
ONE_CARD_IDLE = "a2_910b4_1npu_idle_26.0.rc1_container_pid_col.txt"
ONE_CARD_SERVING = "a2_910b4_1npu_busy_26.0.rc1_container_pid_col_DERIVED.txt"
# 8 x 910B3 (64 GB), a process on device 0 (real, npu-smi 26.1.0).
B3_DEVICE0_BUSY = "a2_910b3_8npu_1proc_26.1.0_container_pid_col.txt"
ONE_CARD_PLAN = {
    "devices": [{"id": 0, "hbm_total_mb": 32768}],
    "hbm_total_mb": 32768,
    "own_used_mb": 2871,
    "gpu_memory_utilization": 0.88,
    "max_model_len": 8192,
    "max_num_batched_tokens": 4096,
    "max_num_seqs": 128,
}


def plan(name: str, setting=None, count: int = 1, runtime: str = "host", kept=None) -> dict:
    return npu_memory.plan(chips(name), setting, count, runtime, kept=kept)


def test_an_idle_910b4_cannot_give_0_9():
    """The runbook's case: an idle 910B4 holds ~2.9 of 32 GB. 0.9 would leave ~1 % beside it
    (vllm-ascend refuses to start below total x share free); the plan gives 0.88, a context
    and a batch that fit 32 GB."""
    done = plan(ONE_CARD_IDLE)
    assert done["memory"] == ONE_CARD_PLAN
    assert (
        done["memory_kept"] is False and done["memory_reason"] == "measured (no plan recorded yet)"
    )
    assert 32768 - 2871 - npu_memory.HEADROOM_MB < 32768 * 0.9  # what 0.9 would ask


@pytest.mark.parametrize(
    "name", ["a2_910b1_8npu_idle_24.1.rc3.txt", "a3_ascend910_8npu_16die_idle_24.1.rc3.5.txt"]
)
def test_64_gb_parts_keep_the_defaults(name):
    memory = plan(name, count=3)["memory"]
    assert memory["hbm_total_mb"] == 65536 and memory["gpu_memory_utilization"] == 0.93
    assert memory["max_model_len"] is None and memory["max_num_batched_tokens"] == 8192
    assert [d["id"] for d in memory["devices"]] == [0, 1, 2]


def test_the_endpoint_serving_on_the_only_device_keeps_the_plan():
    """The one-card host after a run that left the endpoint serving on its only device: the
    endpoint's memory is not the device's own (its redeploy takes it again), so the plan an
    earlier run recorded still fits and is kept as it was; the stages' limits stay the same."""
    kept = plan(ONE_CARD_IDLE)["memory"]
    again = plan(ONE_CARD_SERVING, kept=kept)
    assert again["memory"] == ONE_CARD_PLAN
    assert again["memory_kept"] is True, again["memory_reason"]
    assert "beside the 2922 MB they hold of their own" in again["memory_reason"]
    # Without a recorded plan the busy reading still gives one: from the device's own 2922 MB.
    fresh = plan(ONE_CARD_SERVING)["memory"]
    assert fresh["own_used_mb"] == 2922 and fresh["gpu_memory_utilization"] == 0.87
    assert fresh["max_model_len"] == 8192


def test_a_process_on_the_device_used_is_not_its_own():
    """specfleet_npu_devices [0] on a host whose device 0 runs a process (5175 of the 8676 MB
    in use): the plan covers device 0 alone, from the 3501 MB it holds of its own."""
    done = plan(B3_DEVICE0_BUSY, setting=[0])
    assert done["used_device_ids"] == [0] and done["available_device_ids"] == [0]
    assert done["memory"]["devices"] == [{"id": 0, "hbm_total_mb": 65536}]
    assert done["memory"]["own_used_mb"] == 8676 - 5175
    assert done["memory"]["gpu_memory_utilization"] == 0.93
    kept = plan(B3_DEVICE0_BUSY, setting=[0], kept=done["memory"])
    assert kept["memory_kept"] is True and kept["memory"] == done["memory"]
    # The other seven are reported, not planned for.
    assert [d["logic_id"] for d in done["other_devices"]] == [1, 2, 3, 4, 5, 6, 7]
    assert done["said"][0] == (
        "device 0 (NPU 0 chip 0) OK HBM 8676/65536 MB, 5175 MB of it the processes listed: used"
    )
    assert done["said"][1].endswith(": not used")


def test_an_idle_device_drifting_keeps_the_plan():
    """The same idle 910B4 reads 2871 or 2922 MB in use: measured afresh, 0.88 or 0.87, and
    every stage after hidden_states would run again. The plan measured at 2871 is kept at 2922
    (it leaves 1010 MB beside its share, more than KEEP_HEADROOM_MB)."""
    drifted = [dict(c, hbm_used_mb=2922) for c in chips(ONE_CARD_IDLE)]
    assert npu_memory.measure(drifted, 1.0)["gpu_memory_utilization"] == 0.87
    share, kept, reason = npu_memory.keep_or_measure(ONE_CARD_PLAN, drifted)
    assert (share, kept) == (ONE_CARD_PLAN, True), reason
    # A device that holds a gigabyte more of its own than the plan allows for: measured again.
    grown = [dict(c, hbm_used_mb=4000) for c in chips(ONE_CARD_IDLE)]
    share, kept, reason = npu_memory.keep_or_measure(ONE_CARD_PLAN, grown)
    assert kept is False and share["gpu_memory_utilization"] == 0.84
    assert reason.startswith("measured (the recorded share no longer fits: device 0 holds 4000 MB")


def test_other_hardware_or_other_devices_measure_again():
    """The kept plan is for the devices it names, with their HBM totals."""
    kept = plan(ONE_CARD_IDLE)["memory"]
    bigger = [dict(c, hbm_total_mb=65536) for c in chips(ONE_CARD_IDLE)]
    share, was_kept, reason = npu_memory.keep_or_measure(kept, bigger)
    assert not was_kept and reason == "measured (the HBM changed (device 0 32768 -> 65536 MB))"
    assert share["hbm_total_mb"] == 65536 and share["max_model_len"] is None
    idle8 = "a2_910b4_8npu_idle_25.0.rc1.1.txt"
    three = plan(idle8, count=3, kept=kept)
    assert not three["memory_kept"]
    assert three["memory_reason"] == "measured (the devices used changed (0 -> 0, 1, 2))"
    moved = plan(idle8, setting=[4], kept=kept)
    assert moved["memory_reason"] == "measured (the devices used changed (0 -> 4))"
    assert plan(idle8, kept=kept)["memory_kept"] is True  # device 0 of 32768 MB again


def test_the_stages_use_the_first_devices_made_available():
    idle8 = chips("a2_910b4_8npu_idle_25.0.rc1.1.txt")
    assert npu_memory.devices(idle8, None, 1, "host")["used_device_ids"] == [0]
    both = npu_memory.devices(idle8, None, 3, "host")
    assert both["available_device_ids"] == list(range(8))
    assert both["used_device_ids"] == [0, 1, 2]
    # more than there are: all of them (train's rule refuses too many ranks before any work)
    assert npu_memory.devices(idle8, [6, 7], 3, "host")["used_device_ids"] == [6, 7]
    assert npu_memory.devices(idle8, [0, 9], 1, "host")["missing_device_ids"] == [9]


@pytest.mark.parametrize(
    ("setting", "runtime", "used", "where"),
    [
        # host runtime: npu-smi's ids, in the list's order (ASCEND_RT_VISIBLE_DEVICES keeps it)
        ([4, 5], "host", [4, 5], [4, 5]),
        ([5, 4], "host", [5, 4], [5, 4]),
        # a container numbers the devices mounted into it from 0, ascending by their ids
        ([4, 5], "container", [4, 5], [0, 1]),
        ([5, 4], "container", [4, 5], [0, 1]),
        ([2, 6, 7], "container", [2, 6], [0, 1]),
        (None, "container", [0, 1], [0, 1]),
    ],
)
def test_device_ids_where_the_stages_run(setting, runtime, used, where):
    listed = chips("a2_910b4_8npu_idle_25.0.rc1.1.txt")
    done = npu_memory.devices(listed, setting, 2, runtime)
    assert (done["used_device_ids"], done["stage_device_ids"]) == (used, where)
    assert npu_memory.stage_id(7, [2, 6, 7], "container") == 2
    assert npu_memory.stage_id(7, [2, 6, 7], "host") == 7


def test_busy_devices_elsewhere_do_not_shrink_the_plan():
    """The devices a stage does not use say nothing about what a server may take."""
    busy8 = "a2_910b4_8npu_busy_multiproc_noname_25.2.3.txt"
    done = plan(busy8, setting=[3])
    # device 3: 9471 in use, 401 + 3179 + 3189 of it listed processes
    assert done["memory"]["own_used_mb"] == 9471 - 6769
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


def test_cli_plan_keeps_what_it_is_given(tmp_path):
    planned = run_helper(
        "specfleet_helpers.host.npu_memory", "plan", "--utilization", "0.85", "--devices", "4,5",
        "--count", "3", "--runtime", "container", "--input", str(FIXTURES / IDLE), timeout=60,
    )  # fmt: skip
    assert planned.returncode == 0, planned.stderr
    done = json.loads(planned.stdout)
    assert (done["used_device_ids"], done["stage_device_ids"]) == ([4, 5], [0, 1])
    assert done["memory"]["hbm_total_mb"] == 32768
    assert done["memory"]["gpu_memory_utilization"] == 0.85  # at most what is wanted
    # npu_smi's summary on stdin and the recorded plan: kept as it is
    summary_file = tmp_path / "summary.json"
    summary_file.write_text(json.dumps(summary(ONE_CARD_SERVING)))
    kept = run_helper(
        "specfleet_helpers.host.npu_memory", "plan", "--summary", str(summary_file),
        "--kept", json.dumps(ONE_CARD_PLAN), timeout=60,
    )  # fmt: skip
    assert kept.returncode == 0, kept.stderr
    assert json.loads(kept.stdout)["memory"] == ONE_CARD_PLAN
    assert json.loads(kept.stdout)["memory_kept"] is True
    helped = run_helper("specfleet_helpers.host.npu_memory", "plan", "--help", timeout=60)
    assert helped.returncode == 0
    for option in ("--devices", "--count", "--runtime", "--kept", "--summary"):
        assert option in helped.stdout
