"""npu_env's container tasks where they decide in Jinja, run through a real ansible-playbook
(tests/unit/playrun.py) with the expressions read from roles/npu_env/tasks/container.yml.

npu-smi: the host probe may find it elsewhere than /usr/local/bin (npu_env_npu_smi on PATH,
or a full path). The container mounts it from there (docker would create an empty directory
at a missing source path), at the same path and at /usr/local/bin/npu-smi, on the image's
PATH; an npu host without npu-smi is refused before any container is made.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from playrun import run_cases

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "npu_env"
CHECK_TASK = "Check npu-smi was found on the host (the container mounts it from there)"
SETTINGS_TASK = "Collect the container's run settings"


def task(name: str) -> dict[str, Any]:
    tasks = yaml.safe_load((ROLE / "tasks" / "container.yml").read_text())
    found = [t for t in tasks if t.get("name") == name]
    assert found, f"no task {name!r} in roles/npu_env/tasks/container.yml"
    return found[0]


def test_the_default_driver_mounts_leave_npu_smi_to_the_probe() -> None:
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    mounts = defaults["npu_env_container_npu_mounts"]
    assert not [m for m in mounts if "npu-smi" in m], mounts


def test_npu_smi_is_mounted_from_where_the_host_has_it(tmp_path: Path) -> None:
    smi_vars = task(SETTINGS_TASK)["vars"]

    def case(name: str, found: str) -> dict[str, Any]:
        return {
            "name": name,
            "ansible.builtin.set_fact": {"mounts": "{{ _npu_smi_mounts }}"},
            "vars": {
                **smi_vars,
                "specfleet_env": {"profile": "npu", "probe": {"tools": {"npu-smi": found}}},
            },
        }

    check = task(CHECK_TASK)
    check_case = {k: v for k, v in check.items() if k != "name"}
    run = run_cases(
        tmp_path,
        [
            case("sbin", "/usr/local/sbin/npu-smi"),
            case("documented", "/usr/local/bin/npu-smi"),
            {
                **check_case,
                "name": "missing",
                "vars": {
                    "specfleet_env": {"profile": "npu", "probe": {"tools": {"npu-smi": None}}}
                },
            },
            {
                **check_case,
                "name": "found",
                "vars": {
                    "specfleet_env": {
                        "profile": "npu",
                        "probe": {"tools": {"npu-smi": "/x/npu-smi"}},
                    }
                },
            },
            {
                **check_case,
                "name": "cpu",
                "vars": {
                    "specfleet_env": {"profile": "cpu", "probe": {"tools": {"npu-smi": None}}},
                },
            },
        ],
        play_vars={"npu_env_npu_smi": "npu-smi"},
    )
    res = run.results
    # at the probe's path, and where the image's PATH and vllm-ascend's `docker run` have it
    assert res["sbin"]["ansible_facts"]["mounts"] == [
        "/usr/local/sbin/npu-smi:/usr/local/sbin/npu-smi:ro",
        "/usr/local/sbin/npu-smi:/usr/local/bin/npu-smi:ro",
    ]
    # the documented place: one mount (the same destination twice would fail the run)
    assert res["documented"]["ansible_facts"]["mounts"] == [
        "/usr/local/bin/npu-smi:/usr/local/bin/npu-smi:ro"
    ]
    assert res["missing"].get("failed"), res["missing"]
    msg = res["missing"]["msg"]
    assert "npu_env_npu_smi=npu-smi" in msg and "is not on the PATH of localhost" in msg, msg
    assert not res["found"].get("failed"), res["found"]
    assert res["cpu"].get("skipped"), res["cpu"]


CHECK_SOURCES_TASK = "Check the container's devices and mounts are on the host"


def role_vars() -> dict[str, Any]:
    """npu_env's defaults and vars, as the play's variables (the specfleet role, in play,
    gives the fleet-wide ones)."""
    found: dict[str, Any] = {}
    for part in ("defaults", "vars"):
        found.update(yaml.safe_load((ROLE / part / "main.yml").read_text()))
    return found


def test_each_group_gets_its_familys_devices_and_driver_mounts_and_a_job_its_storage(
    tmp_path: Path,
) -> None:
    """The run settings of the stage container on npu, per hardware group: vllm-ascend's 950
    commands (ummu, uburma, no devmm_svm, the whole driver, the UB topology files), the A2/A3
    form elsewhere; a job's shared directory at the same path on every profile; each source
    named with the setting it comes from."""
    settings = task(SETTINGS_TASK)

    def case(name: str, family: str | None, profile: str = "npu", job: str = "") -> dict[str, Any]:
        facts = {
            "specfleet_env": {
                "profile": profile,
                "probe": {"tools": {"npu-smi": "/usr/local/bin/npu-smi"}},
            },
            "_npu_env_engine": "docker",
            "_npu_env_used_devices": [0, 1],
            "_npu_env_selinux": {},
            "specfleet_job": job,
            "specfleet_job_shared_dir": "/srv/nfs" if job else "",
            "specfleet_container_image": "quay.io/ascend/vllm-ascend:v0.23.0-a5",
            "specfleet_container_python": "/usr/local/python3.12.13/bin/python3",
            **({"specfleet_hardware_family": family} if family else {}),
        }
        return {"name": name, "ansible.builtin.set_fact": settings["ansible.builtin.set_fact"],
                "vars": {**settings["vars"], **facts}}  # fmt: skip

    run = run_cases(
        tmp_path,
        [case("a950", "ascend-950"), case("a2", "atlas-a2"), case("none", None),
         case("job-cpu", None, profile="cpu", job="ascend-950")],
        play_vars=role_vars(),
        roles=["specfleet"],
    )  # fmt: skip
    res = {name: r["ansible_facts"] for name, r in run.results.items()}
    for name in res:
        assert not run.results[name].get("failed"), run.results[name]

    def args(name: str, flag: str) -> list[str]:
        return [
            a.split("=", 1)[1] for a in res[name]["_npu_env_container_args"] if a.startswith(flag)
        ]

    a950 = args("a950", "--device=")
    assert a950 == ["/dev/davinci0", "/dev/davinci1", "/dev/davinci_manager", "/dev/hisi_hdc",
                    "/dev/ummu", "/dev/uburma"], a950  # fmt: skip
    mounts = args("a950", "--mount=")
    assert "/usr/local/Ascend/driver:/usr/local/Ascend/driver:ro" in mounts, mounts
    assert {"/etc/hccl_rootinfo.json:/etc/hccl_rootinfo.json:ro", "/etc/hixlep:/etc/hixlep:ro",
            "/lib/route.conf:/lib/route.conf:ro"} <= set(mounts), mounts  # fmt: skip
    assert not [m for m in mounts if "lib64" in m], mounts
    for form in ("a2", "none"):
        devices, mounts = args(form, "--device="), args(form, "--mount=")
        assert "/dev/devmm_svm" in devices and "/dev/ummu" not in devices, devices
        assert "/usr/local/Ascend/driver/lib64:/usr/local/Ascend/driver/lib64:ro" in mounts
    job = args("job-cpu", "--mount=")
    assert "/srv/nfs:/srv/nfs" in job and not args("job-cpu", "--device="), job
    sources = res["a950"]["_npu_env_container_sources"]
    assert sources["/dev/ummu"] == "npu_env_container_control_devices", sources
    assert sources["/dev/davinci1"] == "specfleet_npu_devices", sources
    assert sources["/usr/local/Ascend/driver"] == "npu_env_container_npu_mounts", sources
    assert res["job-cpu"]["_npu_env_container_sources"]["/srv/nfs"] == "specfleet_job_shared_dir"


def test_a_missing_device_or_mount_is_named_with_its_setting_before_any_create(
    tmp_path: Path,
) -> None:
    check = {k: v for k, v in task(CHECK_SOURCES_TASK).items() if k != "name"}
    plan = {"action": "create", "missing": ["/dev/ummu", "/srv/nfs"]}
    run = run_cases(
        tmp_path,
        [
            {
                **check,
                "name": "missing",
                "vars": {
                    **check["vars"],
                    "_npu_env_container_plan": {"stdout": json.dumps(plan)},
                    "_npu_env_container_sources": {
                        "/dev/ummu": "npu_env_container_control_devices",
                        "/srv/nfs": "specfleet_job_shared_dir",
                    },
                    "specfleet_container_name": "specfleet",
                    "specfleet_hardware_family": "ascend-950",
                    "specfleet_env": {"profile": "npu"},
                },
            },
            {
                **check,
                "name": "kept",
                "vars": {
                    **check["vars"],
                    "_npu_env_container_plan": {"stdout": json.dumps({**plan, "action": "ok"})},
                    "specfleet_container_name": "specfleet",
                    "specfleet_env": {"profile": "npu"},
                    "_npu_env_container_sources": {},
                },
            },
        ],
    )
    missing = run.results["missing"]
    assert missing.get("failed"), missing
    msg = " ".join(missing["msg"].split())
    assert "/dev/ummu (from npu_env_container_control_devices)" in msg, msg
    assert "/srv/nfs (from specfleet_job_shared_dir)" in msg, msg
    assert "the ascend-950 group's devices and driver files" in msg, msg
    # An existing, up-to-date container is kept as it is.
    assert not run.results["kept"].get("failed"), run.results["kept"]
