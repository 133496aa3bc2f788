"""Tests for the specfleet.ascend.report_net callback's parts that need no Ansible run: the report
id, a lost host's input entry and the `latest` link. The whole callback is exercised by
tests/integration/test_report_flow.py (a host lost mid-run).

The plugin imports ansible, so run these with the controller venv's Python.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone

import pytest
from plugin_loader import load_callback

pytest.importorskip("ansible")


@pytest.fixture(scope="module")
def net():
    return load_callback("report_net")


def test_report_id_has_validate_ymls_shape(net):
    rid = net.report_id(datetime(2026, 12, 2, 6, 52, 0, tzinfo=timezone.utc))
    assert re.fullmatch(r"20261202T065200Z-[0-9a-f]{6}", rid), rid


def test_a_lost_host_carries_its_connection_error_and_what_it_ran(net):
    ran = {"npu_env": {"status": "ran", "reason": "host environment changed"}}
    entry = net.host_input(["atlas-a2"], "ssh: connect to host 10.0.0.5 port 22", ran, {})
    assert entry["reachable"] is False and entry["state"] is None, entry
    assert entry["unreachable_error"].startswith("ssh: connect"), entry
    assert entry["run"] == ran and entry["groups"] == ["atlas-a2"], entry


def test_a_host_found_unreachable_earlier_keeps_that_error(net):
    stopped = {"why": "unreachable", "stage": None, "error": "Connection timed out"}
    entry = net.host_input(["atlas-a3"], None, {}, stopped)
    assert entry["reachable"] is False and entry["unreachable_error"] == "Connection timed out"


def test_a_host_still_in_play_is_reachable(net):
    refused = {"why": "refused", "stage": "serve", "error": "serve settings: ..."}
    entry = net.host_input(["ascend-950"], None, {}, refused)
    assert entry["reachable"] is True and entry["unreachable_error"] is None, entry


def test_the_interrupted_runs_ending_repeats_how_the_run_reached_its_hosts(net):
    """playbooks/interrupted.yml runs with the run's inventory, extra vars and connection
    options, on the hosts it reached, given what the run recorded; nothing else of the run's
    command line (its tags, its limit) comes along."""
    cliargs = {
        "inventory": ("inventory/fleet.yml",),
        "extra_vars": ("@vars.yml", "train_epochs=2"),
        "private_key_file": "/keys/fleet",
        "remote_user": "admin",
        "become": True,
        "become_user": None,
        "timeout": 0,
        "tags": ("train",),
        "subset": "atlas-a2",
    }
    record = {"where": "play 'p', task 't'", "hosts": {"a2-node01": {"token": "1-x"}}}
    argv = net.interrupted_argv(cliargs, ["a2-node01", "a2-node02"], record)
    assert argv[1:5] == ["-m", "ansible", "playbook", str(net.INTERRUPTED_PLAYBOOK)]
    assert argv[5:] == [
        "--inventory", "inventory/fleet.yml",
        "--extra-vars", "@vars.yml",
        "--extra-vars", "train_epochs=2",
        "--private-key", "/keys/fleet",
        "--user", "admin",
        "--become",
        "--limit", "a2-node01,a2-node02",
        "--extra-vars", json.dumps({"specfleet_interrupted": record}),
    ]  # fmt: skip
    assert net.INTERRUPTED_PLAYBOOK.is_file()


def test_a_refused_host_carries_what_was_refused(net):
    stopped = {"why": "refused", "stage": "train", "error": "train_epochs is 0"}
    entry = net.host_input(["atlas-a2"], None, {}, stopped)
    assert entry["reachable"] and entry["refused"] == {
        "stage": "train",
        "error": "train_epochs is 0",
    }
