"""Tests for specfleet_helpers.host.npu_smi against recorded real npu-smi outputs.

The fixtures are in tests/fixtures/npu-smi; SOURCES.md there says where each one came from.
The expected values below were read off the fixture text.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from specfleet_helpers.host.npu_smi import (
    Chip,
    NpuProcess,
    NpuSmiInfo,
    NpuSmiParseError,
    parse_board,
    parse_info,
    parse_info_m,
    soc_family,
    soc_variant,
    soc_version_from_board,
    summarize,
)

FIXTURES = Path(__file__).parent.parent / "fixtures" / "npu-smi"
REPO_ROOT = Path(__file__).resolve().parents[2]
HELPERS = REPO_ROOT / "python_helpers"

RUNBOOK_SAMPLE = """\
+------------------------------------------------------------------------------------------------+
| npu-smi 25.5.2                   Version: 25.5.2                                               |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0     910B4               | OK            | 89.9        39                0    / 0             |
| 0                         | 0000:41:00.0  | 0           0    / 0          2922 / 32768         |
+===========================+===============+====================================================+
+---------------------------+---------------+----------------------------------------------------+
| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |
+===========================+===============+====================================================+
| No running processes found in NPU 0                                                            |
+===========================+===============+====================================================+
"""


def read_fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def info_of(name: str) -> NpuSmiInfo:
    return parse_info(read_fixture(name))


def chip(info: NpuSmiInfo, npu_id: int, chip_id: int = 0) -> Chip:
    matches = [c for c in info.chips if c.npu_id == npu_id and c.chip_id == chip_id]
    assert len(matches) == 1, (npu_id, chip_id, info.chips)
    return matches[0]


def hbm(c: Chip) -> tuple[int | None, int | None]:
    return c.hbm_used_mb, c.hbm_total_mb


# ------------------------------------------------------------------------------------------
# Overview of every `npu-smi info` fixture
# ------------------------------------------------------------------------------------------

# fmt: off
INFO_FIXTURES = {
    # name: (version, npu ids, chip count, chip names, dies/NPU, process count, truncated, family)
    "a2_910b1_8npu_idle_24.1.rc3.txt": (
        "24.1.rc3", list(range(8)), 8, ["910B1"], 1, 0, False, "atlas-a2"
    ),
    "a2_910b3_8npu_1proc_noname_25.2.0.txt": (
        "25.2.0", list(range(8)), 8, ["910B3"], 1, 1, False, "atlas-a2"
    ),
    "a2_910b4_8npu_busy_multiproc_noname_25.2.3.txt": (
        "25.2.3", list(range(8)), 8, ["910B4"], 1, 13, False, "atlas-a2"
    ),
    "a2_910b4_4npu_container_vllmworker_24.1.rc3.txt": (
        "24.1.rc3", [0, 1, 2, 3], 4, ["910B4"], 1, 7, False, "atlas-a2"
    ),
    "a2_910b4_8npu_idle_25.0.rc1.1.txt": (
        "25.0.rc1.1", list(range(8)), 8, ["910B4"], 1, 0, False, "atlas-a2"
    ),
    "a2_910b4_1npu_idle_26.0.rc1_container_pid_col.txt": (
        "26.0.rc1", [0], 1, ["910B4"], 1, 0, True, "atlas-a2"
    ),
    "a2_910b3_8npu_1proc_26.1.0_container_pid_col.txt": (
        "26.1.0", list(range(8)), 8, ["910B3"], 1, 1, False, "atlas-a2"
    ),
    # DERIVED from the idle one above (SOURCES.md): the endpoint's process on the only device.
    "a2_910b4_1npu_busy_26.0.rc1_container_pid_col_DERIVED.txt": (
        "26.0.rc1", [0], 1, ["910B4"], 1, 1, False, "atlas-a2"
    ),
    "a2_910b2c_2npu_1proc_23.0.2.1_trailing_space.txt": (
        "23.0.2.1", [0, 1], 2, ["910B2C"], 1, 1, False, "atlas-a2"
    ),
    "a3_ascend910_8npu_16die_idle_24.1.rc3.5.txt": (
        "24.1.rc3.5", list(range(8)), 16, ["Ascend910"], 2, 0, False, "atlas-a3"
    ),
    "a3_ascend910_2npu_4die_1proc_25.2.0.txt": (
        "25.2.0", [0, 1], 4, ["Ascend910"], 2, 1, False, "atlas-a3"
    ),
    "950pr_3npu_2alarm_2proc_25.7.rc1.txt": (
        "25.7.rc1", [0, 1, 2], 3, ["Ascend950PR"], 1, 2, False, "ascend-950"
    ),
    "310p3_4card_8chip_critical_25.0.rc1.b033.txt": (
        "25.0.rc1.b033", [1, 2, 4, 5], 8, ["310P3"], 2, 0, False, "other"
    ),
    "310p3_2card_4chip_busy_mindie_hugepages_24.1.0.1.txt": (
        "24.1.0.1", [1, 2], 4, ["310P3"], 2, 4, False, "other"
    ),
    "310b4_1npu_alarm_nohbm_23.0.0_trailing_space.txt": (
        "23.0.0", [0], 1, ["310B4"], 1, 0, False, "other"
    ),
    "910a_1npu_warning_23.0.rc3.txt": ("23.0.rc3", [1], 1, ["910A"], 1, 0, False, "other"),
}
# fmt: on


def test_every_info_fixture_is_covered() -> None:
    on_disk = {
        p.name
        for p in FIXTURES.glob("*.txt")
        if "_info_m_" not in p.name and "_info_t_board_" not in p.name
    }
    assert on_disk == set(INFO_FIXTURES)


@pytest.mark.parametrize("name", sorted(INFO_FIXTURES))
def test_info_fixture_overview(name: str) -> None:
    version, npu_ids, chip_count, names, dies, nproc, truncated, family = INFO_FIXTURES[name]
    info = info_of(name)
    summary = summarize(info)
    assert info.npu_smi_version == version
    assert info.driver_version == version  # the banner shows the same value twice in all fixtures
    assert sorted({c.npu_id for c in info.chips}) == npu_ids
    assert summary["npu_count"] == len(npu_ids)
    assert summary["chip_count"] == chip_count
    assert summary["chip_names"] == names
    assert summary["dies_per_npu"] == dies
    assert summary["process_count"] == nproc
    assert summary["truncated"] is truncated
    assert summary["family"] == family
    # The summary must be JSON-serialisable as is.
    assert json.loads(json.dumps(summary)) == summary


# ------------------------------------------------------------------------------------------
# Runbook sample (inline)
# ------------------------------------------------------------------------------------------


def test_runbook_sample_910b4() -> None:
    info = parse_info(RUNBOOK_SAMPLE)
    assert info.npu_smi_version == "25.5.2"
    assert info.truncated is False
    assert info.processes == []
    assert info.chips == [
        Chip(
            npu_id=0,
            chip_id=0,
            name="910B4",
            health="OK",
            power_w=89.9,
            temp_c=39,
            aicore_pct=0,
            memory_used_mb=0,
            memory_total_mb=0,
            hbm_used_mb=2922,
            hbm_total_mb=32768,
            hugepages_used=0,
            hugepages_total=0,
            bus_id="0000:41:00.0",
        )
    ]
    summary = summarize(info)
    assert summary["npu_count"] == 1
    assert summary["health_ok"] is True
    assert summary["unhealthy"] == []
    assert summary["hbm_total_mb_per_chip"] == 32768
    assert summary["family"] == "atlas-a2"
    assert summary["chips"][0]["hbm_used_mb"] == 2922


def test_runbook_sample_tolerates_crlf_indentation_and_prompt() -> None:
    pasted = "$ npu-smi info\r\n" + "".join(
        "    " + line + "  \r\n" for line in RUNBOOK_SAMPLE.splitlines()
    )
    pasted += "$ \r\n"
    info = parse_info(pasted)
    assert [hbm(c) for c in info.chips] == [(2922, 32768)]
    assert info.truncated is False


def test_shell_trace_line_is_not_table() -> None:
    info = parse_info("+ npu-smi info\n" + RUNBOOK_SAMPLE)
    assert info.npu_smi_version == "25.5.2"
    assert len(info.chips) == 1


def test_cut_between_the_two_rows_of_a_chip() -> None:
    text = "\n".join(RUNBOOK_SAMPLE.splitlines()[:7])
    info = parse_info(text)
    assert info.truncated is True
    assert len(info.chips) == 1
    c = info.chips[0]
    assert (c.npu_id, c.chip_id, c.name, c.health, c.power_w) == (0, 0, "910B4", "OK", 89.9)
    assert hbm(c) == (None, None)
    assert c.bus_id is None


def test_blank_value_falls_back_to_header_columns() -> None:
    # Power left blank: the values no longer match the labels one-to-one.
    text = RUNBOOK_SAMPLE.replace("| 89.9        39  ", "|             39  ")
    c = parse_info(text).chips[0]
    assert c.power_w is None
    assert c.temp_c == 39
    assert (c.hugepages_used, c.hugepages_total) == (0, 0)
    assert hbm(c) == (2922, 32768)


# ------------------------------------------------------------------------------------------
# Atlas A2
# ------------------------------------------------------------------------------------------


def test_a2_910b1_idle() -> None:
    info = info_of("a2_910b1_8npu_idle_24.1.rc3.txt")
    c0 = chip(info, 0)
    assert (c0.name, c0.health, c0.bus_id) == ("910B1", "OK", "0000:C1:00.0")
    assert (c0.power_w, c0.temp_c) == (94.6, 49)
    assert hbm(c0) == (3373, 65536)
    assert hbm(chip(info, 1)) == (3367, 65536)
    assert chip(info, 4).power_w == 100.6
    assert hbm(chip(info, 7)) == (3369, 65536)
    assert all(c.health == "OK" and c.phy_id is None for c in info.chips)
    assert summarize(info)["health_ok"] is True


def test_a2_910b3_empty_process_name_and_five_digit_hbm() -> None:
    info = info_of("a2_910b3_8npu_1proc_noname_25.2.0.txt")
    assert hbm(chip(info, 2)) == (41052, 65536)  # written "41052/ 65536"
    assert hbm(chip(info, 0)) == (3408, 65536)  # written "3408 / 65536"
    assert info.processes == [
        NpuProcess(npu_id=2, chip_id=0, pid=1333928, name="", memory_mb=37709)
    ]


def test_a2_910b4_busy_multiple_processes_per_npu() -> None:
    info = info_of("a2_910b4_8npu_busy_multiproc_noname_25.2.3.txt")
    assert hbm(chip(info, 1)) == (29267, 32768)
    assert hbm(chip(info, 4)) == (32061, 32768)
    assert all(p.name == "" for p in info.processes)
    by_npu: dict[int, list[int]] = {}
    for p in info.processes:
        by_npu.setdefault(p.npu_id, []).append(p.pid)
    assert by_npu == {
        0: [29570, 18966],
        1: [9232],
        2: [4320, 4332, 4317],
        3: [64512, 64617, 64602],
        4: [45382],
        5: [45396],
        6: [45478],
        7: [45513],
    }
    assert [p.memory_mb for p in info.processes if p.npu_id == 2] == [401, 3419, 3267]


def test_a2_910b4_container_named_workers_same_pid_on_two_npus() -> None:
    info = info_of("a2_910b4_4npu_container_vllmworker_24.1.rc3.txt")
    assert [c.aicore_pct for c in info.chips] == [67, 67, 67, 68]
    assert [c.bus_id for c in info.chips] == [
        "0000:C1:00.0",
        "0000:01:00.0",
        "0000:C2:00.0",
        "0000:02:00.0",
    ]
    assert hbm(chip(info, 0)) == (30237, 32768)
    assert {p.name for p in info.processes} == {"VLLMWorker_TP"}
    same_pid = [(p.npu_id, p.memory_mb) for p in info.processes if p.pid == 2385579]
    assert same_pid == [(0, 134), (1, 27160)]
    assert [p.pid for p in info.processes if p.npu_id == 0] == [
        2385579,
        2385580,
        2385581,
        2385578,
    ]


def test_a2_910b4_idle_25_0() -> None:
    info = info_of("a2_910b4_8npu_idle_25.0.rc1.1.txt")
    assert [hbm(c) for c in info.chips] == [(2654, 32768)] * 7 + [(2653, 32768)]
    assert chip(info, 3).power_w == 89.1
    assert chip(info, 7).bus_id == "0000:42:00.0"


def test_a2_26_0_truncated_without_closing_border() -> None:
    info = info_of("a2_910b4_1npu_idle_26.0.rc1_container_pid_col.txt")
    assert info.truncated is True
    c0 = chip(info, 0)
    assert (c0.name, c0.health, c0.power_w, c0.temp_c) == ("910B4", "OK", 82.6, 32)
    assert hbm(c0) == (2871, 32768)
    assert info.processes == []


def test_a2_26_1_container_pid_column() -> None:
    info = info_of("a2_910b3_8npu_1proc_26.1.0_container_pid_col.txt")
    assert info.truncated is False
    c0 = chip(info, 0)
    assert (c0.power_w, c0.temp_c, c0.bus_id) == (100.0, 50, "0000:C1:00.0")
    assert hbm(c0) == (8676, 65536)
    assert hbm(chip(info, 3)) == (3407, 65536)
    assert info.processes == [
        NpuProcess(
            npu_id=0, chip_id=0, pid=485946, name="pytest", memory_mb=5175, container_pid=None
        )
    ]


def test_a2_26_0_derived_busy_one_device() -> None:
    """DERIVED (SOURCES.md): the runbook's one-card host with the endpoint serving on it."""
    info = info_of("a2_910b4_1npu_busy_26.0.rc1_container_pid_col_DERIVED.txt")
    assert hbm(chip(info, 0)) == (30092, 32768)
    assert info.processes == [
        NpuProcess(
            npu_id=0, chip_id=0, pid=73514, name="VLLM::EngineCore", memory_mb=27170,
            container_pid=None,
        )
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "listed"),
    [
        # A2: the process row's NPU and chip name the die.
        ("a2_910b3_8npu_1proc_26.1.0_container_pid_col.txt", [5175] + [0] * 7),
        # One pid under two NPUs: each row counts where it is listed.
        ("a2_910b4_4npu_container_vllmworker_24.1.rc3.txt", [27572, 27160, 27160, 27160]),
        # A3: the process is on NPU 1's second die (chip 1), device 3.
        ("a3_ascend910_2npu_4die_1proc_25.2.0.txt", [0, 0, 0, 7746]),
        # 950: the table keys on the NPU only, which is one die.
        ("950pr_3npu_2alarm_2proc_25.7.rc1.txt", [9452, 0, 0]),
        ("a2_910b4_1npu_idle_26.0.rc1_container_pid_col.txt", [0]),
    ],
)
def test_summary_counts_the_processes_memory_per_device(name: str, listed: list[int]) -> None:
    chips = summarize(info_of(name))["chips"]
    assert [c["process_memory_mb"] for c in chips] == listed


def test_a2_910b2c_trailing_space_and_dash_closed_process_block() -> None:
    info = info_of("a2_910b2c_2npu_1proc_23.0.2.1_trailing_space.txt")
    assert [hbm(c) for c in info.chips] == [(20701, 65536), (20687, 65536)]
    assert info.truncated is False
    assert info.processes == [
        NpuProcess(npu_id=0, chip_id=0, pid=124528, name="python3.8", memory_mb=17400)
    ]


# ------------------------------------------------------------------------------------------
# Atlas A3
# ------------------------------------------------------------------------------------------


def test_a3_16_dies() -> None:
    info = info_of("a3_ascend910_8npu_16die_idle_24.1.rc3.5.txt")
    assert [(c.npu_id, c.chip_id) for c in info.chips] == [
        (npu, die) for npu in range(8) for die in (0, 1)
    ]
    assert [c.phy_id for c in info.chips] == list(range(16))
    first, second = chip(info, 0, 0), chip(info, 0, 1)
    assert (first.power_w, first.temp_c) == (180.2, 38)
    assert (second.power_w, second.temp_c) == (None, 37)  # Power "-" on the second die
    assert all(c.power_w is None for c in info.chips if c.chip_id == 1)
    last = chip(info, 7, 1)
    assert (last.phy_id, last.bus_id) == (15, "0000:83:00.0")
    assert hbm(last) == (3187, 65536)
    summary = summarize(info)
    assert summary["family"] == "atlas-a3"
    assert summary["health_ok"] is True


def test_a3_4_dies_process_on_second_die() -> None:
    info = info_of("a3_ascend910_2npu_4die_1proc_25.2.0.txt")
    assert [c.bus_id for c in info.chips] == [
        "0000:9C:00.0",
        "0000:9E:00.0",
        "0000:37:00.0",
        "0000:39:00.0",
    ]
    c = chip(info, 1, 1)
    assert (c.phy_id, c.power_w) == (3, None)
    assert hbm(c) == (10568, 65536)  # written "10568/ 65536"
    assert info.processes == [
        NpuProcess(npu_id=1, chip_id=1, pid=990711, name="python", memory_mb=7746)
    ]


# ------------------------------------------------------------------------------------------
# Ascend 950
# ------------------------------------------------------------------------------------------


def test_950pr_layout_alarms_and_processes() -> None:
    info = info_of("950pr_3npu_2alarm_2proc_25.7.rc1.txt")
    assert [(c.npu_id, c.chip_id, c.name, c.health) for c in info.chips] == [
        (0, 0, "Ascend950PR", "Alarm"),
        (1, 0, "Ascend950PR", "Alarm"),
        (2, 0, "Ascend950PR", "OK"),
    ]
    assert [c.aicore_pct for c in info.chips] == [100, 100, 0]  # "NPU Util(%)"
    assert [hbm(c) for c in info.chips] == [(90633, 114688), (30492, 114688), (5413, 131072)]
    c0 = chip(info, 0)
    assert (c0.power_w, c0.temp_c, c0.bus_id) == (205.7, 71, "0000:71:00.0")
    assert info.processes == [
        NpuProcess(npu_id=0, chip_id=None, pid=1530715, name="python", memory_mb=4724),
        NpuProcess(npu_id=0, chip_id=None, pid=1655234, name="python", memory_mb=4728),
    ]
    summary = summarize(info)
    assert summary["health_ok"] is False
    assert summary["unhealthy"] == [
        {"npu_id": 0, "chip_id": 0, "health": "Alarm"},
        {"npu_id": 1, "chip_id": 0, "health": "Alarm"},
    ]
    assert summary["hbm_total_mb_per_chip"] == 131072
    assert summary["family"] == "ascend-950"
    # The table's name says which 950 part it is (the -a5 image is built for 950DT).
    assert summary["variant"] == "950PR"


# ------------------------------------------------------------------------------------------
# 310P / 310B / 910A (no HBM column, non-OK health)
# ------------------------------------------------------------------------------------------


def test_310p3_critical_noncontiguous_ids_no_hbm() -> None:
    info = info_of("310p3_4card_8chip_critical_25.0.rc1.b033.txt")
    assert [(c.npu_id, c.chip_id, c.device_id) for c in info.chips] == [
        (1, 0, 0),
        (1, 1, 1),
        (2, 0, 2),
        (2, 1, 3),
        (4, 0, 4),
        (4, 1, 5),
        (5, 0, 6),
        (5, 1, 7),
    ]
    c = chip(info, 1, 0)
    assert (c.memory_used_mb, c.memory_total_mb) == (1607, 47304)
    assert hbm(c) == (None, None)
    assert c.power_w is None  # "NA"
    assert (c.hugepages_used, c.hugepages_total) == (0, 0)
    assert chip(info, 4, 0).health == "Critical"
    summary = summarize(info)
    assert summary["health_ok"] is False
    assert summary["unhealthy"] == [{"npu_id": 4, "chip_id": 0, "health": "Critical"}]
    assert summary["hbm_total_mb_per_chip"] is None
    assert summary["chips"][0]["memory_total_mb"] == 47304


def test_310p3_busy_hugepages_and_mindie_processes() -> None:
    info = info_of("310p3_2card_4chip_busy_mindie_hugepages_24.1.0.1.txt")
    c = chip(info, 1, 0)
    assert (c.hugepages_used, c.hugepages_total) == (7210, 7210)
    assert (c.memory_used_mb, c.memory_total_mb) == (16302, 44280)  # "16302/ 44280"
    assert (chip(info, 2, 0).hugepages_used, chip(info, 2, 1).hugepages_used) == (17057, 16823)
    assert [(p.npu_id, p.chip_id, p.pid, p.memory_mb) for p in info.processes] == [
        (1, 0, 3277562, 14513),
        (1, 1, 3277565, 14513),
        (2, 0, 3034986, 34207),
        (2, 1, 3034989, 33740),
    ]
    assert {p.name for p in info.processes} == {"mindie_llm_back"}
    assert summarize(info)["health_ok"] is True


def test_310b4_alarm_no_process_table() -> None:
    info = info_of("310b4_1npu_alarm_nohbm_23.0.0_trailing_space.txt")
    c = chip(info, 0)
    assert (c.name, c.health, c.bus_id) == ("310B4", "Alarm", None)  # Bus-Id "NA"
    assert (c.power_w, c.temp_c) == (0.0, 65)
    assert (c.hugepages_used, c.hugepages_total) == (15, 15)
    assert (c.memory_used_mb, c.memory_total_mb) == (3628, 15609)
    assert hbm(c) == (None, None)
    assert info.processes == []
    assert info.truncated is False
    assert summarize(info)["unhealthy"] == [{"npu_id": 0, "chip_id": 0, "health": "Alarm"}]


def test_910a_warning_ddr_and_hbm() -> None:
    info = info_of("910a_1npu_warning_23.0.rc3.txt")
    c = chip(info, 1)
    assert (c.name, c.health) == ("910A", "Warning")
    assert (c.memory_used_mb, c.memory_total_mb) == (2681, 15137)
    assert hbm(c) == (1, 32768)
    summary = summarize(info)
    assert summary["unhealthy"] == [{"npu_id": 1, "chip_id": 0, "health": "Warning"}]
    assert summary["family"] == "other"


# ------------------------------------------------------------------------------------------
# Parse errors
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "empty input"),
        ("   \n\n", "empty input"),
        ("bash: npu-smi: command not found\n", "line 1"),
        (
            "dcmi module initialize failed. ret is -8005\n",
            "dcmi module initialize failed",
        ),
        ("+------+\n| hello |\n+------+\n", "line 2"),
        ("+------+\n+------+\n", "chip header"),
    ],
)
def test_parse_info_rejects_non_tables(text: str, fragment: str) -> None:
    with pytest.raises(NpuSmiParseError, match=r"expected|empty") as excinfo:
        parse_info(text)
    assert fragment in str(excinfo.value)
    assert isinstance(excinfo.value, ValueError)


@pytest.mark.parametrize(
    "name",
    [
        "a2_910b4_8npu_info_m_25.0.rc1.1.txt",
        "a2_910b4_info_t_board_i0_c0_ABRIDGED.txt",
        "950pr_info_t_board_i0_25.7.rc1.6_annotated.txt",
    ],
)
def test_parse_info_rejects_other_npu_smi_outputs(name: str) -> None:
    with pytest.raises(NpuSmiParseError, match="line 1: expected an `npu-smi info` table"):
        parse_info(read_fixture(name))


def test_parse_info_names_the_bad_line() -> None:
    bad = RUNBOOK_SAMPLE.replace("| 0     910B4 ", "| x     910B4 ")
    with pytest.raises(NpuSmiParseError, match=r"line 7: expected an integer NPU id, got 'x'"):
        parse_info(bad)


def test_parse_info_rejects_a_chip_row_without_its_second_row() -> None:
    lines = RUNBOOK_SAMPLE.splitlines()
    del lines[7]  # the "| 0 | 0000:41:00.0 | ..." row
    with pytest.raises(NpuSmiParseError, match="line 8: expected the second row"):
        parse_info("\n".join(lines))


def test_parse_info_rejects_process_table_only() -> None:
    text = "\n".join(RUNBOOK_SAMPLE.splitlines()[8:])
    with pytest.raises(NpuSmiParseError, match="chip header row"):
        parse_info(text)


# ------------------------------------------------------------------------------------------
# npu-smi info -t board
# ------------------------------------------------------------------------------------------


def test_board_950pr_annotated() -> None:
    board = parse_board(read_fixture("950pr_info_t_board_i0_25.7.rc1.6_annotated.txt"))
    assert len(board) == 16
    assert board["NPU ID"] == "0"
    assert board["NPU Name"] == "9579"
    assert board["Chip Name"] == "Ascend950PR"
    assert board["Software Version"] == "25.7.rc1.6"
    assert board["Main Board ID"] == "0x68(1P)"  # the author's "# ..." comment is dropped
    assert board["PCIe Bus Info"] == "0000:61:00.0"  # colons inside the value survive
    assert board["Chip Count"] == "1"
    assert soc_version_from_board(board) == "Ascend950PR_9579"
    assert soc_family(soc_version_from_board(board), board["Chip Name"], 1) == "ascend-950"


def test_board_a2_abridged() -> None:
    board = parse_board(read_fixture("a2_910b4_info_t_board_i0_c0_ABRIDGED.txt"))
    assert board == {"NPU ID": "0", "Chip ID": "0", "Chip Type": "Ascend", "Chip Name": "910B4"}
    assert soc_version_from_board(board) == "Ascend910B4"
    assert soc_family(soc_version_from_board(board), None, 1) == "atlas-a2"


def test_board_a3_abridged() -> None:
    board = parse_board(read_fixture("a3_ascend910_9392_info_t_board_i0_c0_ABRIDGED.txt"))
    assert board == {"NPU ID": "0", "NPU Name": "9392", "Chip ID": "0", "Chip Name": "Ascend910"}
    assert soc_version_from_board(board) == "Ascend910_9392"
    # The SoC version decides even where the die count alone would not.
    assert soc_family(soc_version_from_board(board), board["Chip Name"], 1) == "atlas-a3"


def test_board_tab_indentation_and_empty_value() -> None:
    board = parse_board(
        "\tNPU ID        : 3\n\tSerial Number :\n\tChip Name     : 910B4\n\tTag  : #1  # note\n"
    )
    assert board == {"NPU ID": "3", "Serial Number": "", "Chip Name": "910B4", "Tag": "#1"}


@pytest.mark.parametrize(
    "text",
    ["", "bash: npu-smi: command not found", "Error: the device does not exist.\n"],
)
def test_board_rejects_non_board_text(text: str) -> None:
    with pytest.raises(NpuSmiParseError):
        parse_board(text)


# ------------------------------------------------------------------------------------------
# npu-smi info -m
# ------------------------------------------------------------------------------------------


def test_info_m_a2_same_host_as_info() -> None:
    rows = parse_info_m(read_fixture("a2_910b4_8npu_info_m_25.0.rc1.1.txt"))
    assert len(rows) == 16
    assert rows[0] == {"npu_id": 0, "chip_id": 0, "logic_id": 0, "chip_name": "Ascend 910B4"}
    assert rows[1] == {"npu_id": 0, "chip_id": 1, "logic_id": None, "chip_name": "Mcu"}
    npus = [r for r in rows if r["chip_name"] != "Mcu"]
    assert [(r["npu_id"], r["logic_id"]) for r in npus] == [(i, i) for i in range(8)]
    # The same host's `npu-smi info` lists the same NPU ids.
    info = info_of("a2_910b4_8npu_idle_25.0.rc1.1.txt")
    assert [c.npu_id for c in info.chips] == [r["npu_id"] for r in npus]
    assert soc_family(None, npus[0]["chip_name"], 1) == "atlas-a2"


def test_info_m_tab_indent() -> None:
    text = "\tNPU ID    Chip ID    Chip Logic ID    Chip Phy-ID    Chip Name\n"
    text += "\t0         0          0                0              Ascend910\n"
    text += "\t0         1          1                1              Ascend910\n"
    rows = parse_info_m(text)
    assert rows[1] == {
        "npu_id": 0,
        "chip_id": 1,
        "logic_id": 1,
        "phy_id": 1,
        "chip_name": "Ascend910",
    }


@pytest.mark.parametrize("text", ["", RUNBOOK_SAMPLE, "npu-smi: command not found"])
def test_info_m_rejects_other_text(text: str) -> None:
    with pytest.raises(NpuSmiParseError):
        parse_info_m(text)


# ------------------------------------------------------------------------------------------
# soc_family
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("soc", "name", "dies", "expected"),
    [
        (220, None, 1, "atlas-a2"),
        (224, "Ascend910", 2, "atlas-a2"),  # the SoC number wins over the name
        (225, None, 1, "atlas-a2"),
        (250, None, 1, "atlas-a3"),
        (255, None, 1, "atlas-a3"),
        (260, None, 1, "ascend-950"),
        (202, "310P3", 2, "other"),
        (226, None, 1, "other"),
        ("223", None, 1, "atlas-a2"),
        ("Ascend910B4", None, 1, "atlas-a2"),
        ("Ascend910B2C", None, 1, "atlas-a2"),
        ("Ascend910_9392", "Ascend910", 1, "atlas-a3"),
        ("Ascend910_9362", None, 2, "atlas-a3"),
        ("Ascend950PR_9579", None, 1, "ascend-950"),
        ("Ascend310P3", "310P3", 2, "other"),
        ("not-a-soc", "910B3", 1, "atlas-a2"),  # unreadable SoC: fall back to the name
        (None, "910B4", 1, "atlas-a2"),
        (None, "Ascend 910B4", 1, "atlas-a2"),
        (None, "Ascend910", 2, "atlas-a3"),
        (None, "Ascend910", 1, "other"),
        (None, "Ascend950PR", 1, "ascend-950"),
        (None, "910A", 1, "other"),
        (None, "310P3", 2, "other"),
        (None, None, 0, "other"),
        (None, "", 1, "other"),
    ],
)
def test_soc_family(soc: str | int | None, name: str | None, dies: int, expected: str) -> None:
    assert soc_family(soc, name, dies) == expected


@pytest.mark.parametrize(
    ("soc", "names", "expected"),
    [
        ("Ascend950PR_9579", [], "950PR"),
        ("Ascend950DT_9582", ["Ascend950PR"], "950DT"),  # the board's SoC wins over the table
        ("ascend950dt_9582", [], "950DT"),  # vllm-ascend's SOC_VERSION spelling
        ("Ascend 950PR", [], "950PR"),
        (260, ["Ascend950DT"], "950DT"),  # torch_npu's number does not say: the names do
        ("260", ["Ascend950PR", "Ascend950PR"], "950PR"),
        (None, ["Ascend950PR", "Ascend950DT"], None),  # a mixed table says nothing
        (None, ["Ascend950PR", "Ascend950"], None),
        (None, ["Ascend950"], None),
        ("Ascend950", [], None),
        (None, [], None),
        ("Ascend910_9392", ["Ascend910"], None),
        (None, ["910B4"], None),
    ],
)
def test_soc_variant(soc: str | int | None, names: list[str], expected: str | None) -> None:
    assert soc_variant(soc, names) == expected


def test_summarize_variant_only_for_950() -> None:
    a3 = info_of("a3_ascend910_2npu_4die_1proc_25.2.0.txt")
    assert summarize(a3)["variant"] is None
    assert summarize(a3, soc_version="Ascend950DT_9582")["variant"] == "950DT"
    pr = info_of("950pr_3npu_2alarm_2proc_25.7.rc1.txt")
    assert summarize(pr, soc_version=260)["variant"] == "950PR"
    board = parse_board(read_fixture("950pr_info_t_board_i0_25.7.rc1.6_annotated.txt"))
    assert (
        summarize(pr, board={**board, "Chip Name": "Ascend950DT", "NPU Name": "9582"})["variant"]
        == "950DT"
    )


def test_summarize_with_board_uses_soc_version() -> None:
    info = info_of("a3_ascend910_2npu_4die_1proc_25.2.0.txt")
    board = parse_board(read_fixture("a3_ascend910_9392_info_t_board_i0_c0_ABRIDGED.txt"))
    summary = summarize(info, board=board)
    assert summary["soc_version"] == "Ascend910_9392"
    assert summary["family"] == "atlas-a3"
    assert summary["board"]["NPU Name"] == "9392"
    assert summarize(info, soc_version=224)["family"] == "atlas-a2"


def test_summarize_empty_info_is_not_healthy() -> None:
    summary = summarize(NpuSmiInfo())
    assert summary["health_ok"] is False
    assert summary["npu_count"] == 0
    assert summary["hbm_total_mb_per_chip"] is None
    assert summary["family"] == "other"


# ------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------


def run_cli(*args: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(HELPERS)
    if path is not None:
        env["PATH"] = path
    return subprocess.run(
        [sys.executable, "-m", "specfleet_helpers.host.npu_smi", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(REPO_ROOT),
        timeout=60,
        check=False,
    )


def make_fake_npu_smi(directory: Path, script: str) -> Path:
    fake = directory / "npu-smi"
    fake.write_text("#!/bin/sh\n" + script, encoding="utf-8")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return fake


def test_cli_input_fixture() -> None:
    result = run_cli("--input", str(FIXTURES / "a3_ascend910_8npu_16die_idle_24.1.rc3.5.txt"))
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["npu_count"] == 8
    assert summary["chip_count"] == 16
    assert summary["dies_per_npu"] == 2
    assert summary["family"] == "atlas-a3"
    assert summary["health_ok"] is True
    assert summary["chips"][1]["hbm_used_mb"] == 3188
    assert result.stderr == ""


def test_cli_unhealthy_still_exits_zero() -> None:
    result = run_cli("--input", str(FIXTURES / "310p3_4card_8chip_critical_25.0.rc1.b033.txt"))
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["health_ok"] is False
    assert summary["unhealthy"] == [{"npu_id": 4, "chip_id": 0, "health": "Critical"}]


def test_cli_board_input() -> None:
    result = run_cli(
        "--input",
        str(FIXTURES / "950pr_3npu_2alarm_2proc_25.7.rc1.txt"),
        "--board-input",
        str(FIXTURES / "950pr_info_t_board_i0_25.7.rc1.6_annotated.txt"),
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["soc_version"] == "Ascend950PR_9579"
    assert summary["family"] == "ascend-950"
    assert summary["variant"] == "950PR"
    assert summary["board"]["Main Board ID"] == "0x68(1P)"
    assert summary["processes"][0] == {
        "npu_id": 0,
        "chip_id": None,
        "pid": 1530715,
        "name": "python",
        "memory_mb": 4724,
        "container_pid": None,
    }


def test_cli_missing_npu_smi_exits_2(tmp_path: Path) -> None:
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    result = run_cli(path=str(empty_bin))
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "npu-smi info" in lines[0]
    assert "not found" in lines[0]


def test_cli_failing_npu_smi_exits_2(tmp_path: Path) -> None:
    make_fake_npu_smi(tmp_path, "echo 'dcmi module initialize failed. ret is -8005' >&2\nexit 3\n")
    result = run_cli(path=str(tmp_path))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "npu-smi info" in lines[0]
    assert "exit status 3" in lines[0]
    assert "dcmi module initialize failed" in lines[0]


def test_cli_runs_npu_smi_from_path(tmp_path: Path) -> None:
    fixture = FIXTURES / "a2_910b3_8npu_1proc_noname_25.2.0.txt"
    make_fake_npu_smi(tmp_path, f'[ "$1" = info ] || exit 9\ncat "{fixture}"\n')
    # The fake comes first on PATH; the rest of PATH is kept so that `cat` is found.
    result = run_cli(path=os.pathsep.join([str(tmp_path), os.environ.get("PATH", "")]))
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["npu_count"] == 8
    assert summary["processes"][0]["pid"] == 1333928


def test_cli_garbage_input_exits_1(tmp_path: Path) -> None:
    garbage = tmp_path / "out.txt"
    garbage.write_text("bash: npu-smi: command not found\n", encoding="utf-8")
    result = run_cli("--input", str(garbage))
    assert result.returncode == 1
    assert "line 1" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_cli_unreadable_input_exits_2(tmp_path: Path) -> None:
    result = run_cli("--input", str(tmp_path / "missing.txt"))
    assert result.returncode == 2
    assert "missing.txt" in result.stderr


def test_cli_help() -> None:
    result = run_cli("--help")
    assert result.returncode == 0
    for option in (
        "--input",
        "--board-input",
        "--board",
        "--soc-version",
        "--npu-smi",
        "--timeout",
    ):
        assert option in result.stdout


# -- device ids and the board query (issue 9) -------------------------------------------------


def test_logic_ids_are_the_table_order_as_info_m_numbers_them() -> None:
    """The id specfleet_npu_devices names: a2 `npu-smi info` and `-m` of the same host agree."""
    summary = summarize(info_of("a2_910b4_8npu_idle_25.0.rc1.1.txt"))
    rows = parse_info_m(read_fixture("a2_910b4_8npu_info_m_25.0.rc1.1.txt"))
    logic = {(r["npu_id"], r["chip_id"]): r["logic_id"] for r in rows if r["logic_id"] is not None}
    assert [c["logic_id"] for c in summary["chips"]] == list(range(8))
    assert {(c["npu_id"], c["chip_id"]): c["logic_id"] for c in summary["chips"]} == logic


def test_logic_ids_count_a3_dies() -> None:
    summary = summarize(info_of("a3_ascend910_8npu_16die_idle_24.1.rc3.5.txt"))
    chips = summary["chips"]
    assert [c["logic_id"] for c in chips] == list(range(16))
    assert (chips[3]["npu_id"], chips[3]["chip_id"]) == (1, 1)


def test_cli_board_queries_the_first_chip(tmp_path: Path) -> None:
    info = FIXTURES / "a3_ascend910_8npu_16die_idle_24.1.rc3.5.txt"
    board = FIXTURES / "a3_ascend910_9392_info_t_board_i0_c0_ABRIDGED.txt"
    log = tmp_path / "calls"
    make_fake_npu_smi(
        tmp_path,
        f'echo "$*" >> "{log}"\n'
        f'[ "$*" = info ] && exec cat "{info}"\n'
        f'[ "$*" = "info -t board -i 0 -c 0" ] && exec cat "{board}"\n'
        "exit 9\n",
    )
    result = run_cli("--board", path=os.pathsep.join([str(tmp_path), os.environ["PATH"]]))
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["soc_version"] == "Ascend910_9392"
    assert summary["family"] == "atlas-a3"
    assert summary["board_error"] is None
    assert log.read_text().splitlines() == ["info", "info -t board -i 0 -c 0"]


def test_cli_board_failure_is_reported_not_fatal(tmp_path: Path) -> None:
    """A board query npu-smi refuses (both forms) leaves the chip name to decide."""
    info = FIXTURES / "a2_910b4_1npu_idle_26.0.rc1_container_pid_col.txt"
    make_fake_npu_smi(
        tmp_path, f'[ "$*" = info ] && exec cat "{info}"\necho "board: not here" >&2\nexit 4\n'
    )
    result = run_cli("--board", path=os.pathsep.join([str(tmp_path), os.environ["PATH"]]))
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["family"] == "atlas-a2"
    assert summary["board"] is None
    assert summary["soc_version"] is None
    error = summary["board_error"]
    assert "info -t board -i 0 -c 0" in error and "info -t board -i 0'" in error
    assert "board: not here" in error


def test_cli_without_board_does_not_query_it(tmp_path: Path) -> None:
    info = FIXTURES / "a2_910b4_1npu_idle_26.0.rc1_container_pid_col.txt"
    make_fake_npu_smi(tmp_path, f'[ "$*" = info ] && exec cat "{info}"\nexit 9\n')
    result = run_cli(path=os.pathsep.join([str(tmp_path), os.environ["PATH"]]))
    assert result.returncode == 0, result.stderr
    assert "board_error" not in json.loads(result.stdout)
