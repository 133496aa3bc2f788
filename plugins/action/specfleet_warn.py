"""specfleet_warn: say a warning the way Ansible says its own, and go on.

An ansible.builtin.debug message is an ok result, which the console callback shows only with
-v; a warning shows at every verbosity, in every callback. For what a user must read although
nothing failed, such as hardware the image is not documented for:

    - name: Warn of a part the image is not built for
      specfleet.ascend.specfleet_warn:
        msg: "Ascend 950PR: the -a5 image is built for 950DT ..."
      when: specfleet_env.npu.variant == '950PR'

Returns msg; never changed; runs in --check mode (it changes nothing on the host).
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    _requires_connection = False
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        msg = args.get("msg")
        if set(args) != {"msg"} or not isinstance(msg, str) or not msg.strip():
            raise AnsibleActionFail("specfleet_warn: expected one option, msg: the warning's text")
        result.update(changed=False, msg=msg, warnings=[msg])
        return result
