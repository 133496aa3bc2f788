"""A role's variables as its own tasks see them, for work that runs outside the role.

The settings check (plugins/action/specfleet_settings.py) checks every stage role's settings
before any role has run, the plan (specfleet_stage_plan.py) decides every stage before its role
is included, and the setting lookup reads another role's setting: each role's defaults and vars
are read from its files here and put under what the task sees (inventory, extra vars, the
play's vars and facts), which is the order Ansible gives them, but for role vars, which no
setting is meant to override (they hold the role's derived `_<role>_*` names).

Files are read as Ansible reads a role's (defaults/main.yml or the files of defaults/main/,
the same for vars/), through the task's loader, with their templates trusted: they are the
project's own files.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleActionFail

# The collection's roles (a checkout is the collection: galaxy.yml).
ROLES = Path(__file__).resolve().parents[2] / "roles"
YAML_SUFFIXES = (".yml", ".yaml")


def role_path(role: str) -> Path:
    path = ROLES / role
    if not path.is_dir():
        raise AnsibleActionFail(f"no role {role!r} in {ROLES}")
    return path


def _files(directory: Path) -> list[Path]:
    """main.yml, or every YAML file of main/ in name order (Ansible's order)."""
    for suffix in YAML_SUFFIXES:
        if (directory / f"main{suffix}").is_file():
            return [directory / f"main{suffix}"]
    nested = directory / "main"
    if nested.is_dir():
        return sorted(p for p in nested.iterdir() if p.suffix in YAML_SUFFIXES)
    return []


def load_yaml(loader: Any, path: Path) -> Any:
    return loader.load_from_file(str(path), trusted_as_template=True)


def _variables(loader: Any, directory: Path) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for path in _files(directory):
        data = load_yaml(loader, path) or {}
        if not isinstance(data, Mapping):
            raise AnsibleActionFail(f"{path}: expected a mapping of variables")
        merged.update(data)
    return merged


def role_scope(loader: Any, role: str, seen: Mapping[str, Any]) -> ChainMap:
    """What a task of `role` sees: `seen` (the task's variables), then the role's vars, then
    its defaults, with `role_path` set to the role's directory."""
    path = role_path(role)
    return ChainMap(
        {"role_path": str(path), "role_name": role},
        seen,
        _variables(loader, path / "vars"),
        _variables(loader, path / "defaults"),
    )
