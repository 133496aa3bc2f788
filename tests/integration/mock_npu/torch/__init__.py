"""MOCK of NPU hardware for tests: a stub of ``torch`` as the vllm-ascend image has it.

Only what specfleet's stack check touches: ``__version__`` and ``torch.npu`` with
``is_available()`` / ``device_count()``. The host has MOCK_NPU_COUNT NPUs (default 8; 0 means
none is visible). Like the real runtime, ASCEND_RT_VISIBLE_DEVICES (a comma list of device
ids) narrows what torch sees to the listed ids that exist on the host, so a test can tell
whether the role exported it. Not a real torch: nothing else is here.
"""

from __future__ import annotations

import os
import types

__version__ = "2.10.0+cpu"


def _mock_npu_count() -> int:
    host = max(int(os.environ.get("MOCK_NPU_COUNT", "8")), 0)
    visible = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
    if visible is None:
        return host
    ids = {int(part) for part in visible.split(",") if part.strip()}
    return len([i for i in ids if 0 <= i < host])


def _is_available() -> bool:
    return _mock_npu_count() > 0


def _device_count() -> int:
    return _mock_npu_count()


npu = types.SimpleNamespace(is_available=_is_available, device_count=_device_count)
