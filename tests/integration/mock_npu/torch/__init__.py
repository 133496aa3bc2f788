"""MOCK of NPU hardware for tests: a stub of ``torch`` as the vllm-ascend image has it.

Only what specfleet's stack check touches: ``__version__`` and ``torch.npu`` with
``is_available()`` / ``device_count()``. The number of NPUs comes from MOCK_NPU_COUNT
(default 8; 0 means no NPU is visible). Not a real torch: nothing else is here.
"""

from __future__ import annotations

import os
import types

__version__ = "2.10.0+cpu"


def _mock_npu_count() -> int:
    return int(os.environ.get("MOCK_NPU_COUNT", "8"))


def _is_available() -> bool:
    return _mock_npu_count() > 0


def _device_count() -> int:
    return max(_mock_npu_count(), 0)


npu = types.SimpleNamespace(is_available=_is_available, device_count=_device_count)
