"""plugins/action/specfleet_warn.py through a real ansible-playbook on localhost: its message
said as Ansible's own warning (the console callback hides ok results, not warnings), nothing
changed, and a call without a message refused."""

from __future__ import annotations

from pathlib import Path

from playrun import run_cases


def test_a_warning_is_said_and_nothing_changes(tmp_path: Path) -> None:
    run = run_cases(
        tmp_path,
        [
            {"name": "warn", "specfleet.ascend.specfleet_warn": {"msg": "host-1: Ascend 950PR"}},
            {"name": "no msg", "specfleet.ascend.specfleet_warn": {}},
            {"name": "other option", "specfleet.ascend.specfleet_warn": {"msg": "x", "to": "y"}},
        ],
    )
    warned = run.results["warn"]
    assert not warned.get("failed"), warned
    assert warned["changed"] is False
    assert warned["msg"] == "host-1: Ascend 950PR"
    # As a module's warnings: every callback says them (on stderr; the console callback too,
    # which hides ok results; tests/integration/test_npu_env_variants.py reads it there).
    assert warned["warnings"] == ["host-1: Ascend 950PR"]
    for case in ("no msg", "other option"):
        refused = run.results[case]
        assert refused.get("failed"), refused
        assert "expected one option, msg" in refused["msg"], refused
