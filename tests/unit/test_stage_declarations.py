"""The stage declarations (roles/specfleet/vars/main/stages.yml) are the one place a stage's
graph, script, verifier and artifacts are written: they name real roles, templates and
settings, the graph runs in pipeline order, and no stage role hands the stage contract
anything but its stage's name."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ROLES = REPO / "roles"
DECLARATIONS = ROLES / "specfleet" / "vars" / "main" / "stages.yml"
STAGES_PLAY = REPO / "playbooks" / "stages.yml"
# What a stage role may pass when it includes roles/stage: its stage's name, and the metrics a
# stage that checks its own results (models, speculators_install) records with finish.yml.
CONTRACT_VARS = {"stage_name", "stage_metrics"}
# A template path inside a templated value, e.g. "{{ 'models/templates/models.sh.j2' if ... }}"
TEMPLATE_IN_VALUE = re.compile(r"([a-z_]+/templates/[\w.]+\.j2)")


def declarations() -> dict[str, dict[str, Any]]:
    return yaml.safe_load(DECLARATIONS.read_text())["specfleet_stages"]


def play_tasks() -> list[dict[str, Any]]:
    """The stages play's tasks, its block's included."""
    play = yaml.safe_load(STAGES_PLAY.read_text())[0]
    found: list[dict[str, Any]] = []

    def walk(tasks: list[dict[str, Any]]) -> None:
        for task in tasks or []:
            found.append(task)
            walk(task.get("block", []))

    walk(play["tasks"])
    return found


def role_order() -> list[str]:
    """The stage roles in the order the stages play runs them: the roles it imports or
    includes whole (an include of one task file, like hidden_states' early start, is not where
    the stage runs), each where it first runs (data's second pass on a job's other hosts)."""
    order = []
    for task in play_tasks():
        for module in ("ansible.builtin.import_role", "ansible.builtin.include_role"):
            called = task.get(module)
            if called and "tasks_from" not in called and called["name"] not in order:
                order.append(called["name"])
    return order


def test_the_declared_stages_are_the_stage_roles_in_pipeline_order() -> None:
    assert list(declarations()) == role_order()


@pytest.mark.parametrize("stage", list(declarations()))
def test_a_stage_needs_only_stages_declared_before_it(stage: str) -> None:
    names = list(declarations())
    before = names[: names.index(stage)]
    declared = declarations()[stage]
    assert set(declared["needs"]) <= set(before), declared["needs"]
    assert set(declared.get("needs_if", {})) <= set(before), declared.get("needs_if")
    assert declared["provides"], f"{stage} says nothing about what it provides"


def test_a_conditional_edge_names_a_setting_of_its_role() -> None:
    for stage, declared in declarations().items():
        for setting in declared.get("needs_if", {}).values():
            sources = [ROLES / stage / "defaults" / "main.yml", ROLES / stage / "vars" / "main.yml"]
            names = set()
            for source in sources:
                if source.is_file():
                    names |= set(yaml.safe_load(source.read_text()) or {})
            assert setting in names, f"{stage}: needs_if names {setting}, not a {stage} setting"


@pytest.mark.parametrize("stage", [s for s, d in declarations().items() if d.get("script")])
def test_a_declared_script_is_a_template_of_its_role(stage: str) -> None:
    script = declarations()[stage]["script"]
    paths = TEMPLATE_IN_VALUE.findall(script) if "{{" in script else [script]
    assert paths, script
    for path in paths:
        assert path.startswith(f"{stage}/templates/"), path
        assert (ROLES / path).is_file(), f"{stage}: no template {path}"


@pytest.mark.parametrize("stage", [s for s, d in declarations().items() if d.get("script")])
def test_a_stage_with_a_script_declares_its_timeout_verifier_inputs_and_artifacts(
    stage: str,
) -> None:
    declared = declarations()[stage]
    for key in ("timeout_s", "verifier", "inputs", "artifacts"):
        assert declared.get(key), f"{stage} declares no {key}"
    unlisted = set(declared.get("unlisted", []))
    artifacts = declared["artifacts"]
    if isinstance(artifacts, dict):
        assert unlisted <= set(artifacts), f"{stage}: unlisted {unlisted} are not artifacts"


def stage_includes(path: Path) -> list[dict[str, Any]]:
    """Every include_role/import_role of the stage role in a task file, blocks included."""
    found = []

    def walk(tasks: list[dict[str, Any]]) -> None:
        for task in tasks or []:
            for key in ("block", "rescue", "always"):
                walk(task.get(key, []))
            for module in ("ansible.builtin.include_role", "ansible.builtin.import_role"):
                if task.get(module, {}).get("name") == "stage":
                    found.append(task)

    walk(yaml.safe_load(path.read_text()))
    return found


@pytest.mark.parametrize(
    "stage", [name for name, entry in declarations().items() if entry.get("outputs")]
)
def test_a_stage_output_is_a_path_into_what_its_stamp_holds(stage: str) -> None:
    """Each output names a declared input (on every host of a job: the follower's inputs too),
    a declared artifact, or the verifier's metrics: a renamed input or artifact fails here, not
    in a reader three stages later."""
    declared = declarations()[stage]
    for name, path in declared["outputs"].items():
        part, _, key = path.partition(".")
        assert part in {"inputs", "artifacts", "metrics"} and key, (name, path)
        if part == "inputs":
            assert key.split(".")[0] in declared["inputs"], (name, path)
            if declared.get("job") == "leader":
                assert key.split(".")[0] in declared["follower_inputs"], (name, path)
        if part == "artifacts" and isinstance(declared["artifacts"], dict):
            # (models' artifacts are its source's paths, a template: verifier and draft)
            assert key in declared["artifacts"], (name, path)


def test_every_output_read_is_declared() -> None:
    """specfleet_outputs.<stage>.<name> anywhere in the roles names a declared output."""
    declared = {stage: set(entry.get("outputs") or {}) for stage, entry in declarations().items()}
    read = re.compile(r"specfleet_outputs\.(\w+)\.(\w+)")
    found = 0
    for path in [*ROLES.rglob("*.yml"), *ROLES.rglob("*.j2")]:
        for stage, name in read.findall(path.read_text()):
            found += 1
            assert name in declared.get(stage, set()), f"{path}: specfleet_outputs.{stage}.{name}"
    assert found > 20


def test_no_stage_role_hands_the_contract_more_than_its_name() -> None:
    calls = 0
    for stage in declarations():
        allowed = CONTRACT_VARS
        for path in sorted((ROLES / stage / "tasks").glob("*.yml")):
            where = path.relative_to(REPO)
            for task in stage_includes(path):
                calls += 1
                given = task.get("vars", {})
                extra = set(given) - allowed
                assert not extra, f"{where}: passes {sorted(extra)} to the stage role"
                assert given.get("stage_name") == stage, f"{where}: calls the contract for {given}"
    assert calls >= len(declarations()) - 1, calls


def test_every_call_of_an_internal_entry_point_matches_its_argument_spec() -> None:
    """The stage and session roles' internal entry points are not in their
    meta/argument_specs.yml, where Ansible would check every call as a task of its own on every
    run, but in meta/entry_points.yml (the same format): this checks each call, in the roles
    and the playbooks, against it, as Ansible would."""
    calls = 0
    for role in ("stage", "session"):
        specs = yaml.safe_load((ROLES / role / "meta" / "entry_points.yml").read_text())
        specs = specs["entry_points"]
        main = yaml.safe_load((ROLES / role / "meta" / "argument_specs.yml").read_text())
        assert list(main["argument_specs"]) == ["main"], role
        for path in sorted([*ROLES.glob("*/tasks/*.yml"), *(REPO / "playbooks").glob("*.yml")]):
            where = path.relative_to(REPO)
            for task in calls_of(path, role):
                calls += 1
                module = (
                    task.get("ansible.builtin.import_role") or task["ansible.builtin.include_role"]
                )
                entry = module.get("tasks_from", "main")
                assert entry in specs, f"{where}: no entry point spec for {role}/{entry}"
                options = specs[entry].get("options") or {}
                given = task.get("vars", {})
                unknown = set(given) - set(options)
                assert not unknown, f"{where}: passes {sorted(unknown)} to {role}/{entry}"
                required = {name for name, option in options.items() if option.get("required")}
                # Required options the play's own variables give (specfleet_root, ...) are not
                # the call's to pass.
                missing = {r for r in required - set(given) if not r.startswith("specfleet_")}
                assert not missing, f"{where}: calls {role}/{entry} without {sorted(missing)}"
                for name, value in given.items():
                    kind = options[name].get("type", "str")
                    if kind == "str" and "{{" not in str(value):
                        assert isinstance(value, str), f"{where}: {name} is not a str: {value!r}"
    assert calls >= 15, calls


def calls_of(path: Path, role: str) -> list[dict[str, Any]]:
    """Every include_role/import_role of `role` in a task file or playbook, blocks included."""
    found = []

    def walk(tasks: list[dict[str, Any]]) -> None:
        for task in tasks or []:
            for key in ("block", "rescue", "always", "pre_tasks", "tasks", "post_tasks"):
                walk(task.get(key, []))
            for module in ("ansible.builtin.include_role", "ansible.builtin.import_role"):
                if task.get(module, {}).get("name") == role:
                    found.append(task)

    walk(yaml.safe_load(path.read_text()) or [])
    return found


def test_no_spec_check_is_switched_off() -> None:
    """The settings check (plugins/action/specfleet_settings.py, the stages play's first task
    after reaching the host) checks every stage role's meta/argument_specs.yml and
    meta/rules.yml for every host before any work; a stage role is included only when its
    stage runs, and Ansible's own check of its spec then runs too. Nothing turns it off."""
    play = yaml.safe_load(STAGES_PLAY.read_text())[0]
    check = next(t for t in play["pre_tasks"] if "settings" in t["name"])
    checked = check["specfleet.ascend.specfleet_settings"]["roles"]
    assert checked == "{{ _specfleet_checked_stages }}"
    assert check["when"] == "specfleet_host_stopped is not defined"
    for role in declarations():
        specs = yaml.safe_load((ROLES / role / "meta" / "argument_specs.yml").read_text())
        assert specs["argument_specs"]["main"]["options"], role
        rules = yaml.safe_load((ROLES / role / "meta" / "rules.yml").read_text())
        assert set(rules) <= {"vars", "rules", "facts", "note"} and rules["rules"], role
    assert not list(ROLES.glob("*/tasks/settings.yml")), "settings live in meta/rules.yml"
    for path in [*ROLES.rglob("*.yml"), *(REPO / "playbooks").rglob("*.yml")]:
        assert "rolespec_validate" not in path.read_text(), path
