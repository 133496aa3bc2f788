"""The project's settings by name: which names under its prefixes it declares, and a refusal
for the ones it does not (a misspelled setting would otherwise be silently ignored).

Every setting is an option of some role's meta/argument_specs.yml. A variable given from the
inventory or with -e whose name starts with one of PREFIXES and that no spec declares is a
typo, or a setting of another version: refused, with the closest declared name.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from pathlib import Path

import yaml

# The project's variable namespaces: its own, and each role's (the stage roles, the session
# and the report).
PREFIXES = (
    "specfleet_",
    "npu_env_",
    "speculators_install_",
    "models_",
    "convert_",
    "data_",
    "hidden_states_",
    "train_",
    "serve_",
    "session_",
    "validate_",
    "stage_",
)
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def declared_settings(roles_dir: Path) -> set[str]:
    """Every option of every entry point of every role's meta/argument_specs.yml, and of the
    internal entry points (meta/entry_points.yml, the same format)."""
    names: set[str] = set()
    for spec_file in sorted(roles_dir.glob("*/meta/argument_specs.yml")) + sorted(
        roles_dir.glob("*/meta/entry_points.yml")
    ):
        specs = yaml.load(spec_file.read_text(), Loader=SAFE_LOADER) or {}
        entries = specs.get("argument_specs") or specs.get("entry_points") or {}
        for entry in entries.values():
            names.update((entry or {}).get("options") or {})
    return names


def unknown_settings(given: Iterable[str], declared: set[str]) -> list[str]:
    """The names of `given` under the project's prefixes that no spec declares, sorted."""
    return sorted(name for name in set(given) if name.startswith(PREFIXES) and name not in declared)


def refusal(unknown: Mapping[str, str], declared: set[str]) -> str:
    """One message for the unknown names ({name: where it was given}), each with the closest
    declared name when there is one."""
    parts = []
    for name, where in sorted(unknown.items()):
        close = difflib.get_close_matches(name, sorted(declared), n=1, cutoff=0.75)
        hint = f"did you mean {close[0]}?" if close else "no setting has a name like it"
        parts.append(f"{name} (from {where}): {hint}")
    noun = "setting" if len(parts) == 1 else "settings"
    return (
        f"unknown {noun}: {'; '.join(parts)} (every setting is declared in a role's "
        "meta/argument_specs.yml; the roles' README.md list them)"
    )
