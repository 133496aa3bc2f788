"""A controller file a stage declares among its inputs (roles/specfleet/vars/main/stages.yml):
data's `input_sha256`, the checksum of data_input_file, which decides the stage's fingerprint
and goes to the host only when the stage runs.

file_sha256: the sha256 of the file's bytes, read in the controller's Ansible process (where
the stage's inputs are templated: the plan, the decision), in chunks; a file already hashed
with the same size and mtime in this process is not read again.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from ansible.errors import AnsibleFilterError

_KEPT: dict[tuple[str, int, int], str] = {}
CHUNK = 1 << 20


def file_sha256(path: Any) -> str:
    """The sha256 of the controller file `path` (~ and environment variables expanded)."""
    name = os.path.expandvars(os.path.expanduser(str(path)))
    try:
        info = os.stat(name)
        key = (os.path.realpath(name), info.st_size, info.st_mtime_ns)
        if key not in _KEPT:
            digest = hashlib.sha256()
            with open(name, "rb") as handle:
                for chunk in iter(lambda: handle.read(CHUNK), b""):
                    digest.update(chunk)
            _KEPT[key] = digest.hexdigest()
    except OSError as exc:
        raise AnsibleFilterError(
            f"file_sha256: cannot read {name} on the controller: {exc}"
        ) from exc
    return _KEPT[key]


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"file_sha256": file_sha256}
