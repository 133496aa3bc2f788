"""specfleet_command: one command on the host through the connection itself, no module payload.

ansible.builtin.command ships an AnsiballZ payload and starts an interpreter for it before the
command runs: about 0.4 s a call here, on every run. The helpers the roles call (the host lock,
the probe, the stamps, the report) print JSON and only need their output back, so this runs the
argv as `raw` does (the connection's exec, become applied) and, unlike raw, with quoting, an
environment, a working directory, stdin and the JSON parsed:

    - name: Take the host lock
      specfleet.ascend.specfleet_command:
        argv: ["{{ specfleet_host_python }}", -m, specfleet_helpers.host.session, open, ...]
        env: "{{ specfleet_session.env }}"   # this command only (no task environment:)
        json: true                          # stdout parsed into `json`; unparsable output fails
      register: opened

Returns rc, stdout, stderr (and their _lines), cmd and, with json, json (under the key
`json_as` names too: specfleet_summary, the validate role's last word); a JSON object's
`warnings` (a list of lines) become the task's warnings. Fails on a non-zero
exit, with the end of stderr (or of stdout, when stderr is empty) as its message (failed_when
overrides it); never `changed` (changed_when for a command that changes
something). Skipped in --check mode like the command module, unless the task says
`check_mode: false`. On ssh the command gets no tty, so stdout and stderr stay apart.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.text.converters import to_bytes, to_text
from ansible.plugins.action import ActionBase

OPTIONS = {"argv", "env", "chdir", "stdin", "json", "json_as"}


def shell_command(
    argv: list[Any], env: Mapping[str, Any] | None = None, chdir: str | None = None
) -> str:
    """argv as one POSIX shell command line: quoted, with `env K=V` and `cd DIR &&` before it."""
    command = shlex.join(str(arg) for arg in argv)
    if env:
        command = (
            shlex.join(["env", *(f"{key}={value}" for key, value in env.items())]) + " " + command
        )
    if chdir:
        command = f"cd {shlex.quote(str(chdir))} && {command}"
    return command


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = False
    _supports_async = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        args = self._task.args
        unknown = set(args) - OPTIONS
        if unknown:
            raise AnsibleActionFail(
                f"specfleet_command: unknown option(s) {', '.join(sorted(unknown))}; "
                f"expected {', '.join(sorted(OPTIONS))}"
            )
        argv = args.get("argv")
        if not isinstance(argv, list) or not argv:
            raise AnsibleActionFail("specfleet_command: argv must be a non-empty list")
        env = args.get("env") or {}
        if not isinstance(env, Mapping):
            raise AnsibleActionFail("specfleet_command: env must be a mapping of names to values")
        if self._task.environment and any(self._task.environment):
            raise AnsibleActionFail(
                "specfleet_command: give the command's environment as its env option; "
                "the task's environment keyword does not reach a command run without a module"
            )
        # A tty (ssh's -tt for a command without stdin) would merge stderr into stdout.
        if self._connection.has_option("use_tty"):
            self._connection.set_option("use_tty", False)
        stdin = args.get("stdin")
        command = shell_command(argv, env, args.get("chdir"))
        done = self._low_level_execute_command(
            command, in_data=None if stdin is None else to_bytes(stdin)
        )
        stdout = to_text(done.get("stdout", ""))
        stderr = to_text(done.get("stderr", ""))
        rc = done.get("rc")
        result.update(
            cmd=[str(arg) for arg in argv],
            rc=rc,
            stdout=stdout,
            stderr=stderr,
            stdout_lines=stdout.splitlines(),
            stderr_lines=stderr.splitlines(),
            changed=False,
        )
        if rc != 0:
            said = stderr.strip() or stdout.strip()
            result.update(failed=True, msg=f"non-zero return code {rc}: {said[-2000:]}")
        if args.get("json"):
            try:
                result["json"] = json.loads(stdout) if stdout.strip() else None
            except ValueError as error:
                result["json"] = None
                if rc == 0:
                    result.update(
                        failed=True,
                        msg=f"{argv[0]} printed no JSON ({error}): {stdout.strip()[:500]!r}",
                    )
            if args.get("json_as"):
                result[str(args["json_as"])] = result["json"]
            # A helper's lines for the user (a mode it set again): Ansible shows warnings at
            # every verbosity, where a registered result's fields are seen only with -v.
            said = result["json"].get("warnings") if isinstance(result["json"], dict) else None
            if isinstance(said, list) and said:
                result["warnings"] = [str(line) for line in said]
        return result
