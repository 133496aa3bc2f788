"""plugins/action/specfleet_rules.py through a real ansible-playbook run on localhost: one play
runs each case with ignore_errors and the test reads what every case registered."""

from __future__ import annotations

from typing import Any

import pytest
from playrun import run_cases

# Each case: the rules and the variables the play gives them.
CASES: dict[str, dict[str, Any]] = {
    "all_hold": {
        "rules": [
            {
                "name": "port in range",
                "that": ["port_ | int >= 1", "port_ | int <= 65535"],
                "msg": "bad port",
            },
            {"name": "name set", "that": "name_ | length > 0", "msg": "no name"},
        ],
    },
    "first_refusal_wins": {
        "rules": [
            {"name": "passes", "that": "true", "msg": "never"},
            {
                "name": "refuses",
                "that": ["true", "port_ | int > 100"],
                "msg": "port_ is {{ port_ }}, expected > 100",
            },
            # Never reached: its message would not even template.
            {"name": "later", "that": "false", "msg": "{{ undefined_variable.field }}"},
        ],
    },
    "when_false_is_not_evaluated": {
        "rules": [
            {
                "name": "off",
                "when": "false",
                "that": "undefined_variable.x",
                "msg": "{{ undefined_variable }}",
            },
            {"name": "on", "when": ["true", "port_ | int == 80"], "that": "true", "msg": "never"},
        ],
    },
    "rule_vars_are_lazy": {
        "rules": [
            {
                "name": "uses one var",
                "that": "_double | int == 160",
                "msg": "{{ _double }}",
                "vars": {
                    "_double": "{{ port_ | int * 2 }}",
                    "_broken": "{{ undefined_variable.x }}",
                },
            },
        ],
    },
    "group": {
        "rules": [
            {
                "name": "group off",
                "when": "false",
                "rules": [{"name": "inside off", "that": "false", "msg": "never"}],
            },
            {
                "name": "group on",
                "vars": {"_group_value": "{{ port_ | int + 1 }}"},
                "rules": [
                    {
                        "name": "sees the group's vars",
                        "that": "_group_value | int == 81",
                        "msg": "ok",
                    },
                    {
                        "name": "refuses inside",
                        "that": "_group_value | int == 0",
                        "msg": "group value {{ _group_value }}",
                    },
                ],
            },
        ],
    },
    "facts_once_rules_hold": {
        "rules": [{"name": "port set", "that": "port_ | int > 0", "msg": "no port"}],
        "facts": {"planned_port_": "{{ port_ | int * 2 }}"},
        "note": "the port doubled is {{ planned_port_ }}",
    },
    # Neither is templated after a refusal: both would fail on the undefined variable.
    "no_facts_after_a_refusal": {
        "rules": [{"name": "refuses", "that": "false", "msg": "refused first"}],
        "facts": {"never_set_": "{{ undefined_variable.x }}"},
        "note": "{{ undefined_variable.y }}",
    },
    "facts_not_a_mapping": {"rules": [], "facts": ["planned_port_"]},
    "missing_msg": {"rules": [{"name": "no message", "that": "true"}]},
    "not_a_list": {"rules": "port_ > 1"},
    "unknown_option": {"rules": [], "subject": "x"},
}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    work = tmp_path_factory.mktemp("rules")
    cases = [
        {"name": case, "specfleet.ascend.specfleet_rules": body} for case, body in CASES.items()
    ]
    cases += [
        {"name": "read planned_port_", "ansible.builtin.debug": {"var": "planned_port_"}},
        {
            "name": "read never_set_",
            "ansible.builtin.debug": {"msg": "{{ never_set_ is defined }}"},
        },
    ]
    play_vars = {"port_": 80, "name_": "x"}
    return run_cases(work, cases, play_vars).results


def test_rules_that_hold_pass_and_are_counted(results: dict[str, dict[str, Any]]) -> None:
    result = results["all_hold"]
    assert not result.get("failed") and not result["changed"]
    assert result["rules_checked"] == 2 and result["msg"] == "2 rules hold (0 do not apply)"


def test_the_first_refusal_fails_with_its_own_message(results: dict[str, dict[str, Any]]) -> None:
    result = results["first_refusal_wins"]
    assert result["failed"]
    assert result["msg"] == "port_ is 80, expected > 100"
    assert result["rule"] == "refuses" and result["assertion"] == "port_ | int > 100"


def test_a_rule_whose_when_is_false_is_never_evaluated(results: dict[str, dict[str, Any]]) -> None:
    result = results["when_false_is_not_evaluated"]
    assert not result.get("failed"), result
    assert result["rules_checked"] == 1 and result["rules_not_applying"] == 1


def test_a_rules_vars_are_templated_only_when_read(results: dict[str, dict[str, Any]]) -> None:
    result = results["rule_vars_are_lazy"]
    assert not result.get("failed"), result


def test_a_group_applies_its_when_and_vars_to_its_rules(results: dict[str, dict[str, Any]]) -> None:
    result = results["group"]
    assert (
        result["failed"]
        and result["msg"] == "group value 81"
        and result["rule"] == "refuses inside"
    )
    assert result["rules_not_applying"] == 1 and result["rules_checked"] == 2


def test_facts_are_set_once_the_rules_hold_and_the_note_reads_them(
    results: dict[str, dict[str, Any]],
) -> None:
    result = results["facts_once_rules_hold"]
    assert not result.get("failed"), result
    assert result["facts_set"] == ["planned_port_"]
    assert result["msg"] == "1 rules hold (0 do not apply): the port doubled is 160"
    # A later task of the play reads the fact, as it would one set_fact set.
    assert results["read planned_port_"]["planned_port_"] == 160


def test_after_a_refusal_no_fact_or_note_is_templated(results: dict[str, dict[str, Any]]) -> None:
    result = results["no_facts_after_a_refusal"]
    assert result["failed"] and result["msg"] == "refused first"
    assert results["read never_set_"]["msg"] is False
    assert results["facts_not_a_mapping"]["failed"]
    assert "facts must be a mapping" in results["facts_not_a_mapping"]["msg"]


def test_a_malformed_rule_is_named(results: dict[str, dict[str, Any]]) -> None:
    assert results["missing_msg"]["failed"]
    assert "(no message): a rule has name, that, msg" in results["missing_msg"]["msg"]
    assert results["not_a_list"]["failed"]
    assert "rules must be a list" in results["not_a_list"]["msg"]


def test_an_unknown_option_is_named(results: dict[str, dict[str, Any]]) -> None:
    assert "expected facts, note, rules" in results["unknown_option"]["msg"]
