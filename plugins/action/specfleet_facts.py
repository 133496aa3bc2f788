"""specfleet_facts: the facts of a mapping whose names are data, set as set_fact sets them.

set_fact takes its fact names from the task itself. A stage's declared `exposes`
(roles/specfleet/vars/main/stages.yml) names the facts its later stages read; the stage
contract sets them from that one declaration, whether the stage ran (roles/stage/tasks/redo.yml,
with this action) or was up to date (specfleet_stage_decide, in the same task as the decision).

    - name: "Expose: {{ stage_name }}"
      specfleet.ascend.specfleet_facts:
        facts: "{{ stage_declared.exposes | default({}) }}"

Returns `facts`: the names set. Runs in --check mode too (it changes nothing on the host).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible_collections.specfleet.ascend.plugins.plugin_utils.facts import set_facts


class ActionModule(ActionBase):
    _requires_connection = False
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        facts = args.get("facts")
        if set(args) != {"facts"} or not isinstance(facts, Mapping):
            raise AnsibleActionFail(
                "specfleet_facts: expected one option, facts: a mapping of fact names to values"
            )
        bad = [name for name in facts if not isinstance(name, str) or not name.isidentifier()]
        if bad:
            raise AnsibleActionFail(f"specfleet_facts: not a variable name: {bad[0]!r}")
        set_facts(self, facts)
        result.update(changed=False, facts=sorted(facts))
        return result
