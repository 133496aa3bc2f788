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

if TYPE_CHECKING:
    from conftest import MockNpuHost

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
MOCK_NPU_DIR = HERE / "mock_npu"
MOCK_NPU_SMI = MOCK_NPU_DIR / "npu-smi"
NPU_SMI_FIXTURES = HERE.parent / "fixtures" / "npu-smi"
SPECULATORS = "speculators_install"
SHIP_HELPERS = "Ship python_helpers to the host"
# Idempotence reruns allowed while others edit python_helpers/ concurrently.
MAX_RERUNS = 3

A2_IDLE = "a2_910b4_8npu_idle_25.0.rc1.1.txt"
A950_ALARM = "950pr_3npu_2alarm_2proc_25.7.rc1.txt"
A3_PARTIAL = "a3_ascend910_2npu_4die_1proc_25.2.0.txt"


def wrapper_env(npu_host: MockNpuHost, *command: str) -> dict[str, str]:
    """Environment printed by `env` run through <root>/run/specfleet-env, from a clean env."""
    clean = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(npu_host.tmp)}
    out = subprocess.run(
        [*command, "env"] if command else [str(npu_host.env_wrapper), "env"],
        env=clean,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


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
        [str(MOCK_NPU_SMI), "info", "-t", "board"], env=env, capture_output=True, text=True
    )
    assert other.returncode == 127
    assert "command not found" in other.stderr
    # The ATB file fails under `set -u` unless ZSH_VERSION is defined, as the real one does.
    strict = subprocess.run(
        ["bash", "-uc", f". {npu_host.atb_env}"], capture_output=True, text=True, env={}
    )
    assert strict.returncode != 0
    assert "ZSH_VERSION" in strict.stderr
    # torch.npu follows MOCK_NPU_COUNT; torch_npu needs the CANN env, like the real one.
    probe = "import torch, torch_npu; print(torch.npu.is_available(), torch.npu.device_count())"
    for count, expected in (("8", "True 8"), ("0", "False 0")):
        out = subprocess.run(
            [
                *("bash", "-c", '. "$1"; exec "$2" -c "$3"', "-"),
                *(str(npu_host.toolkit_env), str(npu_host.npu_python), probe),
            ],
            env={"PATH": os.environ["PATH"], "MOCK_NPU_COUNT": count},
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.strip() == expected
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
    result = npu_host.run(A2_IDLE, group="atlas-a2", npu_count=8)
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
    assert state["stack"]["npu_available"] is True
    assert state["stack"]["npu_count"] == 8
    assert state["stack"]["npu_error"] is None
    assert state["stack"]["versions"]["vllm"] == "0.23.0+empty"
    assert state["stack"]["versions"]["torch_npu"] == "2.10.0.post4"
    assert state["stack"]["versions"]["vllm-ascend"] == "0.23.0"
    assert state["cann_env_files"] == npu_host.cann_env_files
    assert state["thresholds"]["ports"] == [
        npu_host.ports["specfleet_hidden_states_port"],
        npu_host.ports["specfleet_serve_port"],
    ]

    # The wrapper sources both CANN files (and defines ZSH_VERSION for ATB's).
    env = wrapper_env(npu_host)
    assert env["ASCEND_TOOLKIT_HOME"] == str(npu_host.toolkit_home)
    assert env["MOCK_CANN_TOOLKIT_SOURCED"] == "1"
    assert env["ATB_HOME_PATH"] == str(npu_host.atb_home)
    assert env["MOCK_ATB_ZSH_VERSION_DEFINED"] == "yes"
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
    shown = result.task_results("Show the profile")
    assert shown and shown[0]["msg"].startswith("profile npu (detected)"), shown
    state = json.loads(npu_host.state_file.read_text())
    assert state["profile"] == "npu"
    assert state["accelerator_setting"] == "auto"
    assert state["npu"]["device_count"] == 8


def test_tags_npu_env_alone_starts_only_the_speculators_argspec_check(
    npu_host: MockNpuHost,
) -> None:
    """Why the other runs also pass --skip-tags speculators_install: with --tags npu_env
    alone, Ansible still starts speculators_install's argument-spec validation (tagged
    always); none of the role's own tasks run."""
    result = npu_host.run(A2_IDLE, skip_speculators_install=False)
    assert not result.failed, result.failure_messages()
    started = [task for role, task in result.started_tasks() if role == SPECULATORS]
    assert len(started) <= 1, started
    assert all(task.startswith("Validating arguments against arg spec") for task in started)


# -- the preflight stopping a host -----------------------------------------------------------


def test_950_alarm_health_stops_the_host(npu_host: MockNpuHost) -> None:
    """(c) Ascend 950 with two chips in Alarm."""
    result = npu_host.run(A950_ALARM, group="ascend-950", npu_count=3)
    message = assert_stopped(npu_host, result, "preflight npu health", "Alarm")
    assert "NPU 0 chip 0 is Alarm" in message and "NPU 1 chip 0 is Alarm" in message


def test_a3_device_count_mismatch_stops_the_host(npu_host: MockNpuHost) -> None:
    """(d) A3 showing 2 NPUs / 4 dies where group atlas-a3 expects 16 devices."""
    result = npu_host.run(A3_PARTIAL, group="atlas-a3", npu_count=4)
    message = assert_stopped(
        npu_host, result, "preflight npu devices", "lists 4 devices, expected 16"
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


def test_disk_threshold_stops_the_host(npu_host: MockNpuHost) -> None:
    """(g) More free disk required than any machine has."""
    result = npu_host.run(
        A2_IDLE,
        group="atlas-a2",
        extravars={"specfleet_disk_required_gb": {"npu": 100000, "cpu": 100000}},
    )
    assert_stopped(npu_host, result, "preflight disk", "expected at least 100000", "npu profile")


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
