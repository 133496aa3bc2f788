"""Load one of the repo's plugins (plugins/callback/<name>.py, plugins/filter/<name>.py) as
Ansible does: a fresh module from its file each time, so what loading does (such as an
environment variable it sets) happens again."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
# The collection link `make setup` makes (scripts/setup-controller): plugins import the
# collection's plugin_utils by their full name, as they do under Ansible.
COLLECTIONS = REPO / ".collections"
if str(COLLECTIONS) not in sys.path:
    sys.path.append(str(COLLECTIONS))


def load_plugin(relative: str) -> ModuleType:
    """The plugin file at `relative` (to the repo), as a fresh module."""
    path = REPO / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_callback(name: str) -> ModuleType:
    return load_plugin(f"plugins/callback/{name}.py")
