"""Settings set where Ansible users set them win over specfleet's defaults.

The fleet-wide defaults are the `specfleet` role's defaults (the lowest precedence there is),
which every play loads first; so a value under a group's `vars:` in the inventory file, or in a
group_vars/ directory beside the inventory, reaches the play. (They used to live in
playbook-level group_vars/, which outrank inventory group vars: `specfleet_root` under
`atlas-a2: vars:` was ignored.)

  inventory file, group vars   specfleet_root under atlas-a2's vars: the work root the
                               provision play would create (--check: nothing is created)
  inventory-adjacent group_vars  serve_num_speculative_tokens: 16 (a value one group sets) in
                               <inventory dir>/group_vars/atlas-a2.yml: the serve settings
                               check refuses it (vllm-ascend's limit is 15)

Each run is one real ansible-playbook on this machine (~15-40 s). Run explicitly:
    .venv/bin/python -m pytest -q tests/integration/test_settings_precedence.py
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from siteruns import LOW_HOST_FLOORS, free_port, playbook_env

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / ".venv" / "bin"
HOST = "localhost"
RUN_TIMEOUT_S = 600


def write_inventory(directory: Path, group_vars: dict, adjacent: dict | None = None) -> Path:
    """localhost in the atlas-a2 group, with `group_vars` under the group's vars: and
    `adjacent` in group_vars/atlas-a2.yml beside the inventory file."""
    directory.mkdir(parents=True)
    inventory = directory / "hosts.yml"
    host = {
        "ansible_connection": "local",
        "ansible_python_interpreter": "{{ ansible_playbook_python }}",
    }
    tree = {"all": {"children": {"atlas-a2": {"hosts": {HOST: host}, "vars": group_vars}}}}
    inventory.write_text(yaml.safe_dump(tree))
    if adjacent is not None:
        (directory / "group_vars").mkdir()
        (directory / "group_vars" / "atlas-a2.yml").write_text(yaml.safe_dump(adjacent))
    return inventory


def play(playbook: str, inventory: Path, *options: str) -> subprocess.CompletedProcess[str]:
    argv = [str(BIN / "ansible-playbook"), str(REPO / playbook), "-i", str(inventory), *options]
    return subprocess.run(
        argv,
        cwd=REPO,
        env=playbook_env(),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )


@pytest.fixture(autouse=True)
def _needs_controller_venv() -> None:
    if not os.access(BIN / "ansible-playbook", os.X_OK):
        pytest.skip(f"no controller venv: {BIN} (make setup)")


def test_inventory_group_vars_set_the_work_root(tmp_path: Path) -> None:
    root = tmp_path / "group-root"
    inventory = write_inventory(
        tmp_path / "inventory", {"specfleet_root": str(root), "specfleet_accelerator": "cpu"}
    )
    extravars = {
        "specfleet_hidden_states_port": free_port(),
        "specfleet_serve_port": free_port(),
        "specfleet_data_port": free_port(),
        **LOW_HOST_FLOORS,
        "specfleet_reports_dir": str(tmp_path / "reports"),
    }
    run = play("playbooks/provision.yml", inventory, "--check", "-v", "-e", json.dumps(extravars))
    output = run.stdout + run.stderr
    session = "TASK [session : Start this run's session on the host"
    assert session in run.stdout, output[-4000:]
    started = run.stdout.split(session, 1)[1].split("\nTASK [", 1)[0]
    # The YAML callback folds long messages: compare with the whitespace joined.
    assert f"work root {root}: no lock in --check mode" in " ".join(started.split()), (
        f"the play did not use the inventory's specfleet_root:\n{started}"
    )
    assert "/var/lib/specfleet" not in output, output[-4000:]
    assert not root.exists(), "--check created the work root"

    # What the inventory alone says: ansible-inventory shows the inventory's value (and none
    # of the role defaults, which only a play loads).
    shown = subprocess.run(
        [str(BIN / "ansible-inventory"), "-i", str(inventory), "--host", HOST],
        cwd=REPO,
        env=playbook_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    host_vars = json.loads(shown.stdout)
    assert host_vars["specfleet_root"] == str(root)
    assert "specfleet_hardware_groups" not in host_vars


def test_inventory_adjacent_group_vars_set_a_hardware_value(tmp_path: Path) -> None:
    inventory = write_inventory(
        tmp_path / "inventory",
        {"specfleet_root": str(tmp_path / "root"), "specfleet_accelerator": "npu"},
        adjacent={"serve_num_speculative_tokens": 16},
    )
    run = play(
        "site.yml",
        inventory,
        "--check",
        "--tags",
        "serve",
        "-e",
        f"specfleet_reports_dir={tmp_path / 'reports'}",
    )
    output = run.stdout + run.stderr
    assert run.returncode != 0, (
        f"16 speculative tokens from the inventory's group_vars were not seen:\n{output[-4000:]}"
    )
    assert "settings refused (serve): " in output, output[-4000:]
    assert "is 16" in output and "expected 1..15" in output, output[-4000:]
    assert not (tmp_path / "root").exists()
