"""The npu_env role's NPU path, for real through Ansible, with only the NPU hardware mocked.

Each test plays playbooks/provision.yml --tags npu_env against localhost in one of the
fleet's groups (so the repo's group_vars apply), with the mock npu-smi printing a recorded
`npu-smi info`, the mock torch/torch_npu seeing MOCK_NPU_COUNT NPUs and mock CANN/ATB
set_env.sh files. The failure cases check the message a user sees when the preflight stops.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml
from specfleet_helpers.host import hccl_ports

if TYPE_CHECKING:
    from conftest import MockNpuHost

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
MOCK_NPU_DIR = HERE / "mock_npu"
MOCK_NPU_SMI = MOCK_NPU_DIR / "npu-smi"
NPU_SMI_FIXTURES = HERE.parent / "fixtures" / "npu-smi"
SPECULATORS = "speculators_install"
SHIP_HELPERS = "Ship python_helpers to the host"
HCCL_TASK = "Reserve HCCL's host ports where the kernel could hand them out"
# Idempotence reruns allowed while others edit python_helpers/ concurrently.
MAX_RERUNS = 3

A2_IDLE = "a2_910b4_8npu_idle_25.0.rc1.1.txt"
A2_BOARD = "a2_910b4_info_t_board_i0_c0_ABRIDGED.txt"
# The runbook's own host: one 910B4 (32 GB), npu-smi 26.x.
A2_ONE_CARD = "a2_910b4_1npu_idle_26.0.rc1_container_pid_col.txt"
# The same host with the DFlash endpoint (serve_mode service) serving on its only device: DERIVED
# from the idle capture by adding the endpoint's process row (tests/fixtures/npu-smi/SOURCES.md).
A2_ONE_CARD_SERVING = "a2_910b4_1npu_busy_26.0.rc1_container_pid_col_DERIVED.txt"
A2_FOUR_CARDS = "a2_910b4_4npu_container_vllmworker_24.1.rc3.txt"
A950_ALARM = "950pr_3npu_2alarm_2proc_25.7.rc1.txt"
A3_PARTIAL = "a3_ascend910_2npu_4die_1proc_25.2.0.txt"
A3_FULL = "a3_ascend910_8npu_16die_idle_24.1.rc3.5.txt"
A3_BOARD = "a3_ascend910_9392_info_t_board_i0_c0_ABRIDGED.txt"
# torch_npu's SoC numbers (what vllm-ascend asserts on): 910B4, A3 9392 die.
SOC_910B4 = 224
SOC_A3_9392 = 251
IMAGE = "quay.io/ascend/vllm-ascend:v0.23.0"
PATHS = yaml.safe_load(
    (HERE.parents[1] / "roles" / "specfleet" / "defaults" / "main.yml").read_text()
)


def helpers_digest(npu_host: MockNpuHost) -> str:
    """sha256 of the helpers zip shipped to the host's work root."""
    zip_path = npu_host.root / "lib" / "specfleet_helpers.zip"
    return hashlib.sha256(zip_path.read_bytes()).hexdigest()


def changed_tasks(result) -> list[tuple[str, dict]]:
    return [
        (e["event_data"].get("task"), e["event_data"].get("res"))
        for e in result.events
        if e.get("event") == "runner_on_ok" and e["event_data"].get("res", {}).get("changed")
    ]


def assert_stopped(npu_host: MockNpuHost, result, *fragments: str) -> str:
    """The play failed for localhost with a message holding every fragment; nothing recorded."""
    assert result.failed, f"expected the play to fail; stats {result.stats}"
    message = result.failure_message
    print(f"\nfailure message: {message}")
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert not npu_host.state_file.exists(), "a failed preflight must not write the state file"
    return message


# -- the mock kit itself ---------------------------------------------------------------------


def test_mock_kit_behaves_like_the_hardware(npu_host: MockNpuHost) -> None:
    fixture = NPU_SMI_FIXTURES / A2_IDLE
    env = {**os.environ, "MOCK_NPU_SMI_FIXTURE": str(fixture)}
    info = subprocess.run([str(MOCK_NPU_SMI), "info"], env=env, capture_output=True, text=True)
    assert info.returncode == 0
    assert info.stdout == fixture.read_text()
    other = subprocess.run(
        [str(MOCK_NPU_SMI), "info", "-t", "board", "-i", "0"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert other.returncode == 127
    assert "command not found" in other.stderr
    board = NPU_SMI_FIXTURES / A2_BOARD
    with_board = {**env, "MOCK_NPU_SMI_BOARD_FIXTURE": str(board)}
    answered = subprocess.run(
        [str(MOCK_NPU_SMI), *("info", "-t", "board", "-i", "0", "-c", "0")],
        env=with_board,
        capture_output=True,
        text=True,
    )
    assert answered.returncode == 0 and answered.stdout == board.read_text()
    # The ATB file fails under `set -u` unless ZSH_VERSION is defined, as the real one does.
    strict = subprocess.run(
        ["bash", "-uc", f". {npu_host.atb_env}"], capture_output=True, text=True, env={}
    )
    assert strict.returncode != 0
    assert "ZSH_VERSION" in strict.stderr
    # torch.npu follows MOCK_NPU_COUNT narrowed by ASCEND_RT_VISIBLE_DEVICES; torch_npu needs
    # the CANN env, like the real one, and reports MOCK_NPU_SOC_VERSION.
    probe = (
        "import torch, torch_npu; print(torch.npu.is_available(), torch.npu.device_count(),"
        " torch_npu.npu.get_soc_version())"
    )
    for extra, expected in (
        ({"MOCK_NPU_COUNT": "8"}, "True 8 224"),
        ({"MOCK_NPU_COUNT": "8", "ASCEND_RT_VISIBLE_DEVICES": "0"}, "True 1 224"),
        ({"MOCK_NPU_COUNT": "4", "ASCEND_RT_VISIBLE_DEVICES": "2,3,9"}, "True 2 224"),
        ({"MOCK_NPU_COUNT": "0"}, "False 0 224"),
    ):
        out = subprocess.run(
            [
                *("bash", "-c", '. "$1"; exec "$2" -c "$3"', "-"),
                *(str(npu_host.toolkit_env), str(npu_host.npu_python), probe),
            ],
            env={"PATH": os.environ["PATH"], "MOCK_NPU_SOC_VERSION": "224", **extra},
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.strip() == expected, extra
    no_cann = subprocess.run(
        [str(npu_host.npu_python), "-c", "import torch_npu"],
        env={"PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
    )
    assert no_cann.returncode != 0
    assert "set_env.sh was not sourced" in no_cann.stderr
    assert (MOCK_NPU_DIR / "torch" / "__init__.py").is_file()


# -- the NPU path passing --------------------------------------------------------------------


def test_a2_idle_host_passes_and_records_the_npu_environment(npu_host: MockNpuHost) -> None:
    """(a) A2 8x910B4 idle: the play passes, the state file and the env wrapper are right."""
    result = npu_host.run(
        A2_IDLE, group="atlas-a2", npu_count=8, soc_version=SOC_910B4, board_fixture=A2_BOARD
    )
    assert not result.failed, result.failure_messages() or result.stdout[-4000:]
    assert result.rc == 0 and result.status == "successful"

    state = json.loads(npu_host.state_file.read_text())
    assert state["profile"] == "npu"
    assert state["accelerator_setting"] == "npu"
    assert state["hardware_family"] == "atlas-a2"
    assert state["npu"]["device_count"] == 8
    assert state["npu"]["npu_count"] == 8
    assert state["npu"]["chip_names"] == ["910B4"]
    assert state["npu"]["health_ok"] is True
    assert state["npu"]["family"] == "atlas-a2"
    assert state["npu"]["npu_smi_version"] == "25.0.rc1.1"
    assert state["npu"]["hbm_total_mb"] == [32768] * 8
    assert state["npu"]["soc_version"] == "Ascend910B4"  # from the board query
    assert state["npu"]["devices_setting"] == "all"
    # all eight made available (torch sees them), the first three used: serve measures its three
    # servers together, a device each; train's one rank and every other server take device 0.
    assert state["npu"]["available_device_ids"] == list(range(8))
    assert state["npu"]["used_device_ids"] == [0, 1, 2]
    assert state["npu"]["stage_device_ids"] == [0, 1, 2]
    assert [d["logic_id"] for d in state["npu"]["other_devices"]] == [3, 4, 5, 6, 7]
    assert state["npu"]["memory"]["devices"] == [{"id": i, "hbm_total_mb": 32768} for i in range(3)]
    assert state["npu"]["visible_devices"] is None
    assert state["npu"]["image"] == IMAGE
    assert state["thresholds"]["min_devices"] == 1
    assert state["thresholds"]["expected_devices"] == 0
    assert state["stack"]["npu_available"] is True
    assert state["stack"]["npu_count"] == 8
    assert state["stack"]["npu_error"] is None
    assert state["stack"]["soc_version"] == SOC_910B4
    assert state["stack"]["versions"]["vllm"] == "0.23.0+empty"
    assert state["stack"]["versions"]["torch_npu"] == "2.10.0.post4"
    assert state["stack"]["versions"]["vllm-ascend"] == "0.23.0"
    assert state["cann_env_files"] == npu_host.cann_env_files
    assert state["thresholds"]["ports"] == [
        npu_host.ports["specfleet_hidden_states_port"],
        npu_host.ports["specfleet_serve_port"],
        npu_host.ports["specfleet_data_port"],
    ]
    # HCCL's 32 ports from 60000 are out of the kernel's reach (reserved by this run or an
    # earlier one of this machine; the real sysctl), and kept across reboots where it wrote them.
    reserved = Path("/proc/sys/net/ipv4/ip_local_reserved_ports").read_text()
    assert all(
        any(lo <= port <= hi for lo, hi in hccl_ports.parse_ranges(reserved))
        for port in range(60000, 60032)
    ), reserved
    sysctl = npu_host.tmp / "sysctl.d" / "60-specfleet-hccl-ports.conf"
    reserving = [e for e in result.events if e.get("event_data", {}).get("task") == HCCL_TASK]
    assert reserving, "npu_env did not look at HCCL's ports"
    if reserving[-1]["event_data"]["res"].get("changed"):
        assert "60000-60031" in sysctl.read_text()

    # The wrapper sources the CANN scripts (and defines ZSH_VERSION for ATB's); with `all` it
    # leaves ASCEND_RT_VISIBLE_DEVICES unset, never empty.
    env = npu_host.wrapper_env()
    assert env["ASCEND_TOOLKIT_HOME"] == str(npu_host.toolkit_home)
    assert env["MOCK_CANN_TOOLKIT_SOURCED"] == "1"
    assert env["ATB_HOME_PATH"] == str(npu_host.atb_home)
    assert env["MOCK_ATB_ZSH_VERSION_DEFINED"] == "yes"
    assert "ASCEND_RT_VISIBLE_DEVICES" not in env
    assert env["PYTHONPATH"].split(":")[0] == str(npu_host.root / "lib" / "specfleet_helpers.zip")
    # Sourced from a `set -eu` script it works and leaves nounset on.
    sourced = subprocess.run(
        ["bash", "-euc", f'. {npu_host.env_wrapper}; echo "$ATB_HOME_PATH"; echo "$-"'],
        env={"PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.splitlines()
    assert sourced[0] == str(npu_host.atb_home)
    assert "u" in sourced[1]


def test_a2_second_run_changes_nothing(npu_host: MockNpuHost) -> None:
    """(b) Idempotence: a second run of the same host reports changed=0.

    The helpers zip is rebuilt from python_helpers/ on every run, so when someone edits a
    helper between the two runs, shipping the new zip is a legitimate change; then (and only
    then) the host is run once more, and the run after an unchanged zip must change nothing.
    """
    first = npu_host.run(A2_IDLE, group="atlas-a2")
    assert not first.failed, first.failure_messages()
    assert first.count("changed") > 0
    shipped = helpers_digest(npu_host)
    for _ in range(MAX_RERUNS):
        again = npu_host.run(A2_IDLE, group="atlas-a2")
        assert not again.failed, again.failure_messages()
        changed = changed_tasks(again)
        previous, shipped = shipped, helpers_digest(npu_host)
        if shipped == previous:
            assert again.count("changed") == 0, changed
            return
        assert [task for task, _ in changed] == [SHIP_HELPERS], changed
    pytest.fail(f"python_helpers/ changed under every one of {MAX_RERUNS} reruns")


def test_auto_picks_npu_when_npu_smi_is_on_path(npu_host: MockNpuHost) -> None:
    """specfleet_accelerator=auto with the mock `npu-smi` on PATH (no explicit path) -> npu."""
    result = npu_host.run(
        A2_IDLE,
        group="atlas-a2",
        overrides={"specfleet_accelerator": "auto", "npu_env_npu_smi": None},
        mock_npu_smi_on_path=True,
    )
    assert not result.failed, result.failure_messages() or result.stdout[-4000:]
    shown = result.task_results("Resolve the profile")
    assert shown and shown[0]["specfleet_plan"].startswith("profile npu (detected)"), shown
    state = json.loads(npu_host.state_file.read_text())
    assert state["profile"] == "npu"
    assert state["accelerator_setting"] == "auto"
    assert state["npu"]["device_count"] == 8


# The other runs pass --skip-tags speculators_install too, from when --tags npu_env alone still
# started that role's argument-spec task; in make test-reliability's budget.
@pytest.mark.slow
def test_tags_npu_env_alone_starts_no_speculators_install_task(
    npu_host: MockNpuHost,
) -> None:
    """With --tags npu_env alone, no task of speculators_install starts: provision.yml imports
    it without Ansible's argument-spec task (tagged always, it used to start even then), whose
    check the settings check makes before any host work."""
    result = npu_host.run(A2_IDLE, skip_speculators_install=False)
    assert not result.failed, result.failure_messages()
    started = [task for role, task in result.started_tasks() if role == SPECULATORS]
    assert started == [], started


# -- the preflight stopping a host -----------------------------------------------------------


def test_950_alarm_health_stops_the_host(npu_host: MockNpuHost) -> None:
    """(c) Ascend 950 with two chips in Alarm."""
    result = npu_host.run(A950_ALARM, group="ascend-950", npu_count=3)
    message = assert_stopped(npu_host, result, "preflight npu health", "Alarm")
    assert "NPU 0 chip 0 is Alarm" in message and "NPU 1 chip 0 is Alarm" in message


def test_a3_device_count_mismatch_stops_the_host(npu_host: MockNpuHost) -> None:
    """(d) A3 showing 2 NPUs / 4 dies where the fleet asks for exactly 16 devices."""
    result = npu_host.run(
        A3_PARTIAL, group="atlas-a3", npu_count=4, overrides={"npu_env_expected_devices": 16}
    )
    message = assert_stopped(
        npu_host,
        result,
        "preflight npu devices",
        "lists 4 devices, expected exactly 16 (npu_env_expected_devices)",
    )
    assert "atlas-a3" in message


def test_torch_npu_unavailable_stops_the_host(npu_host: MockNpuHost) -> None:
    """(e) torch.npu sees no NPU (MOCK_NPU_COUNT=0)."""
    result = npu_host.run(A2_IDLE, group="atlas-a2", npu_count=0)
    assert_stopped(
        npu_host,
        result,
        "preflight torch_npu",
        "torch.npu.is_available()=False",
        "torch.npu.device_count()=0",
    )


def test_missing_cann_file_stops_the_host(npu_host: MockNpuHost) -> None:
    """(f) The ATB set_env.sh is missing."""
    npu_host.atb_env.unlink()
    result = npu_host.run(A2_IDLE, group="atlas-a2")
    message = assert_stopped(npu_host, result, "preflight cann", str(npu_host.atb_env))
    assert str(npu_host.toolkit_env) not in message.split(";")[0]


# The disk preflight stops a run in CI through test_failures (too little disk, before any
# download); this npu_env variant is in make test-reliability's budget.
@pytest.mark.slow
def test_disk_threshold_stops_the_host(npu_host: MockNpuHost) -> None:
    """(g) More free disk required than any machine has."""
    result = npu_host.run(
        A2_IDLE,
        group="atlas-a2",
        extravars={"specfleet_disk_required_gb": {"npu": 100000, "cpu": 100000}},
    )
    assert_stopped(npu_host, result, "preflight disk", "expected at least 100000", "npu profile")


# A held port stops a run in CI through test_failures (the serve and hidden-states ports);
# this npu_env variant is in make test-reliability's budget.
@pytest.mark.slow
def test_port_in_use_stops_the_host(npu_host: MockNpuHost, listening_port: int) -> None:
    """(h) The serve port is held by this test process."""
    result = npu_host.run(
        A2_IDLE, group="atlas-a2", overrides={"specfleet_serve_port": listening_port}
    )
    assert_stopped(
        npu_host,
        result,
        "preflight port",
        f"127.0.0.1:{listening_port}",
        str(listening_port),
        f"by pid {os.getpid()}",
    )


# -- issue 9: devices used, family, HBM, the CANN environment --------------------------------


def test_runbook_one_card_host_passes(npu_host: MockNpuHost) -> None:
    """The runbook's own host (one 910B4, 32 GB) in atlas-a2 passes: at least
    npu_env_min_devices (1) healthy device, not the group's 8, and 32 GB is enough HBM."""
    result = npu_host.run(A2_ONE_CARD, group="atlas-a2", npu_count=1, soc_version=SOC_910B4)
    assert not result.failed, result.failure_messages() or result.stdout[-4000:]
    state = json.loads(npu_host.state_file.read_text())
    assert state["npu"]["device_count"] == 1
    assert state["npu"]["used_device_ids"] == [0]
    assert state["npu"]["hbm_total_mb"] == [32768]
    assert state["npu"]["npu_smi_version"] == "26.0.rc1"
    # The group's hardware fact is recorded, not demanded.
    assert state["group_settings"]["npu_devices_per_host"] == 8
    assert state["stack"]["npu_count"] == 1


WRITE_STATE = "Write the environment state file and the stage environment wrapper"
REPORT_DEVICES = "Report the devices and the memory plan"


def test_one_card_host_keeps_its_memory_plan_while_the_endpoint_serves(
    npu_host: MockNpuHost,
) -> None:
    """The runbook's one-card host, run twice: first idle, then with the DFlash endpoint a run
    left serving on its only device (serve_mode service, the npu default). The endpoint's memory
    is not the device's own (its redeploy takes it again): the second run keeps the memory plan
    the first recorded, so serve's limits (inputs of the stage) stay the same, and npu_env.json
    is not written again."""
    first = npu_host.run(A2_ONE_CARD, group="atlas-a2", npu_count=1, soc_version=SOC_910B4)
    assert not first.failed, first.failure_messages() or first.stdout[-4000:]
    recorded = npu_host.state_file.read_bytes()
    plan = json.loads(recorded)["npu"]["memory"]
    assert plan == {
        "devices": [{"id": 0, "hbm_total_mb": 32768}],
        "hbm_total_mb": 32768,
        "own_used_mb": 2871,
        "gpu_memory_utilization": 0.88,
        "max_model_len": 8192,
        "max_num_batched_tokens": 4096,
        "max_num_seqs": 128,
    }
    said = first.task_results(REPORT_DEVICES)[0]["msg"]
    assert "Memory plan measured (no plan recorded yet): share 0.88, context 8192" in said, said

    second = npu_host.run(A2_ONE_CARD_SERVING, group="atlas-a2", npu_count=1, soc_version=SOC_910B4)
    assert not second.failed, second.failure_messages() or second.stdout[-4000:]
    said = second.task_results(REPORT_DEVICES)[0]["msg"]
    assert "27170 MB of it the processes listed: used" in said, said
    assert "Memory plan kept the recorded plan" in said and "share 0.88, context 8192" in said, said
    assert npu_host.state_file.read_bytes() == recorded
    assert WRITE_STATE not in [task for task, _ in changed_tasks(second)], changed_tasks(second)


def test_a_device_not_used_may_be_unhealthy(npu_host: MockNpuHost) -> None:
    """950PR, NPU 0 in Alarm, NPU 2 healthy: with [2, 0] made available, the stages use device
    2 alone (two devices do not hold serve's three servers, so one server at a time and train's
    one rank), device 0 is reported and the host passes."""
    result = npu_host.run(
        A950_ALARM,
        group="ascend-950",
        npu_count=3,
        overrides={"specfleet_npu_devices": [2, 0]},
    )
    assert not result.failed, result.failure_messages() or result.stdout[-4000:]
    state = json.loads(npu_host.state_file.read_text())
    assert state["npu"]["available_device_ids"] == [2, 0]
    assert state["npu"]["used_device_ids"] == [2]
    assert state["npu"]["health_ok"] is False
    others = {d["logic_id"]: d["health"] for d in state["npu"]["other_devices"]}
    assert others == {0: "Alarm", 1: "Alarm"}
    said = result.task_results(REPORT_DEVICES)[0]["msg"]
    assert "device 0 (NPU 0 chip 0) Alarm HBM 90633/114688 MB" in said, said
    assert "MB of it the processes listed: not used" in said, said


def test_one_device_of_eight_is_what_torch_is_compared_with(npu_host: MockNpuHost) -> None:
    """specfleet_npu_devices: [0] on an 8-card host: ASCEND_RT_VISIBLE_DEVICES=0 reaches
    torch (the mock then sees 1 of its 8 NPUs) and 1 is what the check expects; the wrapper
    every stage sources exports the same."""
    result = npu_host.run(
        A2_IDLE, group="atlas-a2", npu_count=8, overrides={"specfleet_npu_devices": [0]}
    )
    assert not result.failed, result.failure_messages() or result.stdout[-4000:]
    state = json.loads(npu_host.state_file.read_text())
    assert state["stack"]["npu_count"] == 1
    assert npu_host.wrapper_env().get("ASCEND_RT_VISIBLE_DEVICES") == "0"
    assert state["npu"]["device_count"] == 8
    assert state["npu"]["devices_setting"] == [0]
    assert state["npu"]["used_device_ids"] == [0]
    assert state["npu"]["visible_devices"] == "0"


def test_device_not_on_the_host_stops_it_naming_the_variable(npu_host: MockNpuHost) -> None:
    result = npu_host.run(
        A2_ONE_CARD, group="atlas-a2", npu_count=1, overrides={"specfleet_npu_devices": [0, 3]}
    )
    assert_stopped(
        npu_host,
        result,
        "preflight npu devices: specfleet_npu_devices is [0, 3]",
        "npu-smi lists no device 3",
        "expected all or ids among 0.",
    )


# npu_env_expected_devices stops a host in CI through the A3 case above; this two-run A2
# variant is in make test-reliability's budget.
@pytest.mark.slow
def test_exact_device_count_only_when_the_fleet_asks(npu_host: MockNpuHost) -> None:
    """A 4-card A2 host passes by default; npu_env_expected_devices: 8 stops it."""
    passed = npu_host.run(A2_FOUR_CARDS, group="atlas-a2", npu_count=4)
    assert not passed.failed, passed.failure_messages() or passed.stdout[-4000:]
    npu_host.state_file.unlink()
    result = npu_host.run(
        A2_FOUR_CARDS, group="atlas-a2", npu_count=4, overrides={"npu_env_expected_devices": 8}
    )
    assert_stopped(
        npu_host,
        result,
        "preflight npu devices: npu-smi lists 4 devices, expected exactly 8",
        "(npu_env_expected_devices)",
        "group atlas-a2",
    )


def test_a3_host_in_its_own_group_passes(npu_host: MockNpuHost) -> None:
    """16 A3 dies (board: Ascend910_9392, torch_npu SoC 251) in atlas-a3 with the -a3 image."""
    result = npu_host.run(
        A3_FULL, group="atlas-a3", npu_count=16, soc_version=SOC_A3_9392, board_fixture=A3_BOARD
    )
    assert not result.failed, result.failure_messages() or result.stdout[-4000:]
    state = json.loads(npu_host.state_file.read_text())
    assert state["npu"]["family"] == "atlas-a3"
    assert state["npu"]["soc_version"] == "Ascend910_9392"
    assert state["npu"]["image"] == f"{IMAGE}-a3"
    assert state["npu"]["available_device_ids"] == list(range(16))
    assert state["npu"]["used_device_ids"] == [0, 1, 2]
    assert state["stack"]["npu_count"] == 16


def test_a3_hardware_in_group_atlas_a2_stops_at_preflight(npu_host: MockNpuHost) -> None:
    """An A3 host listed in atlas-a2 (so given the A2 image) is stopped by npu_env, naming
    what npu-smi and torch_npu say, the group and the image's flavour, instead of failing
    when vLLM starts."""
    result = npu_host.run(
        A3_FULL, group="atlas-a2", npu_count=16, soc_version=SOC_A3_9392, board_fixture=A3_BOARD
    )
    assert_stopped(
        npu_host,
        result,
        "preflight npu family: npu-smi says atlas-a3 (Ascend910, 2 dies per NPU,",
        "SoC Ascend910_9392 from the board)",
        "torch_npu says SoC 251 (atlas-a3)",
        "the host is in group atlas-a2 (specfleet_hardware_family)",
        f"the image {IMAGE} is the A2 flavour (from its tag)",
        "tag suffix -a3",
    )


# The hardware/group mismatch is refused in CI through the A3-in-atlas-a2 case above; the
# image-suffix variant is in make test-reliability's budget.
@pytest.mark.slow
def test_a2_hardware_with_the_a3_image_stops_at_preflight(npu_host: MockNpuHost) -> None:
    """The group is right but the image is not: an A2 host told to run the -a3 image."""
    result = npu_host.run(
        A2_IDLE,
        group="atlas-a2",
        soc_version=SOC_910B4,
        overrides={"specfleet_image_tag_suffix": "-a3-openeuler"},
    )
    assert_stopped(
        npu_host,
        result,
        "preflight npu family: npu-smi says atlas-a2 (910B4, 1 die per NPU",
        "torch_npu says SoC 224 (atlas-a2)",
        "the host is in group atlas-a2",
        f"the image {IMAGE}-a3-openeuler is the A3 flavour",
    )


def test_hbm_is_at_least_what_the_models_need(npu_host: MockNpuHost) -> None:
    """The 32 GB 910B4 passed at the default (test_runbook_one_card_host_passes); asking for
    more than it has stops the host, naming the device and the setting."""
    result = npu_host.run(
        A2_ONE_CARD,
        group="atlas-a2",
        npu_count=1,
        overrides={"npu_env_min_hbm_mb_per_device": 32769},
    )
    assert_stopped(
        npu_host,
        result,
        "preflight npu hbm: device 0 (NPU 0 chip 0, 910B4) has 32768 MB HBM",
        "expected at least 32769 MB per device (npu_env_min_hbm_mb_per_device",
    )


def test_cann_environment_is_the_image_entrypoints(npu_host: MockNpuHost) -> None:
    """The scripts the vllm-ascend image's entrypoint sources, with their arguments, and
    /usr/local/lib first on LD_LIBRARY_PATH: in the wrapper every stage sources, and in the
    torch_npu check (the same shell lines)."""
    # The mock's list is group_vars' default list, moved under tmp_path.
    ascend = str(npu_host.tmp / "Ascend")
    assert [
        entry.replace(ascend, "/usr/local/Ascend") for entry in npu_host.cann_env_files
    ] == PATHS["specfleet_cann_env_files"]
    result = npu_host.run(A2_IDLE, group="atlas-a2")
    assert not result.failed, result.failure_messages() or result.stdout[-4000:]

    env = npu_host.wrapper_env()
    assert env["MOCK_CANN_TOOLKIT_SOURCED"] == "1"
    assert env["MOCK_ASCENDNPU_IR_SOURCED"] == "1"
    assert env["PATH"].split(":")[0] == str(npu_host.ir_home / "bin")
    assert env["MOCK_ATB_ARGS"] == "--cxx_abi=1"
    assert env["ATB_HOME_PATH"].endswith("/cxx_abi_1")
    ld_path = env["LD_LIBRARY_PATH"].split(":")
    assert "/usr/local/lib" in ld_path, ld_path
    assert ld_path[0] == str(npu_host.toolkit_home / "lib64")  # the scripts come after it
    state = json.loads(npu_host.state_file.read_text())
    assert state["cann_env_files"] == npu_host.cann_env_files
    assert state["cann_ld_library_paths"] == ["/usr/local/lib"]

    # torch_npu was checked under the same environment.
    checked = [
        res["cmd"]
        for res in result.task_results(
            "Check torch_npu and the runbook's package versions in the target Python"
        )
    ]
    assert checked, "the torch_npu check did not run"
    # argv [..., '/bin/bash', '-c', SCRIPT]: run where the stages run (on this host, no prefix)
    script = checked[0][-1] if isinstance(checked[0], list) else checked[0]
    # Each entry resolved to its one file (the IR script's by its cann-*/ pattern), then sourced.
    toolkit, ir, atb = (entry.split()[0] for entry in npu_host.cann_env_files)
    for line in (
        f'_specfleet_cann_pick {toolkit} && . "$_specfleet_cann_file"\n',
        f"_specfleet_cann_pick '{ir}' && . \"$_specfleet_cann_file\"\n",
        f'_specfleet_cann_pick {atb} && . "$_specfleet_cann_file" --cxx_abi=1\n',
        "export LD_LIBRARY_PATH=/usr/local/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}",
    ):
        assert line in script, (line, script)
