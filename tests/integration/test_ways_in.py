"""The documented ways in, each on its own: playbooks/validate.yml (the fleet-wide validation
docs/report.md names), site.yml --tags validate, and the playbooks the docs tell a user to run,
against the work root `make run` left (.work/local, CPU profile on localhost): CI runs
`make run` before `make test`, so this is what a user's validation after their first run does.

  1. healthy: green, a report written, the artifact suite run, the host lock released;
  2. a work root directory made world-writable: the same validation finds it, sets the mode
     again and says so (a warning, the report's warnings), and a second validation changes
     nothing;
  3. the trained draft's weights moved aside: red, naming train as damaged, the report written;
     moved back: green again;
  4. `site.yml --tags validate` (the host checked, no stage): the artifact suite runs too;
  5. with a second host that cannot be reached: both hosts in the report, that one
     unreachable, localhost green, the run failed;
  6. the other playbooks the docs tell a user to run (provision, pipeline, serve, stop-serving)
     each on its own: up to date, nothing changed, nothing failed.

Each run writes its reports under the test's own directory; the work root is put back as it
was (the draft moved back, modes as the project sets them). Skipped without `make run`'s work
root (its stamps) or the controller venv.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from siteruns import HOST, Run, free_port, run_playbook

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
VALIDATE = REPO / "playbooks" / "validate.yml"
INVENTORY = REPO / "inventory" / "local.yml"
ANSIBLE_PLAYBOOK = REPO / ".venv" / "bin" / "ansible-playbook"
ROOT = REPO / ".work" / "local"
STAGES = ("speculators_install", "models", "convert", "data", "hidden_states", "train", "serve")
RUN_TIMEOUT_S = 600


def validate(
    reports: Path, label: str, inventory: Path = INVENTORY, playbook: Path = VALIDATE, *more: str
) -> Run:
    """validate.yml alone against `inventory`, its reports under `reports`/<label>."""
    out = reports / label
    argv = [str(ANSIBLE_PLAYBOOK), str(playbook), "-i", str(inventory), *more]
    argv += ["-e", json.dumps({"specfleet_reports_dir": str(out)})]
    done = run_playbook(argv, RUN_TIMEOUT_S)
    (reports / f"{label}.log").write_text(done.stdout)
    return Run(label, done.returncode, done.stdout, 0.0, out)


def recap(run: Run, host: str = HOST) -> dict[str, int]:
    for line in run.stdout.splitlines():
        words = line.split()
        if words[:2] == [host, ":"]:
            return {k: int(v) for k, v in (w.split("=") for w in words[2:] if "=" in w)}
    raise AssertionError(f"[{run.label}] no recap line for {host}\n{run.tail()}")


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not os.access(ANSIBLE_PLAYBOOK, os.X_OK):
        pytest.skip(f"no controller venv: {ANSIBLE_PLAYBOOK} (make setup)")
    missing = [s for s in STAGES if not (ROOT / "state" / f"{s}.json").is_file()]
    if missing:
        pytest.skip(f"no finished work root of `make run` at {ROOT} (no stamp of {missing})")
    return tmp_path_factory.mktemp("ways-in")


@pytest.fixture
def draft_aside() -> Iterator[Path]:
    """The trained draft's weights moved aside (the same file, moved back after)."""
    stamp = json.loads((ROOT / "state" / "train.json").read_text())
    weights = Path(stamp["artifacts"]["draft"]) / "model.safetensors"
    aside = weights.with_name("model.safetensors.ways-in")
    weights.rename(aside)
    try:
        yield weights
    finally:
        aside.rename(weights)


def test_1_a_healthy_work_root_is_green_with_a_report(reports: Path) -> None:
    run = validate(reports, "1-healthy")
    assert run.rc == 0, run.tail()
    run.assert_green(artifact_tests=False)
    host = run.host()
    assert all(host["stages"][s]["status"] == "passed" for s in STAGES), host["stages"]
    tests = host["artifact_tests"]
    assert tests["ran"] and tests["failed"] == 0, tests
    for name in ("fleet.json", "fleet.md", "fleet.html", "junit.xml"):
        assert (run.reports / "latest" / name).is_file(), name
    # The validation took the host lock and released it.
    lock = ROOT / "run" / "lock.json"
    assert not lock.exists() or not json.loads(lock.read_text() or "{}").get("token"), (
        lock.read_text()
    )


def test_2_a_world_writable_directory_is_set_again_and_said(reports: Path) -> None:
    """A stage's directory (set again at the report's close) and one of the work root's layout
    (set again when the session starts): both said, both among the report's warnings."""
    target, layout = ROOT / "hidden_states", ROOT / "state"
    mode, layout_mode = (stat.S_IMODE(p.stat().st_mode) for p in (target, layout))
    target.chmod(mode | stat.S_IWOTH)
    layout.chmod(layout_mode | stat.S_IWOTH)
    try:
        run = validate(reports, "2-world-writable")
        assert run.rc == 0, run.tail()
        assert stat.S_IMODE(target.stat().st_mode) == mode, oct(target.stat().st_mode)
        assert stat.S_IMODE(layout.stat().st_mode) == layout_mode, oct(layout.stat().st_mode)
        assert f"{target} ({mode | stat.S_IWOTH:04o} -> {mode:04o})" in run.text, run.tail()
        assert recap(run)["changed"] >= 1
        warnings = run.host()["summary"]["warnings"]
        assert any(str(target) in w and f"{layout} (" in w for w in warnings), warnings
        # The artifact suite ran on the repaired work root (its signature changed).
        assert run.host()["artifact_tests"]["ran"], run.host()["artifact_tests"]
    finally:
        target.chmod(mode)
        layout.chmod(layout_mode)
    again = validate(reports, "2-again")
    assert again.rc == 0, again.tail()
    assert recap(again)["changed"] == 0, again.tail()
    assert again.host()["summary"]["warnings"] == [], again.host()["summary"]


def test_3_a_damaged_draft_is_red_naming_train(reports: Path, draft_aside: Path) -> None:
    run = validate(reports, "3-draft-aside")
    assert run.rc != 0, run.tail()
    fleet = run.fleet()
    host = run.host()
    assert fleet["green"] is False and host["green"] is False
    train = host["stages"]["train"]
    assert train["status"] == "damaged" and "model.safetensors" in train["detail"], train
    assert "train damaged" in host["not_green_reason"], host["not_green_reason"]
    assert "is not green" in run.text and "train" in run.text.split("is not green", 1)[1]


def test_4_the_work_root_is_green_again(reports: Path) -> None:
    validate(reports, "4-green-again").assert_green()


def test_5_site_tags_validate_runs_the_artifact_suite_too(reports: Path) -> None:
    """`site.yml --tags validate` checks the host and no stage: a validation-only run, which
    the artifact suite runs against as it does for validate.yml alone (it found nothing to
    run against before, and called a host green that the next full run turned red)."""
    run = validate(reports, "5-site-tags-validate", INVENTORY, REPO / "site.yml", "--tags=validate")
    run.assert_green()
    assert run.host()["artifact_tests"]["ran"], run.host()["artifact_tests"]


@pytest.mark.parametrize("playbook", ["provision", "pipeline", "serve", "stop-serving"])
def test_7_every_playbook_the_docs_name_runs_alone_and_changes_nothing(
    reports: Path, playbook: str
) -> None:
    """The other ways in the docs name (docs/running.md, docs/serving.md, the playbooks'
    headers), each on its own against the finished work root: each checks the host as its
    stages need (pipeline.yml and serve.yml name no npu_env, which every stage reads), finds
    its stages up to date, changes nothing and fails nothing."""
    run = validate(reports, f"7-{playbook}", INVENTORY, REPO / "playbooks" / f"{playbook}.yml")
    assert run.rc == 0, run.tail()
    counts = recap(run)
    assert counts["failed"] == 0 and counts["changed"] == 0, run.tail()
    assert "is undefined" not in run.stdout, run.tail()
    # No failure record was left behind.
    assert not list((ROOT / "state").glob("*.failed.json"))


def test_8_an_interrupted_runs_end_releases_its_lock_and_reports(reports: Path) -> None:
    """playbooks/interrupted.yml, which the report_net callback runs after a Ctrl-C (with the
    run's record), on the work root: the interrupted run's host lock is released (it held it)
    and the report says where the run stopped. (The slow tier interrupts real runs.)"""
    lock = ROOT / "run" / "lock.json"
    token = "ways-in-interrupted"
    env = {**os.environ, "PYTHONPATH": str(REPO / "python_helpers")}
    owner = json.dumps({"controller": "ways-in", "pid": os.getpid(), "user": "root"})
    taken = subprocess.run(
        [sys.executable, "-m", "specfleet_helpers.host.host_lock", "acquire", f"--lock={lock}",
         f"--token={token}", f"--owner={owner}"],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    assert taken.returncode == 0, taken.stdout + taken.stderr
    record = {
        "where": "play Run the stages, task Wait for train",
        "hosts": {HOST: {"token": token, "started": time.time() - 60, "run": {}}},
    }
    try:
        run = validate(
            reports, "8-interrupted", INVENTORY, REPO / "playbooks" / "interrupted.yml",
            "-e", json.dumps({"specfleet_interrupted": record}),
        )  # fmt: skip
        held = lock.exists() and json.loads(lock.read_text() or "{}").get("token") == token
    finally:
        # Whatever happened, make run's work root is left without this test's lock.
        subprocess.run(
            [sys.executable, "-m", "specfleet_helpers.host.host_lock", "release", f"--lock={lock}",
             f"--token={token}"],
            capture_output=True, env=env, check=False,
        )  # fmt: skip
    assert not held, run.tail()
    assert run.fleet()["ended_early"] == f"interrupted at {record['where']}", run.tail()


def test_6_an_unreachable_host_is_reported_beside_a_green_one(reports: Path) -> None:
    inventory = reports / "two-hosts.json"
    local: dict[str, Any] = {
        "ansible_connection": "local",
        "ansible_python_interpreter": "{{ ansible_playbook_python }}",
        "specfleet_accelerator": "cpu",
        "specfleet_root": str(ROOT),
    }
    gone = {
        "ansible_host": "127.0.0.1",
        "ansible_port": free_port(),
        "ansible_user": "root",
        "ansible_connection": "ssh",
        "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
        "specfleet_accelerator": "cpu",
    }
    inventory.write_text(json.dumps({"all": {"hosts": {HOST: local, "gone-node": gone}}}))
    run = validate(reports, "5-unreachable", inventory)
    assert run.rc != 0, run.tail()
    hosts = {h["name"]: h for h in run.fleet()["hosts"]}
    assert set(hosts) == {HOST, "gone-node"}, list(hosts)
    assert hosts[HOST]["green"] is True, hosts[HOST]
    assert hosts["gone-node"]["reachable"] is False and hosts["gone-node"]["green"] is False
    assert recap(run, "gone-node")["unreachable"] >= 1, run.tail()
