"""specfleet_rules: a role's settings rules, checked in order in one task.

The rules are plugins/plugin_utils/rules.py's: each is what one ansible.builtin.assert task
was, `that` and `msg` (naming the variable, the value given and what was expected), with an
optional `when` and `vars`; a group applies its `when` and `vars` to the rules inside it. The
first refusal fails the task with that rule's message. Nothing is templated before its turn.

With `argument_spec` (an entry point of the task's role, such as `main`), the options that
entry point declares in the role's meta/argument_specs.yml are checked first, as
ansible.builtin.validate_argument_spec checks them (each option's variable, templated), plus
one thing it lets through: a list or dict option given as a string (`-e name=a,b`), which the
validator splits but the tasks would not. A problem refuses with one message naming each
variable and what its declaration expects; the rules then may rely on the types.

With `facts` (name: template), once every rule holds, those facts are set for the host as
set_fact sets them, templated with the same variables: what later checks read, without a
set_fact task of their own. With `note`, a line templated last (the facts set) is added to the
task's message, shown with -v: what the check found.

Why one task: a settings check of about 140 assert tasks cost 8 s of every run, no-op runs
included (each task, run or skipped, costs a worker process and its templating).

    - name: "Check the serve settings: types, choices, ranges and cross-field rules"
      specfleet.ascend.specfleet_rules:
        argument_spec: main
        rules:
          - name: specfleet_serve_port in 1..65535
            that: [specfleet_serve_port | int >= 1, specfleet_serve_port | int <= 65535]
            msg: "... is {{ specfleet_serve_port }}, expected a port in 1..65535."
        facts:
          specfleet_planned_serve_port: "{{ specfleet_serve_port | int }}"
"""

from __future__ import annotations

import json
import re
from collections import ChainMap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase
from ansible_collections.specfleet.ascend.plugins.plugin_utils.facts import set_facts
from ansible_collections.specfleet.ascend.plugins.plugin_utils.rules import check_rules

OPTIONS = {"rules", "argument_spec", "facts", "note"}
# Templated by the action, in order, when their turn comes: a rule's only when it is checked,
# the facts and the note only once every rule holds (a lookup in them may need what a rule
# checked, such as a file being there).
LAZY_OPTIONS = {"rules", "facts", "note"}
# libyaml's loader where PyYAML has it: a role's spec file parses in 1 ms instead of 10.
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
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

    @classmethod
    def finalize_task_arg(cls, name: str, value: Any, templar: Any, context: Any) -> Any:
        if name in LAZY_OPTIONS:
            return value
        return super().finalize_task_arg(name, value, templar, context)

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        rules = self._task.args.get("rules")
        unknown = set(self._task.args) - OPTIONS
        if unknown:
            raise AnsibleActionFail(
                f"specfleet_rules: unknown option(s) {', '.join(sorted(unknown))}; "
                f"expected {', '.join(sorted(OPTIONS))}"
            )
        if not isinstance(rules, list):
            raise AnsibleActionFail("specfleet_rules: rules must be a list of rules and groups")
        facts = self._task.args.get("facts") or {}
        if not isinstance(facts, Mapping) or not all(isinstance(name, str) for name in facts):
            raise AnsibleActionFail(
                "specfleet_rules: facts must be a mapping of fact names to values"
            )
        counts = {"rules_checked": 0, "rules_not_applying": 0}
        refusal = None
        variables: Mapping[str, Any] = self._templar.available_variables
        entry_point = self._task.args.get("argument_spec")
        if entry_point is not None:
            refusal, given = self._check_types(entry_point, task_vars or {})
            # The rules read the role's options as already templated for the type check: an
            # option's template is not rendered again for every rule that reads it.
            variables = ChainMap(given, variables)
        if refusal is None:
            refusal = check_rules(self._templar, rules, variables, counts, "rules")
        result.update(counts)
        result["changed"] = False
        if refusal:
            result.update(refusal, failed=True)
            return result
        checked, not_applying = counts["rules_checked"], counts["rules_not_applying"]
        result["msg"] = f"{checked} rules hold ({not_applying} do not apply)"
        if facts:
            templar = self._templar.copy_with_new_env(available_variables=variables)
            values = {name: templar.template(value) for name, value in facts.items()}
            set_facts(self, values)
            result["facts_set"] = sorted(values)
            variables = ChainMap(values, variables)
        note = self._task.args.get("note")
        if note:
            templar = self._templar.copy_with_new_env(available_variables=variables)
            result["msg"] += f": {str(templar.template(note)).strip()}"
        return result

    def _role(self) -> tuple[str, Path]:
        role = self._task._role
        if role is None:
            raise AnsibleActionFail(
                "specfleet_rules: argument_spec names an entry point of the task's role, "
                "and this task is in no role"
            )
        role_path = Path(role._role_path)
        return role_path.name, role_path

    def _check_types(
        self, entry_point: Any, task_vars: Mapping[str, Any]
    ) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """The refusal for the options of `entry_point` in the role's meta/argument_specs.yml
        whose variables are of the wrong type or choice (or None), and the options' values as
        templated for the check."""
        role, role_path = self._role()
        declared = role_path / "meta" / "argument_specs.yml"
        try:
            specs = yaml.load(declared.read_text(), Loader=SAFE_LOADER)["argument_specs"]
            spec = specs[entry_point]["options"]
        except (OSError, KeyError, TypeError, yaml.YAMLError) as error:
            raise AnsibleActionFail(
                f"specfleet_rules: no options of entry point {entry_point!r} in {declared}: {error}"
            ) from error
        given = self._templar.template(
            {name: task_vars[name] for name in spec if name in task_vars}
        )
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
