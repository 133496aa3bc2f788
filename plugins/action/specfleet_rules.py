"""specfleet_rules: a role's settings rules, checked in order in one task.

Each rule is what one ansible.builtin.assert task was: `that` (one condition or a list, all
must hold) and `msg` (the refusal, naming the variable, the value given and what was
expected), with an optional `when` and `vars`. A group ({name, when, vars, rules}) applies its
`when` and `vars` to the rules inside it. The first refusal fails the task with that rule's
message, so a rule may rely on the ones before it (a range check on a value already known to be
a number). Nothing is templated before its turn: a rule's `msg` only when it refuses, its
`vars` only when it is read.

Why one task: a settings check of about 140 assert tasks cost 8 s of every run, no-op runs
included (each task, run or skipped, costs a worker process and its templating).

    - name: Check the serve settings' ranges and cross-field rules
      specfleet_rules:
        subject: serve settings
        rules:
          - name: specfleet_serve_port in 1..65535
            that: [specfleet_serve_port | int >= 1, specfleet_serve_port | int <= 65535]
            msg: "... is {{ specfleet_serve_port }}, expected a port in 1..65535."
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

RULE_KEYS = {"name", "that", "msg", "when", "vars"}
GROUP_KEYS = {"name", "when", "vars", "rules"}


def _conditions(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, (str, bool)):
        return [value]
    if isinstance(value, list) and all(isinstance(item, (str, bool)) for item in value):
        return list(value)
    raise AnsibleActionFail(
        f"{where}: expected a condition or a list of conditions, got {type(value).__name__}"
    )


class ActionModule(ActionBase):
    _requires_connection = False
    _supports_check_mode = True
    _supports_async = False

    @classmethod
    def finalize_task_arg(cls, name: str, value: Any, templar: Any, context: Any) -> Any:
        # The rules are templated one by one, in order, when their turn comes.
        if name == "rules":
            return value
        return super().finalize_task_arg(name, value, templar, context)

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        rules = self._task.args.get("rules")
        unknown = set(self._task.args) - {"rules"}
        if unknown:
            raise AnsibleActionFail(
                f"specfleet_rules: unknown option(s) {', '.join(sorted(unknown))}; expected rules"
            )
        if not isinstance(rules, list):
            raise AnsibleActionFail("specfleet_rules: rules must be a list of rules and groups")
        counts = {"rules_checked": 0, "rules_not_applying": 0}
        refusal = self._check(rules, self._templar.available_variables, counts, "rules")
        result.update(counts)
        result["changed"] = False
        if refusal:
            result.update(refusal, failed=True)
        else:
            checked, not_applying = counts["rules_checked"], counts["rules_not_applying"]
            result["msg"] = f"{checked} rules hold ({not_applying} do not apply)"
        return result

    def _check(
        self, rules: list[Any], variables: Mapping[str, Any], counts: dict[str, int], where: str
    ) -> dict[str, Any] | None:
        for index, rule in enumerate(rules):
            if not isinstance(rule, Mapping):
                raise AnsibleActionFail(
                    f"{where}[{index}]: expected a mapping, got {type(rule).__name__}"
                )
            is_group = "rules" in rule
            name = rule.get("name", f"{where}[{index}]")
            allowed = GROUP_KEYS if is_group else RULE_KEYS
            extra = set(rule) - allowed
            if extra or (not is_group and ("that" not in rule or "msg" not in rule)):
                raise AnsibleActionFail(
                    f"{where}[{index}] ({name}): a rule has name, that, msg (when, vars optional); "
                    f"a group has rules (name, when, vars optional); got {', '.join(sorted(rule))}"
                )
            rule_vars = rule.get("vars") or {}
            if not isinstance(rule_vars, Mapping):
                raise AnsibleActionFail(f"{where}[{index}] ({name}): vars must be a mapping")
            scope = ChainMap(dict(rule_vars), variables) if rule_vars else variables
            templar = self._templar.copy_with_new_env(available_variables=scope)
            if not all(
                templar.evaluate_conditional(c)
                for c in _conditions(rule.get("when"), f"{name}: when")
            ):
                counts["rules_not_applying"] += 1
                continue
            if is_group:
                refusal = self._check(rule["rules"], scope, counts, f"{where}[{index}].rules")
                if refusal:
                    return refusal
                continue
            counts["rules_checked"] += 1
            for condition in _conditions(rule["that"], f"{name}: that"):
                if not templar.evaluate_conditional(condition):
                    return {
                        "msg": str(templar.template(rule["msg"])).strip(),
                        "rule": name,
                        "assertion": condition,
                    }
        return None
