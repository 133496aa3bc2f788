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
PLAYBOOKS = [REPO / "playbooks" / name for name in ("provision.yml", "pipeline.yml", "serve.yml")]
# What a stage role may pass when it includes roles/stage: its stage's name; the metrics a
# stage that checks its own results (models, speculators_install) records with finish.yml;
# and npu_env, which has no script or stamp, its result for the report (note.yml).
CONTRACT_VARS = {"stage_name", "stage_metrics", "stage_failed_name"}
NOTE_VARS = {"stage_note_status", "stage_note_reason", "stage_note_duration_s"}
# A template path inside a templated value, e.g. "{{ 'models/templates/models.sh.j2' if ... }}"
TEMPLATE_IN_VALUE = re.compile(r"([a-z_]+/templates/[\w.]+\.j2)")


def declarations() -> dict[str, dict[str, Any]]:
    return yaml.safe_load(DECLARATIONS.read_text())["specfleet_stages"]


def role_order() -> list[str]:
    """The stage roles in the order the plays run them: a play's `roles:`, then the roles its
    `tasks:` import whole (an import of one task file, like hidden_states' early start, is
    not where the stage runs). A role a later play imports again (serve's rollout play) counts
    where it first runs."""
    order = []
    for playbook in PLAYBOOKS:
        for play in yaml.safe_load(playbook.read_text()):
            for role in play.get("roles", []):
                name = role["role"] if isinstance(role, dict) else role
                if name != "specfleet" and name not in order:
                    order.append(name)
            for task in play.get("tasks", []):
                imported = task.get("ansible.builtin.import_role")
                if imported and "tasks_from" not in imported and imported["name"] not in order:
                    order.append(imported["name"])
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
        allowed = CONTRACT_VARS | (NOTE_VARS if stage == "npu_env" else set())
        for path in sorted((ROLES / stage / "tasks").glob("*.yml")):
            where = path.relative_to(REPO)
            for task in stage_includes(path):
                calls += 1
                given = task.get("vars", {})
                extra = set(given) - allowed
                assert not extra, f"{where}: passes {sorted(extra)} to the stage role"
                name = given.get("stage_name") or given.get("stage_failed_name")
                assert name == stage, f"{where}: calls the contract for {name}"
    assert calls >= 2 * (len(declarations()) - 1), calls


def test_every_call_of_an_internal_entry_point_matches_its_argument_spec() -> None:
    """The stage role's entry points are called with rolespec_validate: false (validated at
    run time they cost two tasks per stage and run): this checks each call against the entry
    point's spec instead (roles/stage/meta/argument_specs.yml), as Ansible would."""
    specs = yaml.safe_load((ROLES / "stage" / "meta" / "argument_specs.yml").read_text())
    specs = specs["argument_specs"]
    calls = 0
    for path in sorted(ROLES.glob("*/tasks/*.yml")):
        where = path.relative_to(REPO)
        for task in stage_includes(path):
            calls += 1
            module = task.get("ansible.builtin.import_role") or task["ansible.builtin.include_role"]
            entry = module.get("tasks_from", "main")
            assert entry in specs, f"{where}: no argument spec for the stage entry point {entry}"
            assert module.get("rolespec_validate") is False, (
                f"{where}: calls stage/{entry} without rolespec_validate: false"
            )
            options = specs[entry].get("options") or {}
            given = task.get("vars", {})
            unknown = set(given) - set(options)
            assert not unknown, f"{where}: passes {sorted(unknown)} to stage/{entry}"
            required = {name for name, option in options.items() if option.get("required")}
            missing = required - set(given)
            assert not missing, f"{where}: calls stage/{entry} without {sorted(missing)}"
            for name, value in given.items():
                kind = options[name].get("type", "str")
                if kind == "str" and "{{" not in str(value):
                    assert isinstance(value, str), f"{where}: {name} is not a str: {value!r}"
    assert calls >= 20, calls


def test_the_plays_skip_only_the_spec_checks_the_settings_check_makes() -> None:
    """site.yml's plays import the stage roles with rolespec_validate: false because its first
    play's settings check (plugins/action/specfleet_settings.py, one task: every declared
    stage's meta/argument_specs.yml `main` then its meta/rules.yml, in pipeline order)
    validates each role's spec before any host work. Each import that skips it must be of a
    role so checked."""
    provision = yaml.safe_load(PLAYBOOKS[0].read_text())[0]
    check = next(t for t in provision["pre_tasks"] if "settings" in t["name"])
    assert check["specfleet.ascend.specfleet_settings"]["roles"] == (
        "{{ specfleet_stages.keys() | list }}"
    )
    assert check["when"] == "specfleet_host_stopped is not defined"
    for role in declarations():
        specs = yaml.safe_load((ROLES / role / "meta" / "argument_specs.yml").read_text())
        assert specs["argument_specs"]["main"]["options"], role
        rules = yaml.safe_load((ROLES / role / "meta" / "rules.yml").read_text())
        assert set(rules) <= {"vars", "rules", "facts", "note"} and rules["rules"], role
    assert not list(ROLES.glob("*/tasks/settings.yml")), "settings live in meta/rules.yml"
    skipped = []
    for playbook in PLAYBOOKS:
        for play in yaml.safe_load(playbook.read_text()):
            for task in play.get("tasks", []):
                imported = task.get("ansible.builtin.import_role")
                if imported and imported.get("rolespec_validate") is False:
                    skipped.append(imported["name"])
    assert set(skipped) == set(declarations()), skipped
