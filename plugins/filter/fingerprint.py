"""fingerprint: a stage's inputs hashed as its stamp hashes them (plugin_utils/fingerprint.py).

{{ specfleet_stages.train.inputs | specfleet.ascend.fingerprint(leave_out=['output'], length=12) }}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

from ansible.errors import AnsibleFilterError
from ansible_collections.specfleet.ascend.plugins.plugin_utils.fingerprint import (
    fingerprint as _fingerprint,
)


def fingerprint(inputs: Any, leave_out: Any = (), length: Optional[int] = None) -> str:
    """The stamps' fingerprint of `inputs` without `leave_out`, its first `length` digits."""
    if not isinstance(inputs, Mapping):
        raise AnsibleFilterError(
            f"fingerprint: expected a mapping of inputs, got {type(inputs).__name__}"
        )
    digest = _fingerprint(inputs, leave_out or ())
    return digest[: int(length)] if length else digest


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"fingerprint": fingerprint}
