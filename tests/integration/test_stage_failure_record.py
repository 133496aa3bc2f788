"""The failure record every stage role's rescue writes (roles/stage/tasks/failed.yml), from
real failing tasks: what the fleet report and a user logging in read must say what failed.
A looped task's own message is only "One or more items failed"; a command's is only "non-zero
return code". Runs a small playbook on localhost (seconds)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = REPO / ".venv" / "bin" / "ansible-playbook"

PLAYBOOK = """
- name: Fail inside a stage-like block, rescued by the stage contract
  hosts: localhost
  connection: local
  gather_facts: false
  vars:
    specfleet_defer_failures: true
    guarded_setting: bad
    # A stage declared as roles/specfleet/vars/main/stages.yml declares one.
    specfleet_stages:
      guarded:
        needs: []
        preconditions:
          - name: guarded_setting is ok
            that: guarded_setting == 'ok'
            msg: "guarded_setting must be ok, not {{ guarded_setting }}"
  tasks:
    - name: A stage whose looped task fails for two items
      block:
        - name: Check every item
          ansible.builtin.fail:
            msg: "item {{ item }} is bad"
          loop: [1, 2, 3]
          when: item != 1
      rescue:
        - name: Record the failure
          ansible.builtin.include_role:
            name: stage
            tasks_from: failed
          vars:
            stage_failed_name: looped
    - name: A stage whose command fails with stderr
      block:
        - name: Run a command
          ansible.builtin.command:
            argv: [bash, -c, "echo first problem >&2; echo second problem >&2; exit 3"]
      rescue:
        - name: Record the failure
          ansible.builtin.include_role:
            name: stage
            tasks_from: failed
          vars:
            stage_failed_name: command
    - name: A stage whose preflight quotes what looks like a script failure
      block:
        - name: Refuse the input
          ansible.builtin.fail:
            msg: |-
              bad input
              log: /not/a/log
              re-run by hand: bash /not/a/script.sh
              --- last 1 log lines ---
              not a tail
      rescue:
        - name: Record the failure
          ansible.builtin.include_role:
            name: stage
            tasks_from: failed
          vars:
            stage_failed_name: preflight
    - name: A stage whose script failed (what run.yml describes before it fails)
      block:
        - name: Describe the failure
          ansible.builtin.set_fact:
            stage_failure_detail:
              stage: scripted
              error: "stage scripted failed on localhost: exit code 2"
              log: /root/logs/scripted.log
              rerun: bash /root/run/scripted.sh
              log_tail: [one, two]
        - name: Fail with the log tail
          ansible.builtin.fail:
            msg: "stage scripted failed on localhost: exit code 2, and the rest of the message"
      rescue:
        - name: Record the failure
          ansible.builtin.include_role:
            name: stage
            tasks_from: failed
          vars:
            stage_failed_name: scripted
    - name: A stage whose decision refuses a precondition (as begin.yml decides every stage)
      block:
        - name: "Plan: guarded"
          specfleet.ascend.specfleet_stage_decide:
            stage: guarded
            inputs: {}
            stamp: {}
            state_dir: "{{ specfleet_state_dir }}"
            python: "{{ ansible_python_interpreter }}"
          register: stage_decision
      rescue:
        - name: Record the failure
          ansible.builtin.include_role:
            name: stage
            tasks_from: failed
          vars:
            stage_failed_name: guarded
"""


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    if not ANSIBLE_PLAYBOOK.exists():
        pytest.skip("the controller venv is missing (run `make setup`)")
    tmp = tmp_path_factory.mktemp("failure-record")
    state = tmp / "root" / "state"
    state.mkdir(parents=True)
    playbook = tmp / "playbook.yml"
    playbook.write_text(PLAYBOOK)
    extravars = {
        "specfleet_root": str(tmp / "root"),
        "specfleet_state_dir": str(state),
        "ansible_python_interpreter": sys.executable,
    }
    done = subprocess.run(
        [str(ANSIBLE_PLAYBOOK), "-i", "localhost,", str(playbook), "-e", json.dumps(extravars)],
        cwd=REPO,
        env={**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    # Deferred: both failures are rescued and recorded, the play itself passes.
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {p.name: json.loads(p.read_text()) for p in state.glob("*.failed.json")}


def test_a_looped_task_records_what_each_failed_item_said(records: dict[str, dict]) -> None:
    record = records["looped.failed.json"]
    assert record["error"] == "item 2 is bad\nitem 3 is bad", record
    assert (record["stage"], record["status"], record["host"]) == ("looped", "failed", "localhost")


def test_a_command_records_its_stderr_as_lines(records: dict[str, dict]) -> None:
    error = records["command.failed.json"]["error"]
    assert error.splitlines()[-2:] == ["first problem", "second problem"], error
    assert "\\n" not in error, "newlines were written as backslash-n"


def test_the_record_takes_log_and_rerun_from_the_stage_not_from_the_message(
    records: dict[str, dict],
) -> None:
    """failed.yml once parsed `log:` / `re-run by hand:` / the tail back out of the error text,
    so any message quoting such lines forged them; now they come only from the structured
    description run.yml and stage.yml set for the stage that failed."""
    quoted = records["preflight.failed.json"]
    assert (quoted["log"], quoted["rerun"], quoted["log_tail"]) == (None, None, []), quoted
    assert quoted["error"].startswith("bad input\nlog: /not/a/log"), quoted
    scripted = records["scripted.failed.json"]
    assert scripted["log"] == "/root/logs/scripted.log", scripted
    assert scripted["rerun"] == "bash /root/run/scripted.sh", scripted
    assert scripted["log_tail"] == ["one", "two"], scripted
    assert scripted["error"] == "stage scripted failed on localhost: exit code 2", scripted


def test_a_refused_precondition_records_its_message_and_an_empty_reason(
    records: dict[str, dict],
) -> None:
    """The decision refuses before deciding anything: the record says which setting, and the
    reason (why a stage would redo) is empty, not missing."""
    record = records["guarded.failed.json"]
    assert record["error"] == "guarded_setting must be ok, not bad", record
    assert (record["task"], record["reason"]) == ("Plan: guarded", ""), record
