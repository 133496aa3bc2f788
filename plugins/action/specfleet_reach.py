"""specfleet_reach: the first contact of a play with its host, and the host's Python.

`ansible.builtin.setup` with `gather_subset: [python]` answered the one question the roles ask
of a host's facts (which Python runs the helpers: ansible_facts.python.executable), at the
price of a module payload and an interpreter started for it: about a second a host and run,
most of a no-op run's first play. This asks the same through the connection's own exec:

  1. the interpreter, as a module would get it: `ansible_python_interpreter` when set, else
     Ansible's own interpreter discovery (interpreter_python: auto, auto_silent, ...), whose
     result is returned as the `discovered_interpreter_python` fact, so the play's modules
     do not discover it again;
  2. that interpreter's description, in the shape of setup's `python` fact (executable, type,
     version, version_info, has_sslcontext), returned as `ansible_facts.python`.

    - name: Reach the host and find its Python
      specfleet.ascend.specfleet_reach:
      ignore_unreachable: true

A host that cannot be reached is Ansible's unreachable result, as with setup; with
`note_unreachable: true` (the stages play's first contact) it is kept in play instead, and
recorded in the fact specfleet_host_stopped ({why: unreachable, stage: null, error}): later
tasks end the host at once, and validate.yml reports it red and ends it as unreachable there
(when every host is unreachable, Ansible would otherwise end the run before the report).
Runs in --check mode too (it only reads).
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from ansible import constants as C
from ansible.errors import AnsibleActionFail, AnsibleConnectionFailure
from ansible.executor.interpreter_discovery import discover_interpreter
from ansible.module_utils.common.text.converters import to_text
from ansible.plugins.action import ActionBase
from ansible_collections.specfleet.ascend.plugins.plugin_utils.facts import set_facts

# The same description setup's python collector gives (ansible.module_utils.facts.system.python).
DESCRIBE = (
    "import json, ssl, sys, platform; "
    "print(json.dumps({'executable': sys.executable, "
    "'type': platform.python_implementation().lower(), "
    "'version': dict(zip(('major', 'minor', 'micro', 'releaselevel', 'serial'), "
    "sys.version_info)), "
    "'version_info': list(sys.version_info), "
    "'has_sslcontext': hasattr(ssl, 'SSLContext')}))"
)
AUTO = {"", "auto", "auto_silent", "auto_legacy", "auto_legacy_silent"}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        unknown = set(self._task.args) - {"note_unreachable"}
        if unknown:
            raise AnsibleActionFail(
                f"specfleet_reach: unknown option(s) {', '.join(sorted(unknown))}; "
                "expected note_unreachable"
            )
        if not self._task.args.get("note_unreachable", False):
            return self._reach(result, task_vars)
        try:
            return self._reach(result, task_vars)
        except AnsibleConnectionFailure as error:
            said = to_text(error).strip()
            set_facts(
                self,
                {"specfleet_host_stopped": {"why": "unreachable", "stage": None, "error": said}},
            )
            result.update(changed=False, msg=f"unreachable, noted for the report: {said}")
            result["warnings"] = [f"unreachable, kept for the report: {said[:300]}"]
            return result

    def _reach(self, result: dict[str, Any], task_vars: dict[str, Any]) -> dict[str, Any]:
        facts: dict[str, Any] = {}
        interpreter = self._configured_interpreter(task_vars)
        if interpreter is None:
            mode = to_text(
                C.config.get_config_value("INTERPRETER_PYTHON", variables=task_vars) or "auto"
            )
            interpreter = discover_interpreter(
                action=self, interpreter_name="python", discovery_mode=mode, task_vars=task_vars
            )
            facts["discovered_interpreter_python"] = interpreter
        # Unquoted, as a module's shebang line takes it (it may be `/usr/bin/env python3`).
        done = self._low_level_execute_command(f"{interpreter} -c {shlex.quote(DESCRIBE)}")
        stdout = to_text(done.get("stdout", "")).strip()
        if done.get("rc") != 0:
            said = to_text(done.get("stderr", "")).strip() or stdout
            raise AnsibleActionFail(
                f"specfleet_reach: the host's Python {interpreter} did not run "
                f"(exit {done.get('rc')}): {said[-1000:]}"
            )
        try:
            facts["python"] = json.loads(stdout.splitlines()[-1])
        except (ValueError, IndexError) as error:
            raise AnsibleActionFail(
                f"specfleet_reach: {interpreter} did not describe itself ({error}): "
                f"{stdout[:300]!r}"
            ) from error
        result.update(changed=False, ansible_facts=facts)
        return result

    def _configured_interpreter(self, task_vars: dict[str, Any]) -> str | None:
        """ansible_python_interpreter as set for the host (templated), or None to discover."""
        value = task_vars.get("ansible_python_interpreter")
        if value is None:
            return None
        value = to_text(self._templar.template(value)).strip()
        return None if value in AUTO else value
