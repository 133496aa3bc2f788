"""Facts an action sets for its host as ansible.builtin.set_fact sets them: the play's facts,
above role and play vars (not a module's ansible_facts, below them), without a set_fact task
of their own after the action (plugins/action/specfleet_stage_decide.py, _stage_upstream.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible.plugins.action import ActionBase, VariableLayer


def set_facts(action: ActionBase, facts: Mapping[str, Any]) -> None:
    """Set `facts` for the action's host, as set_fact (not cacheable) sets them."""
    action.register_host_variables({}, VariableLayer.CACHEABLE_FACT)
    action.register_host_variables(dict(facts), VariableLayer.EPHEMERAL_FACT)
