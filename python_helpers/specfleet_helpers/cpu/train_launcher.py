"""Run the real `speculators.train` (speculators 0.9.0) on a CPU-only host, without torchrun.

Usage::

    python -m specfleet_helpers.cpu.train_launcher <the arguments of python -m speculators.train>

speculators.train assumes an accelerator. This launcher redirects exactly the places that
pick one to "cpu", then calls ``speculators.train.cli.main(TrainConfig.resolve(argv))``, the
same entry point as ``python -m speculators.train``. Checkpoints, logs, resume and metrics
are speculators' own. Patches (names as in speculators 0.9.0):

* ``speculators.train.trainer.get_local_rank`` -> returns "cpu". The trainer keeps it as
  ``self.local_rank`` and only uses it as a ``.to()`` target: the model
  (``self.model.to(self.local_rank)``, single-process path) and every train/val batch.
  Unpatched, ``.to(0)`` means accelerator 0 and fails with "Cannot access accelerator
  device when none is available".
* ``speculators.train.trainer.Trainer.device_type`` -> always "cpu". ``Trainer.__init__``
  sets it to ``acc.type if acc is not None else "cuda"``; it is the device of
  ``torch.autocast`` in the train and validation steps.
* ``torch.accelerator.synchronize`` -> no-op. The trainer's step timer calls it on every
  logged step (step 0 always), and it raises without an accelerator. Only the trainer calls
  it; vLLM's CPU platform applies the same no-op.
* ``speculators.train.checkpointer.get_current_device`` -> returns "cpu". It is the
  ``map_location`` / safetensors device when a run resumes from an existing checkpoint
  under ``--save-path``; speculators' version returns "cuda:0" without an accelerator.

Not patched because it is already safe on CPU: the dataloader only selects a device when
``torch.accelerator.is_available()``, batch recovery falls back to CPU, and the final
``empty_cache`` checks for an accelerator. The torchrun path
(``speculators.train.distributed.maybe_setup_distributed``: ``set_device_index`` and an
accelerator-keyed process-group backend) is not supported: this launcher is one process
and refuses to run when ``LOCAL_RANK`` is set.

Two settings are required on CPU and are checked before anything is loaded (the role
passes them):

* ``--draft-attn-impl sdpa``: the default FlexAttention has no backward on CPU
  ("FlexAttention does not support backward on CPU").
* ``--loss-implementation eager``: the default fused loss is a Triton kernel, and Triton
  has no CPU driver ("0 active drivers").

The launcher refuses to run when an accelerator is present (CUDA, NPU, ...): there, use
``torchrun --standalone --nproc_per_node=N -m speculators.train``.

Output: speculators' own log lines, then one JSON line on stdout:
``{"save_path", "device": "cpu", "speculators_version", "torch_version", "patches",
"elapsed_s"}``. Exit status: 0 trained, 2 bad input (wrong host, bad or CPU-incompatible
arguments; speculators' own argument errors also exit 2), 1 training failed.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from importlib import metadata
from typing import Any, Optional

PROG = "python -m specfleet_helpers.cpu.train_launcher"
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2

# The names the patches replace, as (module, attribute); checked before patching so that a
# speculators release that renamed one fails with a clear message instead of running on
# the accelerator code path.
PATCH_TARGETS: tuple[tuple[str, str], ...] = (
    ("speculators.train.trainer", "get_local_rank"),
    ("speculators.train.trainer", "Trainer"),
    ("speculators.train.checkpointer", "get_current_device"),
    ("torch.accelerator", "synchronize"),
)

PATCHES: tuple[str, ...] = (
    "speculators.train.trainer.get_local_rank -> 'cpu' (model and batch .to() target)",
    "speculators.train.trainer.Trainer.device_type -> 'cpu' (torch.autocast device)",
    "torch.accelerator.synchronize -> no-op (trainer step timer)",
    "speculators.train.checkpointer.get_current_device -> 'cpu' (checkpoint resume)",
)

HELP = f"""usage: {PROG} [SPECULATORS_TRAIN_ARGS ...]

Run `python -m speculators.train` (speculators 0.9.0) on a CPU-only host: the trainer's
accelerator choices are redirected to "cpu", everything else is speculators' own.
Pass exactly the arguments of `python -m speculators.train`; on CPU these are required:
  --draft-attn-impl sdpa          FlexAttention has no backward on CPU
  --loss-implementation eager     the fused loss needs Triton, which has no CPU driver

Refuses to run when an accelerator is present (use torchrun -m speculators.train there)
or when LOCAL_RANK is set (this is one process, not a torchrun worker).

Prints speculators' log, then one JSON line: save_path, device, speculators_version,
torch_version, patches, elapsed_s.
Exit status: 0 trained, 2 bad input (wrong host, bad or CPU-incompatible arguments),
1 training failed.
"""


class BadInput(Exception):
    """The host or the arguments are not fit for CPU training (exit 2)."""


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
        problems.append("--fsdp-shard needs torchrun on accelerators: drop it on CPU")
    return problems


def wants_help(argv: Sequence[str]) -> bool:
    """True when argv asks for help (before any `--` separator)."""
    for arg in argv:
        if arg == "--":
            return False
        if arg in ("-h", "--help"):
            return True
    return False


def check_not_torchrun(environ: Mapping[str, str]) -> None:
    """Refuse to run as a torchrun worker: speculators then takes its accelerator path."""
    if "LOCAL_RANK" in environ:
        raise BadInput(
            "LOCAL_RANK is set: this launcher is a single CPU process; run it without "
            "torchrun (torchrun -m speculators.train is for accelerator hosts)"
        )


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
    """Refuse to run when torch sees an accelerator (torchrun is the way there)."""
    accelerator = torch.accelerator.current_accelerator(check_available=True)
    if accelerator is not None:
        raise BadInput(
            f"an accelerator is present ({accelerator.type}): train with "
            "torchrun --standalone --nproc_per_node=N -m speculators.train, not on CPU"
        )


def apply_cpu_patches(torch: Any) -> list[str]:
    """Redirect speculators.train's accelerator choices to "cpu"; returns what was patched.

    Idempotent. Raises RuntimeError when a patched name is missing (another speculators).
    """
    import importlib

    for module_name, attribute in PATCH_TARGETS:
        module = importlib.import_module(module_name)
        if not hasattr(module, attribute):
            raise RuntimeError(
                f"{module_name}.{attribute} not found: this launcher patches speculators "
                "0.9.0's trainer, check the installed speculators version"
            )
    trainer = importlib.import_module("speculators.train.trainer")
    checkpointer = importlib.import_module("speculators.train.checkpointer")

    def cpu_device() -> str:
        return "cpu"

    def no_synchronize(device: Any = None) -> None:
        return None

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
    print(f"train_launcher: {' '.join(message.split())}", file=sys.stderr)


def run(argv: Sequence[str]) -> dict[str, Any]:
    """Check the host and the arguments, patch, train; returns the result summary."""
    check_not_torchrun(os.environ)
    torch, train_main, train_config = _import_speculators_train()
    check_no_accelerator(torch)
    config = train_config.resolve(list(argv))  # speculators' own errors: SystemExit(2)
    flat = config.flatten()
    problems = cpu_config_problems(flat)
    if problems:
        raise BadInput("; ".join(problems))
    patches = apply_cpu_patches(torch)
    started = time.monotonic()
    train_main(config)
    return {
        "save_path": str(flat.get("save_path")),
        "device": "cpu",
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
    except Exception as exc:
        # The traceback helps whoever reads the log; the last stderr line is the summary.
        traceback.print_exc()
        _error(f"training failed: {type(exc).__name__}: {exc}")
        return EXIT_FAILED
    print(json.dumps(result))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
