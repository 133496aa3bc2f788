"""specfleet_settings: every setting of every stage role, checked in one task before any host work.

The stages play's first task after reaching the host (playbooks/stages.yml). In order:

1. the names: a variable given from the inventory or with -e under the project's prefixes that
   no role's meta/argument_specs.yml declares is refused with the closest declared name
   (plugin_utils/setting_names.py), as the fleet-wide role's (specfleet) refusal;
2. then each stage role, in pipeline order (the `roles` option: specfleet_stages' keys), with
   the role's defaults and vars under the host's variables (plugin_utils/role_scope.py):
   - its options' types and choices, from its meta/argument_specs.yml `main` entry point, with
     Ansible's own validator (what ansible.builtin.validate_argument_spec runs), plus one thing
     it lets through: a list or dict option given as a string (`-e name=a,b`);
   - then its meta/rules.yml: what a spec cannot state (ranges, cross-field rules, files on
     the controller), rules checked as plugin_utils/rules.py checks them; the file's `vars`
     are in scope for both checks; its `facts` (what later roles' rules read, e.g. the
     verifier's shape the models source tells before any model exists) join the scope of the
     roles after it, never the host's facts; its `note` is added to the task's message.

The limits are stated there once: a spec where Ansible can say it, the role's rules.yml where
it cannot. A role that --tags / --skip-tags leave out is not checked (its tag is its name;
`tags` names more, e.g. npu_env is `always`). Runs in --check mode too.

The first refusal is the host's: it names the variable, the value given and what was expected,
and is recorded as the role's failure (specfleet_host_stopped: {why: refused, stage, error},
specfleet_failed_stage), which every later play and the report read. The task itself does not
fail: a run whose every host is refused still reaches its report, which fails them
(playbooks/validate.yml).

    - name: Check every setting before any host work
      specfleet.ascend.specfleet_settings:
        roles: "{{ specfleet_stages.keys() | list }}"
        tags: {npu_env: [npu_env, always]}
        names: true    # false: leave the names out (a test harness's own -e variables)
"""

from __future__ import annotations

import json
import re
from collections import ChainMap
from collections.abc import Mapping, Sequence
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase
from ansible_collections.specfleet.ascend.plugins.plugin_utils.compiled_once import compiled_once
from ansible_collections.specfleet.ascend.plugins.plugin_utils.facts import set_facts
from ansible_collections.specfleet.ascend.plugins.plugin_utils.role_scope import (
    ROLES,
    load_yaml,
    role_path,
    role_scope,
)
from ansible_collections.specfleet.ascend.plugins.plugin_utils.rules import check_rules
from ansible_collections.specfleet.ascend.plugins.plugin_utils.setting_names import (
    declared_settings,
    refusal,
    unknown_settings,
)
from ansible_collections.specfleet.ascend.plugins.plugin_utils.tags import selected

WHO = "specfleet_settings"
OPTIONS = {"roles", "tags", "names"}
RULES_KEYS = {"vars", "rules", "facts", "note"}
STRUCTURED = ("list", "dict")


def structured_options(spec: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The options declared as list or dict: a string given for one (-e name=a,b) is accepted
    by the validator (a comma-separated list) but not by the tasks."""
    return [name for name, option in spec.items() if option.get("type", "str") in STRUCTURED]


def spec_problems(
    errors: Sequence[str], spec: Mapping[str, Mapping[str, Any]], given: Mapping[str, Any]
) -> list[str]:
    """The validator's error messages, plus one for each list or dict option of `given`
    (name -> value) that is a string."""
    problems = [str(error) for error in errors]
    for name in structured_options(spec):
        value = given.get(name)
        if isinstance(value, str):
            kind = spec[name]["type"]
            problems.append(
                f"{name} is the string {json.dumps(value)}, not a {kind} "
                f"(give it as JSON or YAML, e.g. -e '{{\"{name}\": ...}}')"
            )
    return problems


def _expected(name: str, option: Mapping[str, Any]) -> str:
    text = f"{name}: {option.get('type', 'str')}"
    if "elements" in option:
        text += f" of {option['elements']}"
    if "options" in option:
        text += " with keys " + ", ".join(option["options"])
    if "choices" in option:
        text += ", one of " + ", ".join(str(c) for c in option["choices"])
    description = option.get("description", "")
    if isinstance(description, list):
        description = " ".join(description)
    return f"{text} ({re.sub(r'[.]$', '', str(description).strip())})"


def spec_message(problems: Sequence[str], spec: Mapping[str, Mapping[str, Any]], role: str) -> str:
    """The refusal for `problems`: each problem, then what each option named in them expects,
    and where that is declared."""
    named = [
        _expected(name, option)
        for name, option in spec.items()
        if any(re.search(rf"\b{re.escape(name)}\b", problem) for problem in problems)
    ]
    expected = "".join(f"{item}; " for item in named)
    return (
        f"{role} settings: {'; '.join(problems)}. Expected {expected}"
        f"see roles/{role}/meta/argument_specs.yml."
    )


class ActionModule(ActionBase):
    _requires_connection = False
    _supports_check_mode = True
    _supports_async = False

    @compiled_once()
    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        roles, tags = self._options()
        result["changed"] = False
        found = self._unknown_names(task_vars) if self._task.args.get("names", True) else None
        if found is not None:
            return self._refused(result, "specfleet", found)
        planned: dict[str, Any] = {}
        checked: dict[str, str] = {}
        notes: list[str] = []
        for role in roles:
            if not selected(tags.get(role, [role]), task_vars):
                checked[role] = "not selected (--tags/--skip-tags)"
                continue
            declared = self._rules_of(role)
            scope = ChainMap(
                dict(declared.get("vars") or {}),
                role_scope(self._loader, role, ChainMap(planned, task_vars)),
            )
            problem, given = self._check_types(role, scope)
            if problem is not None:
                return self._refused(result, role, problem, checked)
            scope = ChainMap(given, scope)
            counts: dict[str, int] = {}
            problem = check_rules(
                self._templar, declared.get("rules") or [], scope, counts, f"{role} rules"
            )
            if problem is not None:
                return self._refused(result, role, problem, checked)
            templar = self._templar.copy_with_new_env(available_variables=scope)
            facts = {
                name: templar.template(value)
                for name, value in (declared.get("facts") or {}).items()
            }
            planned.update(facts)
            held, idle = counts["rules_checked"], counts["rules_not_applying"]
            checked[role] = f"{held} rules hold ({idle} do not apply)"
            if declared.get("note"):
                scoped = templar.copy_with_new_env(available_variables=ChainMap(facts, scope))
                notes.append(f"{role}: {str(scoped.template(declared['note'])).strip()}")
        result["checked"] = checked
        result["msg"] = "; ".join([f"{role}: {what}" for role, what in checked.items()] + notes)
        return result

    def _options(self) -> tuple[list[str], dict[str, list[str]]]:
        args = dict(self._task.args)
        unknown = set(args) - OPTIONS
        if unknown:
            raise AnsibleActionFail(
                f"{WHO}: unknown option(s) {', '.join(sorted(unknown))}; "
                "expected roles, tags, names"
            )
        roles = args.get("roles")
        if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
            raise AnsibleActionFail(f"{WHO}: roles must be a list of role names")
        tags = args.get("tags") or {}
        if not isinstance(tags, Mapping):
            raise AnsibleActionFail(f"{WHO}: tags must map a role to its tags")
        return roles, {str(k): [str(t) for t in v] for k, v in tags.items()}

    def _refused(
        self,
        result: dict[str, Any],
        role: str,
        problem: Mapping[str, Any],
        checked: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """The host's refusal, recorded as `role`'s failure for the later plays and the report."""
        error = str(problem["msg"]).strip()
        set_facts(
            self,
            {
                "specfleet_host_stopped": {"why": "refused", "stage": role, "error": error},
                "specfleet_failed_stage": role,
            },
        )
        result.update(problem)
        result.update(refused=role, checked=dict(checked or {}), msg=f"refused ({role}): {error}")
        return result

    def _unknown_names(self, task_vars: Mapping[str, Any]) -> dict[str, Any] | None:
        """The refusal of the names given that no role declares, or None. The inventory's view
        of the host, without a play: inventory files and vars plugins, and extra vars; the
        facts are this run's, not settings."""
        manager = self._task.get_variable_manager()
        host = manager._inventory.get_host(task_vars.get("inventory_hostname"))
        extra = set(manager.extra_vars)
        try:
            cached = manager._fact_cache.get(host.name) or {}
        except KeyError:  # nothing cached for the host yet
            cached = {}
        facts = set(cached) | set(manager._nonpersistent_fact_cache.get(host.name) or {})
        given = set(manager.get_vars(host=host, include_hostvars=False)) - (facts - extra)
        declared = declared_settings(ROLES)
        unknown = unknown_settings(given, declared)
        if not unknown:
            return None
        where = {n: "extra vars" if n in extra else "the inventory" for n in unknown}
        return {"msg": refusal(where, declared), "unknown": unknown}

    def _check_types(
        self, role: str, scope: Mapping[str, Any]
    ) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """The refusal for the options of the role's `main` entry point whose variables are of
        the wrong type or choice (or None), and the options' values as templated for the check
        (the rules read those: an option's template is not rendered again for each rule)."""
        declared = role_path(role) / "meta" / "argument_specs.yml"
        try:
            spec = load_yaml(self._loader, declared)["argument_specs"]["main"]["options"]
        except (KeyError, TypeError) as error:
            raise AnsibleActionFail(
                f"{WHO}: no options of entry point 'main' in {declared}: {error}"
            ) from error
        templar = self._templar.copy_with_new_env(available_variables=scope)
        given = templar.template({name: scope[name] for name in spec if name in scope})
        errors = (
            ArgumentSpecValidator(spec)
            .validate(dict(given), validate_role_argument_spec=True)
            .error_messages
        )
        problems = spec_problems(errors, spec, given)
        if not problems:
            return None, dict(given)
        return {
            "msg": spec_message(problems, spec, role),
            "rule": f"the {role} settings' types and choices (meta/argument_specs.yml)",
            "argument_errors": problems,
        }, dict(given)

    def _rules_of(self, role: str) -> Mapping[str, Any]:
        """The role's meta/rules.yml ({vars, rules, facts, note}), {} when it has none."""
        path = role_path(role) / "meta" / "rules.yml"
        if not path.is_file():
            return {}
        declared = load_yaml(self._loader, path) or {}
        if not isinstance(declared, Mapping) or set(declared) - RULES_KEYS:
            raise AnsibleActionFail(
                f"{WHO}: {path} must be a mapping of {', '.join(sorted(RULES_KEYS))}"
            )
        return declared
