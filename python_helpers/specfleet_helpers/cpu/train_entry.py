"""The train stage's entry module on CPU hosts: the real `speculators.train` (speculators 0.9.0)
as torchrun ranks over gloo.

Usage: the NPU command line, with this module where NPU hosts name ``speculators.train``::

    python -m torch.distributed.run --standalone --nproc_per_node=N \\
        -m specfleet_helpers.cpu.train_entry <the arguments of python -m speculators.train>

Multi-host jobs pass ``--nnodes/--rdzv-*`` to torchrun exactly as on NPU. Started without
torchrun (no ``LOCAL_RANK``), it trains as one process, as ``python -m speculators.train`` does:
that is speculators' own single-process path, kept for running it by hand.

speculators.train assumes an accelerator. This shim redirects exactly the places that pick
one, then calls ``speculators.train.cli.main(TrainConfig.resolve(argv))``, the entry point of
``python -m speculators.train``. Checkpoints, logs, resume, DDP and metrics are speculators'
own. Patches (names as in speculators 0.9.0):

* ``speculators.train.distributed.maybe_setup_distributed`` (and its copy that
  ``speculators.train.cli`` imported) -> the same setup with ``init_process_group("gloo")``,
  whose collectives wait ``SPECFLEET_GLOO_TIMEOUT_S`` seconds (default 1800) for a peer: the
  bound on how long a job across hosts hangs on a lost host.
  Upstream calls ``torch.accelerator.set_device_index(LOCAL_RANK)``, raises "No accelerator
  found" without one, and picks the backend with ``get_default_backend_for_device`` (HCCL on
  NPU). Everything else is upstream's: ranks and world size from the process group, the
  sequence- and data-parallel groups (``_init_sp_process_groups``), the same log line.
* ``speculators.train.trainer.get_local_rank`` -> "cpu". The trainer keeps it as
  ``self.local_rank`` and only uses it as a ``.to()`` target (the model, every batch);
  ``.to(0)`` would mean accelerator 0.
* ``speculators.train.trainer.Trainer.device_type`` -> always "cpu": the device of
  ``torch.autocast`` in the train and validation steps (upstream falls back to "cuda").
* ``torch.accelerator.synchronize`` -> no-op: the trainer's step timer calls it, and it raises
  without an accelerator (vLLM's CPU platform applies the same no-op).
* ``speculators.train.checkpointer.get_current_device`` -> "cpu": the ``map_location`` when a
  run resumes from a checkpoint under ``--save-path`` (upstream: "cuda:0").

DDP needs nothing else: with the model on the CPU, ``DistributedDataParallel(model)`` reduces
gradients over gloo. Two settings are required on CPU and are checked before anything is
loaded (the role passes them):

* ``--draft-attn-impl sdpa``: the default FlexAttention has no backward on CPU.
* ``--loss-implementation eager``: the default fused loss is a Triton kernel, and Triton has no
  CPU driver.

The shim refuses to run where torch sees an accelerator (CUDA, NPU, ...): there, torchrun runs
``-m speculators.train`` itself. For a job across hosts, gloo takes its interface from
``GLOO_SOCKET_IFNAME`` (the stage script sets it).

Output: speculators' own log lines, then on every rank one JSON line on stdout:
``{"save_path", "device": "cpu", "backend", "rank", "local_rank", "world_size",
"speculators_version", "torch_version", "patches", "elapsed_s"}``. Exit status (of each rank;
torchrun exits 1 when any rank fails): 0 trained, 2 bad input (wrong host, bad or
CPU-incompatible arguments; speculators' own argument errors also exit 2), 1 training failed or
was interrupted (speculators saves ``<save>/interrupted`` on SIGINT/SIGTERM and returns as if
done: that is reported as a failure here).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from importlib import metadata
from typing import Any, Optional

PROG = "python -m specfleet_helpers.cpu.train_entry"
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
BACKEND = "gloo"
# Seconds a gloo collective (and the process group's start) waits for a peer before it fails:
# how long a job across hosts can hang on a lost host. torch's default is 30 minutes.
TIMEOUT_ENV = "SPECFLEET_GLOO_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 1800

# The names the patches replace, as (module, attribute); checked before patching so that a
# speculators release that renamed one fails with a clear message instead of running on the
# accelerator code path.
PATCH_TARGETS: tuple[tuple[str, str], ...] = (
    ("speculators.train.distributed", "maybe_setup_distributed"),
    ("speculators.train.distributed", "_init_sp_process_groups"),
    ("speculators.train.cli", "maybe_setup_distributed"),
    ("speculators.train.trainer", "get_local_rank"),
    ("speculators.train.trainer", "Trainer"),
    ("speculators.train.checkpointer", "get_current_device"),
    ("torch.accelerator", "synchronize"),
)

PATCHES: tuple[str, ...] = (
    "speculators.train.distributed.maybe_setup_distributed -> init_process_group('gloo')"
    " (also where speculators.train.cli imported it)",
    "speculators.train.trainer.get_local_rank -> 'cpu' (model and batch .to() target)",
    "speculators.train.trainer.Trainer.device_type -> 'cpu' (torch.autocast device)",
    "torch.accelerator.synchronize -> no-op (trainer step timer)",
    "speculators.train.checkpointer.get_current_device -> 'cpu' (checkpoint resume)",
)

HELP = f"""usage: python -m torch.distributed.run [TORCHRUN_ARGS ...]
           -m specfleet_helpers.cpu.train_entry [SPECULATORS_TRAIN_ARGS ...]
       {PROG} [SPECULATORS_TRAIN_ARGS ...]   (one process, without torchrun)

Run `speculators.train` (speculators 0.9.0) on a CPU-only host, as torchrun ranks over gloo:
the trainer's accelerator choices are redirected to "cpu" and its distributed setup to gloo;
everything else is speculators' own. Pass exactly the arguments of `python -m speculators.train`;
on CPU these are required:
  --draft-attn-impl sdpa          FlexAttention has no backward on CPU
  --loss-implementation eager     the fused loss needs Triton, which has no CPU driver

Refuses to run when an accelerator is present (torchrun -m speculators.train there).
Across hosts, GLOO_SOCKET_IFNAME names the interface gloo uses.

Prints speculators' log, then one JSON line per rank: save_path, device, backend, rank,
local_rank, world_size, speculators_version, torch_version, patches, elapsed_s.
Exit status: 0 trained, 2 bad input (wrong host, bad or CPU-incompatible arguments),
1 training failed.
"""


class BadInput(Exception):
    """The host or the arguments are not fit for CPU training (exit 2)."""


class Interrupted(Exception):
    """speculators caught SIGINT/SIGTERM, saved its `interrupted` checkpoint, returned (exit 1)."""


def interrupted_checkpoint(save_path: str, since: float) -> Optional[str]:
    """speculators' graceful-shutdown checkpoint (<save>/interrupted) if this run wrote it."""
    path = os.path.join(save_path, "interrupted")
    try:
        return path if os.stat(path).st_mtime >= since - 1 else None
    except OSError:
        return None


def cpu_config_problems(config: Mapping[str, Any]) -> list[str]:
    """What in a resolved (flattened) speculators TrainConfig cannot run on CPU.

    ``config`` is ``TrainConfig.flatten()``: keys ``speculator_type``, ``draft_attn_impl``,
    ``loss_implementation``, ``fsdp_shard``. Returns one message per problem, naming the
    value to pass instead; empty when the configuration can train on CPU.
    """
    problems: list[str] = []
    speculator_type = config.get("speculator_type")
    attn = config.get("draft_attn_impl")
    if speculator_type == "mtp":
        problems.append(
            "speculator type mtp cannot train on CPU: its draft attention is fixed to "
            "FlexAttention, which has no backward on CPU"
        )
    elif attn == "simple_flex_attention":
        problems.append(
            "--draft-attn-impl is simple_flex_attention (speculators' default), which has no "
            "backward on CPU: pass --draft-attn-impl sdpa"
        )
    if config.get("loss_implementation") == "fused":
        problems.append(
            "--loss-implementation is fused (speculators' default), a Triton kernel with no CPU "
            "driver: pass --loss-implementation eager"
        )
    if config.get("fsdp_shard"):
        problems.append("--fsdp-shard shards over accelerators: drop it on CPU (DDP, the default)")
    return problems


def wants_help(argv: Sequence[str]) -> bool:
    """True when argv asks for help (before any `--` separator)."""
    for arg in argv:
        if arg == "--":
            return False
        if arg in ("-h", "--help"):
            return True
    return False


def _import_speculators_train() -> tuple[Any, Any, Any]:
    """Import torch and speculators' training entry points, or explain what is missing."""
    try:
        import torch
        from speculators.train.cli import main as train_main
        from speculators.train.config import TrainConfig
    except ImportError as exc:
        raise BadInput(
            f"expected torch and speculators (0.9.0) in this Python ({sys.executable}): {exc}"
        ) from exc
    return torch, train_main, TrainConfig


def check_no_accelerator(torch: Any) -> None:
    """Refuse to run when torch sees an accelerator (speculators.train runs there itself)."""
    accelerator = torch.accelerator.current_accelerator(check_available=True)
    if accelerator is not None:
        raise BadInput(
            f"an accelerator is present ({accelerator.type}): train with "
            "torchrun -m speculators.train there, not this CPU shim"
        )


def gloo_setup_distributed(distributed: Any, environ: Mapping[str, str]) -> Any:
    """speculators' ``maybe_setup_distributed`` for CPU ranks: upstream's, with gloo.

    ``distributed`` is the module ``speculators.train.distributed``, whose state this sets as
    upstream does: nothing without ``LOCAL_RANK`` (one process), else the process group, the
    rank, the world size and the sequence/data-parallel groups.
    """

    def maybe_setup_distributed(sp_size: int = 1) -> None:
        from datetime import timedelta

        import torch.distributed as dist

        distributed._local_rank = int(environ.get("LOCAL_RANK", "0"))
        distributed._is_distributed = "LOCAL_RANK" in environ
        if not distributed._is_distributed:
            return
        timeout = timedelta(seconds=float(environ.get(TIMEOUT_ENV) or DEFAULT_TIMEOUT_S))
        dist.init_process_group(BACKEND, timeout=timeout)
        distributed._rank = dist.get_rank()
        distributed._world_size = dist.get_world_size()
        distributed._init_sp_process_groups(distributed._rank, distributed._world_size, sp_size)
        distributed.logger.info(
            f"Started distributed with local_rank={distributed._local_rank}, "
            f"dp_size={distributed._dp_size}, sp_size={distributed._sp_size} "
            f"(backend {BACKEND}, rank {distributed._rank} of {distributed._world_size})",
            extra={"override_rank0_filter": True},
        )

    return maybe_setup_distributed


def apply_cpu_patches(torch: Any, environ: Optional[Mapping[str, str]] = None) -> list[str]:
    """Redirect speculators.train's accelerator choices to "cpu" and its distributed setup to
    gloo; returns what was patched. Idempotent. Raises RuntimeError when a patched name is
    missing (another speculators)."""
    for module_name, attribute in PATCH_TARGETS:
        module = importlib.import_module(module_name)
        if not hasattr(module, attribute):
            raise RuntimeError(
                f"{module_name}.{attribute} not found: this shim patches speculators "
                "0.9.0's trainer, check the installed speculators version"
            )
    distributed = importlib.import_module("speculators.train.distributed")
    cli = importlib.import_module("speculators.train.cli")
    trainer = importlib.import_module("speculators.train.trainer")
    checkpointer = importlib.import_module("speculators.train.checkpointer")

    def cpu_device() -> str:
        return "cpu"

    def no_synchronize(device: Any = None) -> None:
        return None

    setup = gloo_setup_distributed(distributed, os.environ if environ is None else environ)
    # cli imported the name: it is patched where it is called as well as where it lives.
    distributed.maybe_setup_distributed = setup
    cli.maybe_setup_distributed = setup
    trainer.get_local_rank = cpu_device
    # A data descriptor on the class wins over the instance assignment in __init__.
    trainer.Trainer.device_type = property(
        lambda self: "cpu", lambda self, value: None, doc="autocast device: always cpu"
    )
    torch.accelerator.synchronize = no_synchronize
    checkpointer.get_current_device = cpu_device
    return list(PATCHES)


def _version(distribution: str) -> Optional[str]:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _error(message: str) -> None:
    rank = os.environ.get("RANK")
    who = "train_entry" if rank is None else f"train_entry (rank {rank})"
    print(f"{who}: {' '.join(message.split())}", file=sys.stderr)


def run(argv: Sequence[str]) -> dict[str, Any]:
    """Check the host and the arguments, patch, train; returns this rank's summary."""
    torch, train_main, train_config = _import_speculators_train()
    check_no_accelerator(torch)
    config = train_config.resolve(list(argv))  # speculators' own errors: SystemExit(2)
    flat = config.flatten()
    problems = cpu_config_problems(flat)
    if problems:
        raise BadInput("; ".join(problems))
    patches = apply_cpu_patches(torch)
    distributed = importlib.import_module("speculators.train.distributed")
    started = time.monotonic()
    wall_started = time.time()
    train_main(config)
    interrupted = interrupted_checkpoint(str(flat.get("save_path")), wall_started)
    if interrupted:
        # speculators returns normally after its graceful-shutdown save: without this, an
        # interrupted run would look trained to whoever reads the exit status.
        raise Interrupted(
            f"training was interrupted; speculators saved {interrupted} (its next run resumes "
            "from the last whole epoch)"
        )
    # speculators destroys the process group at the end: its state is back to one process,
    # so the job's shape is read from torchrun's environment.
    return {
        "save_path": str(flat.get("save_path")),
        "device": "cpu",
        "backend": BACKEND if "LOCAL_RANK" in os.environ else None,
        "rank": int(os.environ.get("RANK", distributed.get_rank())),
        "local_rank": int(os.environ.get("LOCAL_RANK", 0)),
        "world_size": int(os.environ.get("WORLD_SIZE", 1)),
        "speculators_version": _version("speculators"),
        "torch_version": str(torch.__version__),
        "patches": patches,
        "elapsed_s": round(time.monotonic() - started, 3),
    }


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if wants_help(args):
        sys.stdout.write(HELP)
        sys.stdout.flush()
        try:
            _, _, train_config = _import_speculators_train()
        except BadInput as exc:
            _error(str(exc))
            return EXIT_OK
        sys.stdout.write("\nOptions of python -m speculators.train:\n")
        sys.stdout.flush()
        train_config.resolve(["--help"])  # prints speculators' help, exits 0
        return EXIT_OK
    try:
        result = run(args)
    except BadInput as exc:
        _error(str(exc))
        return EXIT_BAD_INPUT
    except Interrupted as exc:
        _error(str(exc))
        return EXIT_FAILED
    except Exception as exc:
        # The traceback helps whoever reads the log; the last stderr line is the summary.
        traceback.print_exc()
        _error(f"training failed: {type(exc).__name__}: {exc}")
        return EXIT_FAILED
    print(json.dumps(result), flush=True)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
