"""npu_env's container tasks where they decide in Jinja, run through a real ansible-playbook
(tests/unit/playrun.py) with the expressions read from roles/npu_env/tasks/container.yml.

npu-smi: the host probe may find it elsewhere than /usr/local/bin (npu_env_npu_smi on PATH,
or a full path). The container mounts it from there (docker would create an empty directory
at a missing source path), at the same path and at /usr/local/bin/npu-smi, on the image's
PATH; an npu host without npu-smi is refused before any container is made.
"""

from __future__ import annotations

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
