"""plugins/action/specfleet_reach.py through real ansible-playbook runs on localhost: the
host's Python in the shape of setup's `python` fact, with the interpreter configured or
discovered by Ansible, and an unreachable host reported as unreachable."""

from __future__ import annotations

import sys
from pathlib import Path

from playrun import run_cases

FOUND = {
    "name": "what a later task sees",
    "ansible.builtin.debug": {
        "msg": "{{ ansible_facts.python | default(none) }}|"
        "{{ ansible_facts.discovered_interpreter_python | default('none') }}"
    },
}


def test_the_configured_interpreter_described_as_setup_does(tmp_path: Path) -> None:
    run = run_cases(
        tmp_path,
        [
            {"name": "reach", "specfleet.ascend.specfleet_reach": None},
            {
                "name": "setup",
                "ansible.builtin.setup": {"gather_subset": ["!all", "!min", "python"]},
            },
        ],
    )
    reached = run.results["reach"]
    assert not reached.get("failed"), reached
    assert reached["changed"] is False
    facts = reached["ansible_facts"]
    assert "discovered_interpreter_python" not in facts, "configured: nothing to discover"
    # The same fact setup gathers, key for key (the roles read ansible_facts.python).
    assert facts["python"] == run.results["setup"]["ansible_facts"]["ansible_python"]
    assert facts["python"]["version_info"][:2] == list(sys.version_info[:2])


def test_a_discovered_interpreter_becomes_the_hosts_facts(tmp_path: Path) -> None:
    # Discovery looks for python3.N on PATH: this Python's directory first, so that what it
    # finds runs the play's modules (a version manager's shims may come first otherwise).
    path = f"{Path(sys.executable).parent}:/usr/bin:/bin"
    run = run_cases(
        tmp_path,
        [{"name": "reach", "specfleet.ascend.specfleet_reach": None}, FOUND],
        interpreter=None,
        env={"PATH": path},
    )
    reached = run.results["reach"]
    assert not reached.get("failed"), reached
    discovered = reached["ansible_facts"]["discovered_interpreter_python"]
    assert Path(discovered).name.startswith("python"), discovered
    assert Path(reached["ansible_facts"]["python"]["executable"]).exists()
    # Host facts for the rest of the play: the modules after it do not discover again.
    python, seen = run.results["what a later task sees"]["msg"].split("|")
    assert seen == discovered
    assert reached["ansible_facts"]["python"]["executable"] in python


def test_an_unreachable_host_is_unreachable(tmp_path: Path) -> None:
    run = run_cases(
        tmp_path,
        [
            {
                "name": "reach",
                "specfleet.ascend.specfleet_reach": None,
                "delegate_to": "nowhere",
                "ignore_unreachable": True,
                "vars": {
                    "ansible_connection": "ssh",
                    "ansible_host": "127.0.0.1",
                    "ansible_port": 1,
                    "ansible_ssh_common_args": "-o ConnectTimeout=3",
                },
            }
        ],
    )
    reached = run.results["reach"]
    assert reached.get("unreachable") is True, reached
    assert "port 1" in reached["msg"] or "refused" in reached["msg"], reached["msg"]


def test_options_are_refused(tmp_path: Path) -> None:
    run = run_cases(
        tmp_path, [{"name": "reach", "specfleet.ascend.specfleet_reach": {"gather_subset": "all"}}]
    )
    reached = run.results["reach"]
    assert reached["failed"] and "unknown option(s) gather_subset" in reached["msg"]
