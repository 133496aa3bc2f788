"""specfleet_unreachable: end the host as unreachable, in Ansible's own terms.

The first contact of a play (specfleet_reach, ignore_unreachable) keeps an unreachable host in
play so that the report can name it; the validate role's gate then ends it with this, whose
result is Ansible's unreachable result: the recap, AWX and anything reading the playbook's
stats count the host as unreachable (not failed), and ansible-playbook's exit status says so.

    - name: End the host as unreachable
      specfleet.ascend.specfleet_unreachable:
        msg: "a2-node01 is not green: unreachable: ssh: connect to host ... timed out"
"""

from __future__ import annotations

from typing import Any

from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    _requires_connection = False
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        result.update(unreachable=True, changed=False, msg=str(self._task.args.get("msg", "")))
        return result
