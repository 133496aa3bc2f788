"""A template file rendered as ansible.builtin.template's lookup renders it, without the
lookup's deep copy of every variable of the task (plugins/lookup/template.py, and the stage
scripts of plugins/action/specfleet_stage_decide.py)."""

from __future__ import annotations

import os
from collections import ChainMap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ansible.template import trust_as_template

# roles/stage/templates of this collection (a checkout is the collection).
SHARED_TEMPLATES = Path(__file__).resolve().parents[2] / "roles" / "stage" / "templates"


def render_file(templar: Any, loader: Any, path: str, variables: Mapping[str, Any]) -> str:
    """The file at `path` rendered over `variables` (a ChainMap with an empty top: the
    template's own writes go there); includes are looked up beside it first, then in the
    play's search path, as the builtin lookup looks them up, then in roles/stage/templates."""
    text = loader.get_text_file_contents(path)
    searchpath = [os.path.dirname(path)]
    for place in variables.get("ansible_search_path") or []:
        searchpath += [os.path.join(place, "templates"), place]
    # The stage scripts' shared parts (the vLLM launcher), whichever role's task renders them.
    searchpath.append(str(SHARED_TEMPLATES))
    scoped = templar.copy_with_new_env(
        available_variables=ChainMap({}, variables), searchpath=searchpath
    )
    return str(scoped.template(trust_as_template(text), escape_backslashes=False))
