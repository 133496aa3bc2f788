"""plugins/action/specfleet_settings.py: every stage role's settings in one task, through a real
ansible-playbook run on localhost with the project's roles (their meta/argument_specs.yml and
meta/rules.yml, their defaults), each case a task with the settings it gives; and the parts
that need no run (the spec's messages, the tags) on their own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from playrun import run_cases
from plugin_loader import load_plugin

REPO = Path(__file__).resolve().parents[2]
settings_action = load_plugin("plugins/action/specfleet_settings.py")
STAGE_ROLES = list(
    yaml.safe_load((REPO / "roles/specfleet/vars/main/stages.yml").read_text())["specfleet_stages"]
)
TRAIN_SPEC = yaml.safe_load((REPO / "roles/train/meta/argument_specs.yml").read_text())[
    "argument_specs"
]["main"]["options"]

# Each case: the settings the task is given (task vars, above the roles' defaults).
CASES: dict[str, dict[str, Any]] = {
    "defaults": {},
    "wrong_type": {"train_epochs": "abc"},
    "out_of_range": {"train_epochs": 0},
    "list_as_string": {"serve_extra_args": "--a,--b"},
    # models' rules tell the verifier's shape to the roles after it (a fact of the check only)
    "layer_beyond_the_verifier": {"hidden_states_target_layer_ids": [1, 99]},
    "npu_token_limit": {"serve_num_speculative_tokens": 16, "specfleet_env": {"profile": "npu"}},
}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    work = tmp_path_factory.mktemp("settings")
    cases: list[dict[str, Any]] = []
    for case, given in CASES.items():
        cases.append(
            {
                "name": case,
                "specfleet.ascend.specfleet_settings": {"roles": STAGE_ROLES, "names": False},
                "vars": {"specfleet_env": {"profile": "cpu"}, **given},
            }
        )
        cases.append(
            {
                "name": f"after {case}",
                "ansible.builtin.debug": {
                    "msg": "{{ {'stopped': specfleet_host_stopped | default(none),"
                    " 'planned': specfleet_planned_verifier is defined} }}"
                },
            }
        )
    # The fact a refusal records stays for the rest of the run: the later cases read their
    # own refusal (specfleet_host_stopped is set again each time).
    return run_cases(work, cases, {"specfleet_accelerator": "cpu"}, roles=["specfleet"]).results


def test_good_settings_pass_every_role(results: dict[str, dict[str, Any]]) -> None:
    r = results["defaults"]
    assert not r.get("failed") and "refused" not in r, r
    assert list(r["checked"]) == STAGE_ROLES
    assert all("rules hold" in what for what in r["checked"].values()), r["checked"]
    assert results["after defaults"]["msg"] == {"stopped": None, "planned": False}


def test_a_wrong_type_is_refused_naming_the_variable(results: dict[str, dict[str, Any]]) -> None:
    r = results["wrong_type"]
    assert r["refused"] == "train" and not r.get("failed")
    assert "train_epochs" in r["msg"] and "Expected train_epochs: int" in r["msg"]
    # the roles before it passed, and the refusal is recorded as train's failure
    assert list(r["checked"]) == STAGE_ROLES[: STAGE_ROLES.index("train")]
    stopped = results["after wrong_type"]["msg"]["stopped"]
    assert stopped["why"] == "refused" and stopped["stage"] == "train"
    assert "train_epochs" in stopped["error"]


def test_a_range_is_a_rule_of_the_role(results: dict[str, dict[str, Any]]) -> None:
    r = results["out_of_range"]
    assert r["refused"] == "train" and "train_epochs is 0" in r["msg"], r["msg"]


def test_a_list_given_as_a_string_is_refused(results: dict[str, dict[str, Any]]) -> None:
    r = results["list_as_string"]
    assert r["refused"] == "serve"
    assert 'serve_extra_args is the string "--a,--b", not a list' in r["msg"]


def test_a_role_reads_what_an_earlier_role_planned(results: dict[str, dict[str, Any]]) -> None:
    """The synthetic verifier's layer count, planned by models' rules, refuses a layer id in
    hidden_states' rules: the plan joins the check's scope, never the host's facts."""
    r = results["layer_beyond_the_verifier"]
    assert r["refused"] == "hidden_states" and "hidden_states_target_layer_ids" in r["msg"]
    assert results["after layer_beyond_the_verifier"]["msg"]["planned"] is False


def test_a_limit_of_the_npu_profile(results: dict[str, dict[str, Any]]) -> None:
    r = results["npu_token_limit"]
    assert r["refused"] == "serve" and "serve_num_speculative_tokens" in r["msg"], r["msg"]


@pytest.mark.parametrize(
    ("tags", "run_tags", "skip_tags", "expected"),
    [
        (["train"], ["all"], [], True),
        (["train"], ["serve"], [], False),
        (["train"], ["train"], [], True),
        (["train"], ["all"], ["train"], False),
        (["npu_env", "always"], ["serve"], [], True),
        (["npu_env", "always"], ["all"], ["always"], False),
        (["train"], ["tagged"], [], True),
    ],
)
def test_a_role_is_checked_when_its_tags_would_run(
    tags: list[str], run_tags: list[str], skip_tags: list[str], expected: bool
) -> None:
    given = {"ansible_run_tags": run_tags, "ansible_skip_tags": skip_tags}
    assert settings_action.selected(tags, given) is expected


def test_validator_errors_are_the_problems() -> None:
    errors = ["argument 'train_epochs' is of type str and we were unable to convert to int"]
    assert settings_action.spec_problems(errors, TRAIN_SPEC, {"train_extra_args": []}) == errors


def test_a_list_given_as_a_string_is_a_problem_naming_how_to_give_it() -> None:
    problems = settings_action.spec_problems([], TRAIN_SPEC, {"train_extra_args": "--a,--b"})
    assert problems == [
        'train_extra_args is the string "--a,--b", not a list '
        "(give it as JSON or YAML, e.g. -e '{\"train_extra_args\": ...}')"
    ]


def test_structured_options_are_the_list_and_dict_ones() -> None:
    spec = {"a": {"type": "list"}, "b": {"type": "dict"}, "c": {"type": "int"}, "d": {}}
    assert settings_action.structured_options(spec) == ["a", "b"]


def test_the_message_names_only_the_options_in_the_problems_with_their_declaration() -> None:
    spec = {
        "x_mode": {"type": "str", "choices": ["a", "b"], "description": "Mode."},
        "x_mode_extra": {"type": "list", "elements": "str", "description": "Extra."},
        "x_other": {"type": "int", "description": "Other."},
    }
    message = settings_action.spec_message(["x_mode must be one of: a, b, got: c"], spec, "x")
    assert message == (
        "x settings: x_mode must be one of: a, b, got: c. "
        "Expected x_mode: str, one of a, b (Mode); see roles/x/meta/argument_specs.yml."
    )


def test_the_message_shows_element_types_and_keys() -> None:
    spec = {
        "y_map": {"type": "dict", "options": {"k": {}, "l": {}}, "description": ["Two", "lines."]}
    }
    message = settings_action.spec_message(['y_map is the string "k"'], spec, "y")
    assert "y_map: dict with keys k, l (Two lines)" in message
