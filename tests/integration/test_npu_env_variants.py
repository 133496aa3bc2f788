"""npu_env on hosts that differ from the image's own build, for real through Ansible with only
the NPU hardware mocked (tests/integration/conftest.py's MockNpuHost):

- CANN installed in more than one version: the AscendNPU IR script's entry is a pattern
  (cann-*/), and the one inside the toolkit in use is checked, recorded and sourced; with no
  toolkit to choose by, preflight names the pattern and its matches;
- an Ascend 950PR host: used (vllm-ascend's checks pass on it), with a warning and a recorded
  line saying its -a5 image is built for 950DT.

The wrapper's own shell (patterns, jemalloc) is covered faster in
tests/unit/test_specfleet_env.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import MockNpuHost

pytestmark = pytest.mark.integration

A2_IDLE = "a2_910b4_8npu_idle_25.0.rc1.1.txt"
A950_PR = "950pr_3npu_2alarm_2proc_25.7.rc1.txt"
A950_PR_BOARD = "950pr_info_t_board_i0_25.7.rc1.6_annotated.txt"
# torch_npu's one SoC number for the whole 950 family.
SOC_950 = 260
WARNING = (
    "Ascend 950PR: the -a5 image is built for 950DT (SOC_VERSION ascend950dt_9582); vllm-ascend"
    " documents 950DT only, 950PR is untested upstream (vllm-ascend #9354)"
)


def second_cann(npu_host: MockNpuHost) -> Path:
    """CANN 8.5.0's IR script beside the mock's 9.1.0 one, marking itself if sourced."""
    other = Path(str(npu_host.ir_env).replace("/cann-9.1.0/", "/cann-8.5.0/"))
    other.parent.mkdir(parents=True)
    other.write_text("export MOCK_ASCENDNPU_IR_SOURCED=cann-8.5.0\n")
    return other


def test_two_canns_the_toolkits_ir_is_checked_recorded_and_sourced(
    npu_host: MockNpuHost,
) -> None:
    second_cann(npu_host)
    # CANN's layout: ascend-toolkit/latest -> the installed cann-<version>; the mock toolkit's
    # set_env.sh exports ASCEND_TOOLKIT_HOME=<that link>.
    npu_host.toolkit_home.symlink_to("../cann-9.1.0")
    result = npu_host.run(A2_IDLE, group="atlas-a2")
    assert not result.failed, result.failure_messages() or result.stdout[-4000:]
    state = json.loads(npu_host.state_file.read_text())
    assert "/cann-*/" in state["cann_env_files"][1]
    assert state["cann_env_resolved"] == [
        str(npu_host.toolkit_env),
        str(npu_host.ir_env),
        str(npu_host.atb_env),
    ]
    assert state["warnings"] == []
    env = npu_host.wrapper_env()
    assert env["MOCK_ASCENDNPU_IR_SOURCED"] == "1"  # 9.1.0's, not 8.5.0's


def test_two_canns_and_no_toolkit_to_choose_by_stop_the_host(npu_host: MockNpuHost) -> None:
    other = second_cann(npu_host)
    result = npu_host.run(A2_IDLE, group="atlas-a2")
    assert result.failed, f"expected the play to fail; stats {result.stats}"
    message = result.failure_message
    pattern = npu_host.cann_env_files[1]
    for fragment in (
        "preflight cann:",
        f"{pattern}: 2 matches",
        str(other),
        str(npu_host.ir_env),
        "none inside the toolkit in use",
        "specfleet_cann_env_files",
    ):
        assert fragment in message, (fragment, message)
    assert not npu_host.state_file.exists()


def test_a_pattern_without_a_match_stops_the_host(npu_host: MockNpuHost) -> None:
    npu_host.ir_env.unlink()
    result = npu_host.run(A2_IDLE, group="atlas-a2")
    assert result.failed, f"expected the play to fail; stats {result.stats}"
    assert f"preflight cann: {npu_host.cann_env_files[1]}: no such file;" in result.failure_message


def test_a_950pr_host_is_used_and_warned_of(npu_host: MockNpuHost) -> None:
    # Its third NPU is the healthy one (the fixture's first two are in Alarm).
    result = npu_host.run(
        A950_PR,
        group="ascend-950",
        npu_count=3,
        soc_version=SOC_950,
        board_fixture=A950_PR_BOARD,
        overrides={"specfleet_npu_devices": [2]},
    )
    assert not result.failed, result.failure_messages() or result.stdout[-4000:]
    # Ansible's own warning, shown at the default verbosity (the console hides ok results).
    assert f"[WARNING]: localhost: {WARNING}" in " ".join(result.stdout.split()), result.stdout
    state = json.loads(npu_host.state_file.read_text())
    assert state["npu"]["variant"] == "950PR"
    assert state["npu"]["family"] == "ascend-950"
    assert state["warnings"] == [WARNING]
