"""connection_inventory: the hosts' connection variables as Ansible resolved them,
in ansible-inventory's JSON shape, for the artifact suite (roles/validate/tasks/report.yml).

testinfra's ansible backend runs `ansible-inventory --list` to learn how to reach each host:
0.7 s of every run's validation, and what it reads back is the inventory as written, not as
templated. The validate role hands the suite this instead (tests/artifacts/conftest.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

# What testinfra's ansible backend reads of a host (testinfra/utils/ansible_runner.py).
CONNECTION_VARS = (
    "ansible_connection",
    "ansible_host",
    "ansible_port",
    "ansible_user",
    "ansible_become",
    "ansible_become_user",
    "ansible_ssh_common_args",
    "ansible_ssh_extra_args",
    "ansible_ssh_private_key_file",
    "ansible_private_key_file",
    "ansible_python_interpreter",
)
# Never written out: a host reached with a password gets no resolved inventory (None), and
# the suite falls back to ansible-inventory.
PASSWORD_VARS = (
    "ansible_password",
    "ansible_ssh_pass",
    "ansible_become_pass",
    "ansible_become_password",
)


def connection_inventory(hosts: Iterable[str], hostvars: Mapping[str, Any]) -> dict | None:
    """{"all": {"hosts": [...]}, "_meta": {"hostvars": {host: {var: value}}}} for `hosts`,
    or None when one of them has a password variable."""
    names = list(hosts)
    resolved: dict[str, dict[str, Any]] = {}
    for name in names:
        variables = hostvars[name]
        if any(var in variables for var in PASSWORD_VARS):
            return None
        resolved[name] = {var: variables[var] for var in CONNECTION_VARS if var in variables}
    return {"all": {"hosts": names}, "_meta": {"hostvars": resolved}}


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"connection_inventory": connection_inventory}
