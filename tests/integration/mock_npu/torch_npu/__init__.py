"""MOCK of NPU hardware for tests: a stub of ``torch_npu`` (the Ascend adapter of torch).

Like the real one, importing it fails when the CANN toolkit environment was not sourced
(ASCEND_TOOLKIT_HOME unset), so the stub also proves the role sources set_env.sh first.
"""

from __future__ import annotations

import os

import torch  # noqa: F401  (the real torch_npu imports torch first)

__version__ = "2.10.0.post4"

if not os.environ.get("ASCEND_TOOLKIT_HOME"):
    raise ImportError(
        "libhccl.so: cannot open shared object file: No such file or directory "
        "(mock NPU: the CANN set_env.sh was not sourced)"
    )
