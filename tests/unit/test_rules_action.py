"""plugins/action/specfleet_rules.py through a real ansible-playbook run on localhost: one play
runs each case with ignore_errors and the test reads what every case registered. The
argument_spec check runs in a role of the test's own (its meta/argument_specs.yml); the
messages it builds are tested on their own below."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from playrun import run_cases
from plugin_loader import load_plugin

REPO = Path(__file__).resolve().parents[2]
rules_action = load_plugin("plugins/action/specfleet_rules.py")
TRAIN_SPEC = yaml.safe_load((REPO / "roles/train/meta/argument_specs.yml").read_text())[
    "argument_specs"
]["main"]["options"]

# A role whose settings check is one specfleet_rules task with argument_spec: main.
DEMO_SPEC = {
    "argument_specs": {
        "main": {
            "short_description": "demo",
            "options": {
                "demo_port": {"type": "int", "description": "A port."},
                "demo_mode": {"type": "str", "choices": ["a", "b"], "description": "Mode."},
                "demo_args": {"type": "list", "elements": "str", "description": "Args."},
            },
        }
    }
}
DEMO_TASKS = [
    {
        "name": "Check the demo settings",
        "specfleet.ascend.specfleet_rules": {
            "argument_spec": "main",
            "rules": [
                {"name": "port > 100", "that": "demo_port | int > 100", "msg": "port too low"},
            ],
        },
        "register": "demo_checked",
        "ignore_errors": True,
    }
]
# Each: the demo role's settings, and what its check registered (read back by a debug case).
DEMO_CASES: dict[str, dict[str, Any]] = {
    "types_hold_rules_run": {"demo_port": 80, "demo_mode": "a", "demo_args": ["x"]},
    "wrong_type": {"demo_port": "eighty", "demo_mode": "a", "demo_args": []},
    "wrong_choice": {"demo_port": 443, "demo_mode": "c", "demo_args": []},
    "list_as_string": {"demo_port": 443, "demo_mode": "a", "demo_args": "--x,--y"},
    "all_good": {"demo_port": 443, "demo_mode": "b", "demo_args": []},
}

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
    role = work / "demo"
    (role / "meta").mkdir(parents=True)
    (role / "tasks").mkdir()
    (role / "meta" / "argument_specs.yml").write_text(yaml.safe_dump(DEMO_SPEC))
    (role / "tasks" / "settings.yml").write_text(yaml.safe_dump(DEMO_TASKS, sort_keys=False))
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
    for case, settings in DEMO_CASES.items():
        cases.append(
            {
                "name": f"run {case}",
                "ansible.builtin.include_role": {"name": str(role), "tasks_from": "settings.yml"},
                "vars": settings,
            }
        )
        cases.append({"name": case, "ansible.builtin.debug": {"var": "demo_checked"}})
    play_vars = {"port_": 80, "name_": "x"}
    return run_cases(work, cases, play_vars).results


def demo(results: dict[str, dict[str, Any]], case: str) -> dict[str, Any]:
    return results[case]["demo_checked"]


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


def test_the_role_settings_types_pass_then_the_rules_run(
    results: dict[str, dict[str, Any]],
) -> None:
    refused = demo(results, "types_hold_rules_run")
    assert (
        refused["failed"] and refused["msg"] == "port too low" and refused["rule"] == "port > 100"
    )
    passed = demo(results, "all_good")
    assert not passed.get("failed") and passed["msg"] == "1 rules hold (0 do not apply)"


def test_a_setting_of_the_wrong_type_is_refused_before_any_rule(
    results: dict[str, dict[str, Any]],
) -> None:
    result = demo(results, "wrong_type")
    assert result["failed"] and result["rules_checked"] == 0
    assert result["msg"].startswith("demo settings: ") and "demo_port" in result["msg"]
    assert (
        "Expected demo_port: int (A port); see roles/demo/meta/argument_specs.yml."
        in (result["msg"])
    )
    assert "demo_mode:" not in result["msg"]


def test_a_setting_not_among_its_choices_is_refused(results: dict[str, dict[str, Any]]) -> None:
    result = demo(results, "wrong_choice")
    assert result["failed"] and "demo_mode must be one of: a, b, got: c" in result["msg"]
    assert "demo_mode: str, one of a, b (Mode)" in result["msg"]


def test_a_list_given_as_a_string_is_refused_naming_how_to_give_it(
    results: dict[str, dict[str, Any]],
) -> None:
    result = demo(results, "list_as_string")
    assert result["failed"]
    assert 'demo_args is the string "--x,--y", not a list' in result["msg"]
    assert "demo_args: list of str (Args)" in result["msg"]


def test_an_unknown_option_is_named(results: dict[str, dict[str, Any]]) -> None:
    assert "expected argument_spec, facts, note, rules" in results["unknown_option"]["msg"]


def test_validator_errors_are_the_problems() -> None:
    errors = ["argument 'train_epochs' is of type str and we were unable to convert to int"]
    assert rules_action.spec_problems(errors, TRAIN_SPEC, {"train_extra_args": []}) == errors


def test_a_list_given_as_a_string_is_a_problem_naming_how_to_give_it() -> None:
    problems = rules_action.spec_problems([], TRAIN_SPEC, {"train_extra_args": "--a,--b"})
    assert problems == [
        'train_extra_args is the string "--a,--b", not a list '
        "(give it as JSON or YAML, e.g. -e '{\"train_extra_args\": ...}')"
    ]


def test_structured_options_are_the_list_and_dict_ones() -> None:
    spec = {"a": {"type": "list"}, "b": {"type": "dict"}, "c": {"type": "int"}, "d": {}}
    assert rules_action.structured_options(spec) == ["a", "b"]


def test_the_message_names_only_the_options_in_the_problems_with_their_declaration() -> None:
    spec = {
        "x_mode": {"type": "str", "choices": ["a", "b"], "description": "Mode."},
        "x_mode_extra": {"type": "list", "elements": "str", "description": "Extra."},
        "x_other": {"type": "int", "description": "Other."},
    }
    message = rules_action.spec_message(["x_mode must be one of: a, b, got: c"], spec, "x")
    assert message == (
        "x settings: x_mode must be one of: a, b, got: c. "
        "Expected x_mode: str, one of a, b (Mode); see roles/x/meta/argument_specs.yml."
    )


def test_the_message_shows_element_types_and_keys() -> None:
    spec = {
        "y_map": {"type": "dict", "options": {"k": {}, "l": {}}, "description": ["Two", "lines."]}
    }
    message = rules_action.spec_message(['y_map is the string "k"'], spec, "y")
    assert "y_map: dict with keys k, l (Two lines)" in message
