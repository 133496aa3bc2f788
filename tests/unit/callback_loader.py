"""Load one of the repo's callback plugins (callback_plugins/<name>.py) as Ansible does: a
fresh module from its file each time, so what loading does (such as an environment variable
it sets) happens again."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

PLUGINS = Path(__file__).resolve().parents[2] / "callback_plugins"


def load_callback(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, PLUGINS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
