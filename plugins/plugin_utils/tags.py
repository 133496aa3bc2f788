"""Whether --tags / --skip-tags let a stage run: one rule for the settings check (which roles it
checks), the plan (which stages it decides) and the session (which stamps it verifies ahead)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def selected(tags: list[str], task_vars: Mapping[str, Any]) -> bool:
    """Whether --tags / --skip-tags let a task tagged `tags` run: Ansible's rules
    (ansible.playbook.taggable.Taggable.evaluate_tags) for a task with tags."""
    tagged = set(tags)
    only = set(task_vars.get("ansible_run_tags") or ["all"])
    skip = set(task_vars.get("ansible_skip_tags") or [])
    run = (
        "always" in tagged
        or ("all" in only and "never" not in tagged)
        or not tagged.isdisjoint(only)
        or ("tagged" in only and "never" not in tagged)
    )
    if run and skip:
        if "all" in skip:
            run = "always" in tagged and "always" not in skip
        elif not tagged.isdisjoint(skip) or "tagged" in skip:
            run = False
    return run
