"""scripts/failure-digest, what make molecule prints when a scenario fails: on the output of a
real failing ansible-playbook run (the repo's console callback, as molecule's runs print), with
molecule's and pytest's own lines around it."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.machinery import SourceFileLoader
from importlib.util import module_from_spec, spec_from_loader
from pathlib import Path

import pytest
import yaml

pytest.importorskip("ansible")

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "failure-digest"
ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")
_loader = SourceFileLoader("failure_digest", str(SCRIPT))
failure_digest = module_from_spec(spec_from_loader("failure_digest", _loader))
_loader.exec_module(failure_digest)

PLAY = [
    {
        "name": "A run that fails",
        "hosts": "localhost",
        "gather_facts": False,
        "tasks": [
            {
                "name": "A rescued command that fails with stderr",
                "block": [
                    {
                        "name": "Run the stage",
                        "ansible.builtin.command": {
                            "argv": ["bash", "-c", "echo the stage broke >&2; exit 3"]
                        },
                    }
                ],
                "rescue": [{"name": "Go on", "ansible.builtin.debug": {"msg": "rescued"}}],
            },
            {
                "name": "Check every item",
                "ansible.builtin.fail": {"msg": "item {{ item }} is bad"},
                "loop": [1, 2],
                "ignore_errors": True,
            },
            {"name": "An ok task", "ansible.builtin.set_fact": {"seen": True}},
            {"name": "Fail the host", "ansible.builtin.fail": {"msg": "the last failure"}},
        ],
    }
]


@pytest.fixture(scope="module")
def output(tmp_path_factory: pytest.TempPathFactory) -> str:
    work = tmp_path_factory.mktemp("digest")
    (work / "play.yml").write_text(yaml.safe_dump(PLAY, sort_keys=False))
    done = subprocess.run(
        [
            str(ANSIBLE_PLAYBOOK),
            "-i",
            "localhost,",
            "-c",
            "local",
            "-e",
            f"ansible_python_interpreter={sys.executable}",
            str(work / "play.yml"),
        ],
        cwd=REPO,
        env={**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    return (
        "INFO     [fleet > converge] Executed: Successful\n"
        + done.stdout
        + "ERROR    Ansible return code was 2, command was: ansible-playbook converge.yml\n"
        + "fleet > idempotence: Executed: Failed (Ansible return code was 2)\n"
        + "fleet > destroy: Executed: Successful\n"
    )


def test_it_shows_the_failed_step_the_recap_and_every_failed_task(output: str) -> None:
    shown = failure_digest.digest(output, 40)
    text = "\n".join(shown)
    assert shown[0] == "fleet > idempotence: Executed: Failed (Ansible return code was 2)"
    assert any(line.startswith("localhost") and "failed=1" in line for line in shown), text
    headers = [line for line in shown if line.startswith("TASK [")]
    assert headers == [
        "TASK [Run the stage]",
        "TASK [Check every item]",
        "TASK [Fail the host]",
    ], text
    assert "the stage broke" in text, text
    assert "item 1 is bad" in text and "item 2 is bad" in text, text
    # The failed task's result ends where Ansible goes on: not the next task's lines.
    assert "msg: rescued" not in text and "An ok task" not in text, text
    assert shown[-1] == "fatal: [localhost]: FAILED! the last failure", text


def test_a_short_limit_keeps_the_last_failed_tasks(output: str) -> None:
    shown = failure_digest.digest(output, 7)
    text = "\n".join(shown)
    assert len(shown) <= 7, text
    assert "TASK [Fail the host]" in shown and "TASK [Run the stage]" not in shown, text
    assert "... 2 more failed task(s) above, left out here" in shown, text


def test_a_long_failed_task_keeps_its_start_and_its_end() -> None:
    """A stage's failure message starts with what failed and ends with its log's tail."""
    result = [f"        log line {n}" for n in range(1, 31)]
    text = "TASK [serve : Wait]\nfatal: [a2-node1]: FAILED! => \n    msg: |-\n" + "\n".join(result)
    shown = failure_digest.digest(text, 12)
    assert shown[:3] == ["TASK [serve : Wait]", "fatal: [a2-node1]: FAILED! => ", "    msg: |-"]
    assert shown[3] == "  ... (23 lines left out)"
    assert shown[4:] == result[-7:]


def test_the_fleet_verdict_and_the_verifier_failures_are_shown() -> None:
    text = (
        "SUMMARY ****\n"
        "NOT GREEN: 1 of 3 hosts failed: a2-node1 (serve)\n"
        "hosts green per group: atlas-a2 0/1\n"
        "\n"
        "tests/fleet/test_fleet.py::test_a PASSED\n"
        "FAILED ../../tests/fleet/test_fleet.py::test_b - AssertionError\n"
    )
    assert failure_digest.digest(text, 40) == [
        "NOT GREEN: 1 of 3 hosts failed: a2-node1 (serve)",
        "hosts green per group: atlas-a2 0/1",
        "FAILED ../../tests/fleet/test_fleet.py::test_b - AssertionError",
    ]


def test_molecules_framed_and_coloured_output_is_read_too(output: str) -> None:
    """molecule 26 frames each command's output ("  │ " before every line) and colours it."""
    framed = (
        "".join(f"  \x1b[2m│\x1b[0m \x1b[33m{line}\x1b[0m\n" for line in output.splitlines()[1:-3])
        + "fleet ➜ converge: Executed: Failed (Ansible return code was 2)\n"
    )
    shown = failure_digest.digest(framed, 40)
    text = "\n".join(shown)
    assert shown[0] == "fleet ➜ converge: Executed: Failed (Ansible return code was 2)", text
    assert "TASK [Fail the host]" in shown and "the stage broke" in text, text
    assert any(line.startswith("localhost") and "failed=1" in line for line in shown), text


def test_an_output_without_failures_says_so(tmp_path: Path) -> None:
    log = tmp_path / "ok.log"
    log.write_text("PLAY RECAP ****\nlocalhost : ok=3 changed=0 unreachable=0 failed=0\n")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(log)], capture_output=True, text=True, check=True
    )
    assert "no failed task, recap or verdict found" in done.stdout


def test_a_missing_log_is_named(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "absent.log")], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "absent.log" in done.stderr
