"""npu_env left a truthful description of the host and the stage environment wrapper."""

from __future__ import annotations

EXPECTED_KEYS = {"profile", "arch", "cpu_count", "ram_total_gb", "stack", "npu", "thresholds"}


def test_state_file_has_expected_keys(npu_env_state):
    missing = EXPECTED_KEYS - npu_env_state.keys()
    assert not missing, f"npu_env.json lacks {sorted(missing)}: {npu_env_state}"
    assert npu_env_state["profile"] in ("cpu", "npu")


def test_thresholds_recorded(npu_env_state):
    thresholds = npu_env_state["thresholds"]
    assert float(thresholds["disk_required_gb"]) > 0
    assert float(thresholds["ram_required_gb"]) > 0
    assert thresholds["ports"], "no ports recorded"


def test_profile_facts(npu_env_state):
    if npu_env_state["profile"] == "npu":
        npu = npu_env_state["npu"]
        assert npu["device_count"] > 0 and npu["health_ok"], npu
        assert npu_env_state["stack"]["npu_available"], npu_env_state["stack"]
    else:
        assert npu_env_state["stack"]["python"].startswith("3."), npu_env_state["stack"]
        assert npu_env_state["npu"]["device_count"] == 0


def test_env_wrapper_runs_commands(host, root):
    wrapper = f"{root}/run/specfleet-env"
    assert host.file(wrapper).mode & 0o111, f"{wrapper} is not executable"
    # testinfra quotes the arguments of run(): the root may contain spaces.
    result = host.run("%s sh -c 'echo $PYTHONPATH'", wrapper)
    assert result.rc == 0, result.stderr
    assert "specfleet_helpers.zip" in result.stdout


def test_helpers_shipped_and_importable(host, root):
    result = host.run(
        "%s python3 -m specfleet_helpers.host.stage_run --help", f"{root}/run/specfleet-env"
    )
    assert result.rc == 0 and "stage script" in result.stdout, result.stdout + result.stderr


def test_work_root_not_world_writable(host, root):
    found = host.run("find %s -path %s -prune -o ! -type l -perm -o+w -print", root, f"{root}/venv")
    assert found.rc == 0, found.stderr
    assert found.stdout.strip() == "", f"world-writable under {root}:\n{found.stdout}"
