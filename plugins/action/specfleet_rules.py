"""specfleet_rules: rules checked in order in one task (npu_env's checks of what it found on the
host: Python and CPU flags, free disk and ports, the job's network).

The rules are plugins/plugin_utils/rules.py's: each is what one ansible.builtin.assert task
was, `that` and `msg` (naming the variable, the value given and what was expected), with an
optional `when` and `vars`; a group applies its `when` and `vars` to the rules inside it. The
first refusal fails the task with that rule's message. Nothing is templated before its turn.

With `facts` (name: template), once every rule holds, those facts are set for the host as
set_fact sets them, templated with the same variables: what later checks read, without a
set_fact task of their own. With `note`, a line templated last (the facts set) is added to the
task's message, shown with -v: what the check found; with `show: true` the note is shown at
every verbosity too, as a plan line (plugins/callback/progress.py prints specfleet_plan).

Why one task: a check of many assert tasks costs a worker process and its templating per
task, on every run, no-op runs included. The settings check before any host work is
plugins/action/specfleet_settings.py, which checks each role's meta/rules.yml the same way.

    - name: Check the host's free disk
      specfleet.ascend.specfleet_rules:
        rules:
          - name: the work root's disk has room
            that: _free_gb | float >= _needed_gb | float
            msg: "... {{ _free_gb }} GB free, expected at least {{ _needed_gb }}."
        facts:
          specfleet_free_gb: "{{ _free_gb }}"
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible_collections.specfleet.ascend.plugins.plugin_utils.compiled_once import compiled_once
from ansible_collections.specfleet.ascend.plugins.plugin_utils.facts import set_facts
from ansible_collections.specfleet.ascend.plugins.plugin_utils.rules import check_rules

OPTIONS = {"rules", "facts", "note", "show"}
# Templated by the action, in order, when their turn comes: a rule's only when it is checked,
# the facts and the note only once every rule holds (a lookup in them may need what a rule
# checked, such as a file being there).
LAZY_OPTIONS = {"rules", "facts", "note", "show"}


class ActionModule(ActionBase):
    _requires_connection = False
    _supports_check_mode = True
    _supports_async = False

    @classmethod
    def finalize_task_arg(cls, name: str, value: Any, templar: Any, context: Any) -> Any:
        if name in LAZY_OPTIONS:
            return value
        return super().finalize_task_arg(name, value, templar, context)

    @compiled_once()
    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        rules = self._task.args.get("rules", [])
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
        variables: Mapping[str, Any] = self._templar.available_variables
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
            said = str(templar.template(note)).strip()
            result["msg"] += f": {said}"
            if self._task.args.get("show", False):
                result["specfleet_plan"] = said
        return result
