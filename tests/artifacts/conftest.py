"""Shared fixtures of the artifact suite: where the work root is and how to read stamps.

The suite runs against any inventory:
    pytest tests/artifacts --hosts='ansible://all' --ansible-inventory=inventory/fleet.yml
The work root comes from SPECFLEET_ROOTS (a JSON object {host: root}, which the validate
role passes), else SPECFLEET_ROOT, else the host's `specfleet_root` inventory variable, else
the fleet default /var/lib/specfleet. How to reach each host comes from ansible-inventory,
or, when the validate role runs the suite, from SPECFLEET_INVENTORY_JSON: the connection
variables as Ansible resolved them (plugins/filter/inventory.py), which spares the
suite its own ansible-inventory run.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

DEFAULT_ROOT = "/var/lib/specfleet"


def pytest_configure(config: pytest.Config) -> None:
    resolved = os.environ.get("SPECFLEET_INVENTORY_JSON")
    if resolved:
        from testinfra.utils import ansible_runner

        inventory = json.loads(resolved)
        ansible_runner.get_ansible_inventory = lambda _config, _inventory_file: inventory


@pytest.fixture(scope="module")
def root(host) -> str:
    roots = json.loads(os.environ.get("SPECFLEET_ROOTS") or "{}")
    if host.backend.get_hostname() in roots:
        return roots[host.backend.get_hostname()]
    if os.environ.get("SPECFLEET_ROOT"):
        return os.environ["SPECFLEET_ROOT"]
    try:
        value = host.ansible.get_variables().get("specfleet_root")
    except Exception:  # not an ansible:// backend
        value = None
    if value and "{{" not in str(value):
        return str(value)
    return DEFAULT_ROOT


# What the suite has read, by host and path: the stamps are read by nearly every test, and
# each read is a round trip to the host (over ssh on a fleet). Nothing in the suite writes.
_READ: dict[tuple[str, str], dict[str, Any]] = {}


def read_json(host, path: str) -> dict[str, Any]:
    key = (host.backend.get_hostname(), path)
    if key not in _READ:
        result = host.run("cat -- %s", path)
        assert result.rc == 0, (
            f"{path} is missing or unreadable on {host.backend.get_hostname()}: "
            f"{result.stderr.strip()}"
        )
        try:
            _READ[key] = json.loads(result.stdout)
        except ValueError as exc:
            raise AssertionError(
                f"{path} is not valid JSON: {exc}; starts with {result.stdout[:200]!r}"
            ) from exc
    return _READ[key]


@pytest.fixture(scope="module")
def npu_env_state(host, root) -> dict[str, Any]:
    return read_json(host, f"{root}/state/npu_env.json")


@pytest.fixture(scope="module")
def stamp(host, root):
    def load(stage: str) -> dict[str, Any]:
        return read_json(host, f"{root}/state/{stage}.json")

    return load
