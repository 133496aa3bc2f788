"""The one recipe for a stage's fingerprint: sha256 of its inputs as JSON with sorted keys.

The stamps hold it (specfleet_stage_decide compares it), and train names its checkpoint
directory after it (the `fingerprint` filter, inputs but where the host publishes its draft):
written once, so the two never drift apart. The value is what Jinja's `inputs |
to_json(sort_keys=true) | hash('sha256')` gives, which the stamps of earlier runs were made with.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ansible.plugins.filter.core import get_hash, to_json


def fingerprint(inputs: Mapping[str, Any], leave_out: Iterable[str] = ()) -> str:
    """sha256 (64 hex digits) of `inputs` but the names in `leave_out`."""
    left_out = set(leave_out)
    kept = {name: value for name, value in inputs.items() if name not in left_out}
    return get_hash(to_json(kept, sort_keys=True), "sha256")
