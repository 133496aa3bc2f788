"""MOCK of NPU hardware for tests: a stub of ``torch_npu`` (the Ascend adapter of torch).

Like the real one, importing it fails when the CANN toolkit environment was not sourced
(ASCEND_TOOLKIT_HOME unset), so the stub also proves the role sources set_env.sh first.
``torch_npu.npu.get_soc_version()`` (what vllm-ascend's device-type assert reads) returns
MOCK_NPU_SOC_VERSION, e.g. 224 for a 910B4, 251 for an A3 die, 260 for a 950; unset, it
raises as the real call does when no SoC can be read.
"""

from __future__ import annotations

import os

import torch  # the real torch_npu imports torch first

__version__ = "2.10.0.post4"

if not os.environ.get("ASCEND_TOOLKIT_HOME"):
    raise ImportError(
        "libhccl.so: cannot open shared object file: No such file or directory "
        "(mock NPU: the CANN set_env.sh was not sourced)"
    )


def _get_soc_version() -> int:
    soc = os.environ.get("MOCK_NPU_SOC_VERSION", "")
    if not soc:
        raise RuntimeError("mock NPU: MOCK_NPU_SOC_VERSION is not set, no SoC version to report")
    return int(soc)


npu = torch.npu
npu.get_soc_version = _get_soc_version
