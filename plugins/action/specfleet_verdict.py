"""specfleet_verdict: end a host with the fleet report's verdict on it, in Ansible's own terms.

The report's writer (specfleet_helpers.report.fleet_report) gives each host a verdict
(`gate_verdict`): {unreachable: true, msg}, {fail: msg}, or {} for a host that passes. The
validate role's gate applies it in one task per host:

    - name: End the hosts that are not green
      specfleet.ascend.specfleet_verdict:
        verdict: "{{ _validate_written.json.verdicts[inventory_hostname] | default({}) }}"
        also_fail: "{{ the host lock's release error, or '' }}"

An unreachable host (kept in play by the first contact, specfleet_reach note_unreachable, so
that the report names it) gets Ansible's unreachable result: the recap, AWX and anything
reading the playbook's stats count it unreachable, not failed, and ansible-playbook's exit
status says so. A failed one fails with the message; `also_fail` (a lock that could not be
released) fails a host the report found green too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

OPTIONS = {"verdict", "also_fail"}


class ActionModule(ActionBase):
    _requires_connection = False
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        unknown = set(self._task.args) - OPTIONS
        verdict = self._task.args.get("verdict") or {}
        if unknown or not isinstance(verdict, Mapping):
            raise AnsibleActionFail(
                f"specfleet_verdict: expected verdict (a mapping) and also_fail, got "
                f"{sorted(self._task.args)}"
            )
        result["changed"] = False
        if verdict.get("unreachable"):
            result.update(unreachable=True, msg=str(verdict.get("msg", "")))
            return result
        said = [str(m) for m in (verdict.get("fail"), self._task.args.get("also_fail")) if m]
        if said:
            result.update(failed=True, msg="\n".join(said))
            return result
        result["msg"] = "green, or nothing to fail it for (stages skipped or stale)"
        return result
