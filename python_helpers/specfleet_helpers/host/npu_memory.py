"""NPU device memory: how much of it a vLLM server may take on this host, and waiting until a
stopped server's memory is free again before the next one starts.

vllm-ascend (``worker.py`` ``_init_device``, v0.23.0) refuses to start when a device's free
memory is below ``total x gpu_memory_utilization``: "Free memory on device ... on startup is
less than desired GPU memory utilization". Two things follow.

* The utilisation must leave room for what an idle device already holds: the runbook's idle
  910B4 shows 2922 of 32768 MB used, so 0.9 (29491 MB) leaves about 1 % headroom, and 0.92
  none. ``plan`` derives the utilisation, the context length and the batch per host from the
  HBM npu-smi reports (32 GB parts and 64 GB ones differ: Qwen3-8B's default context of 40960
  tokens needs about 6.4 GiB of KV cache with the draft, which a 32 GB device at 0.85 does not
  have after the weights).
* A server stopped a moment ago may still hold its memory: ``wait`` polls ``npu-smi info``
  until every device watched has ``total x utilisation`` free, or fails after the timeout
  naming each device still short, its usage and what it needs.

Standard library only (npu_smi, run as a process, parses the output; its summary carries
``plan``'s figures).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any, Callable, Optional

POLL_S = 2.0
# Memory kept free besides the idle usage, per device (MB): the runtime's own growth while the
# server starts (HCCL buffers, the second process of a DP/TP group) has to fit.
HEADROOM_MB = 1024
# HBM of a "32 GB part" or less (910B4): the context and the batch are cut to fit.
SMALL_HBM_MB = 40 * 1024


def utilization(total_mb: int, idle_used_mb: int, wanted: float) -> float:
    """The largest share <= `wanted` (two decimals, rounded down) that an idle device of
    `total_mb` with `idle_used_mb` in use can give and still keep HEADROOM_MB free."""
    if total_mb <= 0:
        raise ValueError(f"total HBM is {total_mb} MB, expected > 0")
    room = (total_mb - idle_used_mb - HEADROOM_MB) / total_mb
    return max(0.0, min(wanted, math.floor(room * 100) / 100))


def plan(chips: list[dict[str, Any]], wanted: float) -> dict[str, Any]:
    """Memory settings for a vLLM server on a host whose `chips` (npu_smi.summarize's) are idle:
    the utilisation every chip can give, and the context length, batched tokens and sequences
    for its HBM (None: vLLM's defaults)."""
    measured = [
        c for c in chips if isinstance(c.get("hbm_total_mb"), int) and c["hbm_total_mb"] > 0
    ]
    if not measured:
        raise ValueError("npu-smi reports no HBM for any device")
    total = min(c["hbm_total_mb"] for c in measured)
    share = min(utilization(c["hbm_total_mb"], c.get("hbm_used_mb") or 0, wanted) for c in measured)
    small = total <= SMALL_HBM_MB
    return {
        "hbm_total_mb": total,
        "idle_used_mb": max(c.get("hbm_used_mb") or 0 for c in measured),
        "gpu_memory_utilization": share,
        # 32 GB: Qwen3-8B (16.4 GB) + the draft leave about 6 GiB of KV cache at 0.85; 8192
        # tokens (1.2 GiB with the draft) fits with room for a batch.
        "max_model_len": 8192 if small else None,
        "max_num_batched_tokens": 4096 if small else 8192,
        "max_num_seqs": 128 if small else 256,
    }


def shortfalls(chips: list[dict[str, Any]], share: float, devices: Optional[set[int]]) -> list[str]:
    """The watched devices without `share` of their HBM free, one sentence each."""
    short = []
    for chip in chips:
        if devices is not None and chip["logic_id"] not in devices:
            continue
        total, used = chip.get("hbm_total_mb"), chip.get("hbm_used_mb")
        if not isinstance(total, int) or not isinstance(used, int):
            continue
        needed = math.ceil(total * share)
        if total - used < needed:
            short.append(
                f"device {chip['logic_id']} (NPU {chip['npu_id']} chip {chip['chip_id']}):"
                f" {used} of {total} MB used, {total - used} MB free, {needed} MB needed"
            )
    return short


def wait(
    share: float,
    devices: Optional[set[int]],
    timeout_s: float,
    read: Callable[[], list[dict[str, Any]]],
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """Poll until every watched device has `share` of its HBM free; ValueError after
    `timeout_s` naming the devices still short."""
    start = clock()
    while True:
        short = shortfalls(read(), share, devices)
        if not short:
            return {"free": True, "waited_s": round(clock() - start, 1)}
        if clock() - start >= timeout_s:
            raise ValueError(
                f"device memory not free after {timeout_s:g} s for gpu_memory_utilization"
                f" {share:g}: "
                + "; ".join(short)
                + " (a server of an earlier stage or another process still holds it:"
                " npu-smi info lists the processes)"
            )
        sleep(POLL_S)


def read_chips(executable: str = "npu-smi", source: Optional[str] = None) -> list[dict[str, Any]]:
    """The chips of npu_smi's summary, from `npu-smi info` (or saved output). Run as its own
    process: npu_smi's summary carries plan(), so this module does not import it."""
    argv = [sys.executable, "-m", "specfleet_helpers.host.npu_smi", "--npu-smi", executable]
    done = subprocess.run(
        argv + (["--input", source] if source else []),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        raise ValueError(done.stderr.strip() or f"npu_smi exited {done.returncode}")
    return json.loads(done.stdout)["chips"]


def parse_devices(text: str) -> Optional[set[int]]:
    if text == "all":
        return None
    try:
        return {int(item) for item in text.split(",") if item.strip()}
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--devices {text!r}: expected all or device ids such as 0,1"
        ) from None


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specfleet_helpers.host.npu_memory",
        description="NPU memory for vLLM servers: the settings a host's HBM allows, and waiting "
        "until a device's memory is free for the next server.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="print the memory settings for this host's idle devices")
    p.add_argument("--utilization", type=float, required=True, help="the share wanted, e.g. 0.9")
    p.add_argument("--input", help="saved `npu-smi info` output instead of running npu-smi")
    w = sub.add_parser("wait", help="wait until the devices have total x utilisation free")
    w.add_argument("--utilization", type=float, required=True, help="the server's share")
    w.add_argument(
        "--devices", type=parse_devices, default=None, help="logical device ids (all: every device)"
    )
    w.add_argument("--timeout", type=float, required=True, help="seconds to wait at most")
    for sp in (p, w):
        sp.add_argument("--npu-smi", default="npu-smi", help="npu-smi program (default: on PATH)")
    args = parser.parse_args(argv)
    try:
        if args.command == "plan":
            out = plan(read_chips(args.npu_smi, args.input), args.utilization)
        else:
            out = wait(
                args.utilization, args.devices, args.timeout, lambda: read_chips(args.npu_smi)
            )
    except (ValueError, OSError, subprocess.SubprocessError) as exc:
        print(f"npu_memory {args.command}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
