"""Rules checked in order, each what one ansible.builtin.assert task was: the settings checks
(plugins/action/specfleet_rules.py) and a stage's preconditions
(plugins/action/specfleet_stage_decide.py) share them.

A rule is `that` (one condition or a list, all must hold) and `msg` (the refusal, naming the
variable, the value given and what was expected), with an optional `when` and `vars`. A group
({name, when, vars, rules}) applies its `when` and `vars` to the rules inside it. The first
refusal ends the check with that rule's message, so a rule may rely on the ones before it.
Nothing is templated before its turn: a rule's `msg` only when it refuses, its `vars` only
when it is read.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleActionFail

RULE_KEYS = {"name", "that", "msg", "when", "vars"}
GROUP_KEYS = {"name", "when", "vars", "rules"}


def conditions(value: Any, where: str) -> list[Any]:
    """A rule's `that` or `when` as a list of conditions."""
    if value is None:
        return []
    if isinstance(value, (str, bool)):
        return [value]
    if isinstance(value, list) and all(isinstance(item, (str, bool)) for item in value):
        return list(value)
    raise AnsibleActionFail(
        f"{where}: expected a condition or a list of conditions, got {type(value).__name__}"
    )


def check_rules(
    templar: Any,
    rules: Any,
    variables: Mapping[str, Any],
    counts: dict[str, int],
    where: str = "rules",
) -> dict[str, Any] | None:
    """The first refusal among `rules` ({msg, rule, assertion}), or None when all hold.
    `counts` gains rules_checked and rules_not_applying."""
    if not isinstance(rules, list):
        raise AnsibleActionFail(f"{where} must be a list of rules and groups")
    counts.setdefault("rules_checked", 0)
    counts.setdefault("rules_not_applying", 0)
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
        scoped = templar.copy_with_new_env(available_variables=scope)
        if not all(
            scoped.evaluate_conditional(c) for c in conditions(rule.get("when"), f"{name}: when")
        ):
            counts["rules_not_applying"] += 1
            continue
        if is_group:
            refusal = check_rules(scoped, rule["rules"], scope, counts, f"{where}[{index}].rules")
            if refusal:
                return refusal
            continue
        counts["rules_checked"] += 1
        for condition in conditions(rule["that"], f"{name}: that"):
            if not scoped.evaluate_conditional(condition):
                return {
                    "msg": str(scoped.template(rule["msg"])).strip(),
                    "rule": name,
                    "assertion": condition,
                }
    return None
