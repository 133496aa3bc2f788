"""The CPU pipeline in container mode (molecule `container` scenario): the stage container
outlives runs that change nothing, is recreated when a run setting changes (one more mount),
and a recreation redoes no stage, since the work root and the venv on it are mounted.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

STAGES = ["speculators_install", "models", "convert", "data", "hidden_states", "train", "serve"]
EXTRA_MOUNT = "/mnt/specfleet-extra"


def root() -> str:
    return os.environ["SPECFLEET_ROOT"]


def test_idempotence_kept_the_container(history):
    converge, again, _ = history
    assert again["id"] == converge["id"], "the run that changed nothing recreated the container"
    assert again["started_at"] == converge["started_at"], (
        f"the run that changed nothing restarted the container: "
        f"{converge['started_at']} -> {again['started_at']}"
    )


def test_changed_mount_recreated_the_container(history):
    _, before, after = history
    assert after["id"] != before["id"], "the side effect added a mount but the container was kept"
    assert after["image_id"] == before["image_id"]
    assert EXTRA_MOUNT not in before["mounts"]
    assert EXTRA_MOUNT in after["mounts"]


def test_recreation_redid_no_stage(scenario_dir: Path):
    """Only the run settings changed, not the image: every stamp is the one from before."""
    before_dir = scenario_dir / "state-before-side-effect"
    redone = []
    for stage in STAGES:
        before = json.loads((before_dir / f"{stage}.json").read_text())
        now = json.loads((Path(root()) / "state" / f"{stage}.json").read_text())
        if (now["run_id"], now["fingerprint"]) != (before["run_id"], before["fingerprint"]):
            redone.append(f"{stage} ({now.get('reason')})")
    assert not redone, f"a recreated container (image unchanged) redid: {', '.join(redone)}"


def test_container_runs_from_the_test_image_with_the_work_root(inspect, history, hostvars):
    assert inspect["State"]["Running"], inspect["State"]
    assert inspect["Id"] == history[-1]["id"]
    assert inspect["Config"]["Image"].endswith(hostvars["specfleet_container_image"])
    mounts = {m["Destination"]: m["Source"] for m in inspect["Mounts"]}
    assert mounts.get(root()) == root(), f"work root not mounted at its own path: {mounts}"
    assert inspect["HostConfig"]["NetworkMode"] == "host"


def test_stages_ran_in_the_container(host, engine, container_name):
    """The venv was made by the image's Python 3.11 (Debian's, in /usr/bin), not this
    machine's, and speculators_install recorded that Python's version."""
    inner = host.check_output(
        f"{engine} exec {container_name} /usr/bin/python3.11 -c "
        "'import platform; print(platform.python_version())'"
    )
    cfg = dict(
        line.split(" = ", 1)
        for line in (Path(root()) / "venv" / "pyvenv.cfg").read_text().splitlines()
        if " = " in line
    )
    assert cfg["home"] == "/usr/bin", cfg
    assert cfg["version"] == inner, (cfg, inner)
    stamp = json.loads((Path(root()) / "state" / "speculators_install.json").read_text())
    assert stamp["inputs"]["base_python"] == inner, stamp["inputs"]
