"""NPU devices and their memory: which devices the stages use and what they are called where the
stages run, how much HBM a vLLM server may take on them (a plan kept from run to run), and
waiting until a stopped server's memory is free again before the next one starts.

vllm-ascend (``worker.py`` ``_init_device``, v0.23.0) refuses to start when a device's free
memory is below ``total x gpu_memory_utilization``: "Free memory on device ... on startup is
less than desired GPU memory utilization". What follows:

* The devices (``devices``): the stages use the first N of the devices made available
  (specfleet_npu_devices: ``all`` or a list), N = what they need at once (train's ranks, serve's
  servers measured together, else 1: every server is TP 1); the others are only reported. A
  device is named by npu-smi's logical id on the host (its row in `npu-smi info`); where the
  stages run it may be called otherwise (``stage_id``): in a container the CANN runtime numbers
  the devices mounted into it from 0, in ascending order of their ids, and
  ASCEND_RT_VISIBLE_DEVICES takes those numbers ("set ASCEND_RT_VISIBLE_DEVICES:4 error, input
  data rang[0-2)" with two devices mounted); npu-smi inside lists only the devices mounted (under
  their host NPU ids, as far as posted outputs show), so their rows, which npu_smi numbers, are
  0.. as well.
* The utilisation must leave room for what a device holds of its own: the runbook's idle
  910B4 shows 2922 of 32768 MB used, so 0.9 (29491 MB) leaves about 1 %, and 0.92 none.
  ``measure`` derives the utilisation, the context length and the batch from the HBM npu-smi
  reports for the devices used (32 GB parts and 64 GB ones differ: Qwen3-8B's default context
  of 40960 tokens needs about 6.4 GiB of KV cache with the draft, which a 32 GB device at
  0.85 does not have after the weights). What the processes npu-smi lists on a device hold is
  not the device's own: it is a server's, usually the endpoint a ``serve_mode: service`` run
  left serving, whose redeploy takes that memory again.
* The plan is kept (``keep_or_measure``): the stages' settings are fingerprinted inputs, so a
  plan measured afresh on every run would move with every reading (the same idle 910B4 reads
  2871 or 2922 MB, 0.88 or 0.87) and redo the stages after it. The plan an earlier run
  recorded is used again while the devices used and their HBM totals are the same and its
  share still fits beside what each device holds of its own, with KEEP_HEADROOM_MB to spare;
  it is measured again when the hardware or the devices used changed, or it no longer fits.
* A server stopped a moment ago may still hold its memory: ``wait`` polls ``npu-smi info``
  until every device watched has ``total x utilisation`` free, or fails after the timeout
  naming each device still short, its usage and what it needs.

Standard library only (with npu_smi, which parses the output).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable, Optional

from specfleet_helpers.host import npu_smi

POLL_S = 2.0
# Memory a new plan keeps free besides the device's own use, per device (MB): the runtime's own
# growth while the server starts (HCCL buffers, the second process of a DP/TP group) has to fit.
HEADROOM_MB = 1024
# What a kept plan must still leave free beside the device's own use: half the headroom, so the
# drift of an idle device's reading (2871 or 2922 MB on the same 910B4, 51 MB) does not measure
# the plan again, while a device that holds a gigabyte more of its own does.
KEEP_HEADROOM_MB = HEADROOM_MB // 2
# HBM of a "32 GB part" or less (910B4): the context and the batch are cut to fit.
SMALL_HBM_MB = 40 * 1024
RUNTIMES = ("host", "container")


# --- the devices ------------------------------------------------------------------------------


def stage_id(device: int, available: Sequence[int], runtime: str) -> int:
    """What device `device` (npu-smi's logical id on the host) is called where the stages run:
    the same id on the host runtime; in the container runtime its position among the devices
    mounted, which the container numbers from 0 in ascending order of their ids
    (ASCEND_RT_VISIBLE_DEVICES inside it takes those numbers, and npu-smi there lists only
    those devices, so its rows are numbered the same: the module docstring)."""
    if runtime == "host":
        return device
    return sorted(available).index(device)


def devices(
    chips: list[dict[str, Any]], setting: Optional[Sequence[int]], count: int, runtime: str
) -> dict[str, Any]:
    """The devices made available (`setting`: a list of ids, None for every device npu-smi
    lists), those the stages use (the first `count`, at least 1, as the stages see them: the
    list's order on the host runtime, where ASCEND_RT_VISIBLE_DEVICES keeps it; ascending in a
    container), their ids where the stages run, and the ids the setting names that npu-smi does
    not list."""
    if runtime not in RUNTIMES:
        raise ValueError(f"runtime {runtime!r}: expected one of {', '.join(RUNTIMES)}")
    listed = [chip["logic_id"] for chip in chips]
    available = list(listed if setting is None else setting)
    missing = [device for device in available if device not in listed]
    if runtime == "container":
        available.sort()
    used = available[: max(1, min(count, len(available)))] if available else []
    return {
        "available_device_ids": available,
        "used_device_ids": used,
        "stage_device_ids": [stage_id(device, available, runtime) for device in used],
        "missing_device_ids": missing,
    }


# --- the memory plan --------------------------------------------------------------------------


def own_use(chip: dict[str, Any]) -> Optional[int]:
    """HBM the device holds of its own (MB): what npu-smi reports in use, less what the
    processes it lists there hold (npu_smi's process_memory_mb); None without an HBM reading."""
    used = chip.get("hbm_used_mb")
    if not isinstance(used, int):
        return None
    return max(0, used - (chip.get("process_memory_mb") or 0))


def utilization(
    total_mb: int, used_mb: int, wanted: float, headroom_mb: int = HEADROOM_MB
) -> float:
    """The largest share <= `wanted` (two decimals, rounded down) that a device of `total_mb`
    holding `used_mb` of its own can give and still keep `headroom_mb` free."""
    if total_mb <= 0:
        raise ValueError(f"total HBM is {total_mb} MB, expected > 0")
    room = (total_mb - used_mb - headroom_mb) / total_mb
    return max(0.0, min(wanted, math.floor(room * 100) / 100))


def _has_hbm(chip: dict[str, Any]) -> bool:
    return isinstance(chip.get("hbm_total_mb"), int) and chip["hbm_total_mb"] > 0


def _identity(chips: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What a plan was made for: each device used, in order, with its HBM total."""
    return [{"id": chip["logic_id"], "hbm_total_mb": chip.get("hbm_total_mb")} for chip in chips]


def measure(chips: list[dict[str, Any]], wanted: float) -> dict[str, Any]:
    """Memory settings for a vLLM server on the devices used (`chips`, npu_smi.summarize's):
    the share every one of them can give beside what it holds of its own, and the context
    length, batched tokens and sequences for its HBM (None: vLLM's defaults)."""
    measured = [chip for chip in chips if _has_hbm(chip)]
    if not measured:
        raise ValueError("npu-smi reports no HBM for the devices used")
    total = min(chip["hbm_total_mb"] for chip in measured)
    own = [own_use(chip) or 0 for chip in measured]
    share = min(
        utilization(chip["hbm_total_mb"], used, wanted) for chip, used in zip(measured, own)
    )
    small = total <= SMALL_HBM_MB
    return {
        "devices": _identity(chips),
        "hbm_total_mb": total,
        # the most a device used held of its own when the plan was measured
        "own_used_mb": max(own),
        "gpu_memory_utilization": share,
        # 32 GB: Qwen3-8B (16.4 GB) + the draft leave about 6 GiB of KV cache at 0.85; 8192
        # tokens (1.2 GiB with the draft) fits with room for a batch.
        "max_model_len": 8192 if small else None,
        "max_num_batched_tokens": 4096 if small else 8192,
        "max_num_seqs": 128 if small else 256,
    }


def _ids(identity: list[dict[str, Any]]) -> str:
    return ", ".join(str(device.get("id")) for device in identity) or "none"


def misfit(kept: Any, chips: list[dict[str, Any]], wanted: float) -> Optional[str]:
    """Why the plan an earlier run recorded (`kept`) cannot be used on the devices used now
    (`chips`), or None when it can: the same devices with the same HBM totals, and its share
    still fits beside what each one holds of its own with KEEP_HEADROOM_MB to spare."""
    if not isinstance(kept, dict) or not isinstance(kept.get("devices"), list):
        return "no plan recorded yet"
    now = _identity(chips)
    if [d.get("id") for d in kept["devices"]] != [d["id"] for d in now]:
        return f"the devices used changed ({_ids(kept['devices'])} -> {_ids(now)})"
    totals = [
        f"device {d['id']} {k.get('hbm_total_mb')} -> {d['hbm_total_mb']} MB"
        for k, d in zip(kept["devices"], now)
        if k.get("hbm_total_mb") != d["hbm_total_mb"]
    ]
    if totals:
        return f"the HBM changed ({'; '.join(totals)})"
    share = kept.get("gpu_memory_utilization")
    if not isinstance(share, (int, float)):
        return "the recorded plan has no share"
    if share > wanted:
        return f"the recorded share {share:g} is above the {wanted:g} wanted"
    short = []
    for chip in chips:
        own = own_use(chip)
        if not _has_hbm(chip) or own is None:
            continue
        total = chip["hbm_total_mb"]
        spare = total - own - math.ceil(total * share)
        if spare < KEEP_HEADROOM_MB:
            short.append(
                f"device {chip['logic_id']} holds {own} MB of its own, which leaves {spare} MB"
                f" beside {share:g} of its {total} MB, under {KEEP_HEADROOM_MB} MB"
            )
    if short:
        return "the recorded share no longer fits: " + "; ".join(short)
    return None


def keep_or_measure(
    kept: Any, chips: list[dict[str, Any]], wanted: float = 1.0
) -> tuple[Optional[dict[str, Any]], bool, str]:
    """The plan for the devices used (`chips`): `kept` as it was recorded when it still fits
    (misfit), else measured again; with whether it was kept and why. No plan (None) when
    npu-smi reports no HBM for them."""
    why = misfit(kept, chips, wanted)
    if why is None:
        own = [own_use(chip) for chip in chips if _has_hbm(chip)]
        held = max((used for used in own if used is not None), default=0)
        return (
            kept,
            True,
            f"kept the recorded plan: the same devices ({_ids(kept['devices'])}) and HBM, and its"
            f" share {kept['gpu_memory_utilization']:g} still fits beside the {held} MB they hold"
            " of their own",
        )
    try:
        planned = measure(chips, wanted)
    except ValueError as exc:
        return None, False, f"no plan ({why}): {exc}"
    return planned, False, f"measured ({why})"


def _describe(chip: dict[str, Any]) -> str:
    listed = chip.get("process_memory_mb") or 0
    hbm = (
        f"HBM {chip.get('hbm_used_mb')}/{chip.get('hbm_total_mb')} MB"
        if _has_hbm(chip)
        else "no HBM in npu-smi"
    )
    held = f", {listed} MB of it the processes listed" if listed else ""
    return (
        f"device {chip['logic_id']} (NPU {chip.get('npu_id')} chip {chip.get('chip_id')})"
        f" {chip.get('health')} {hbm}{held}"
    )


def plan(
    chips: list[dict[str, Any]],
    setting: Optional[Sequence[int]],
    count: int,
    runtime: str,
    kept: Any = None,
    wanted: float = 1.0,
) -> dict[str, Any]:
    """What npu_env records of the devices: `devices`' choice, the other devices npu-smi lists
    (their health and HBM total: reported, not required), and the memory plan for the devices
    used, kept or measured (`memory`, `memory_kept`, `memory_reason`); `said`: one line per
    device for the run's output."""
    chosen = devices(chips, setting, count, runtime)
    by_id = {chip["logic_id"]: chip for chip in chips}
    used = [by_id[device] for device in chosen["used_device_ids"] if device in by_id]
    others = [chip for chip in chips if chip["logic_id"] not in chosen["used_device_ids"]]
    if chosen["missing_device_ids"]:
        memory, was_kept, reason = None, False, "no plan: devices missing"
    else:
        memory, was_kept, reason = keep_or_measure(kept, used, wanted)
    return {
        **chosen,
        "other_devices": [
            {
                key: chip.get(key)
                for key in ("logic_id", "npu_id", "chip_id", "health", "hbm_total_mb")
            }
            for chip in others
        ],
        "memory": memory,
        "memory_kept": was_kept,
        "memory_reason": reason,
        "said": [f"{_describe(chip)}: used" for chip in used]
        + [f"{_describe(chip)}: not used" for chip in others],
    }


# --- the wait ---------------------------------------------------------------------------------


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
    """The chips of npu_smi's summary, from `npu-smi info` (or saved output in `source`)."""
    try:
        if source:
            text = Path(source).read_text(encoding="utf-8", errors="replace")
        else:
            text = npu_smi.run_npu_smi(("info",), executable=executable)
        return npu_smi.summarize(npu_smi.parse_info(text))["chips"]
    except (npu_smi.NpuSmiRunError, npu_smi.NpuSmiParseError) as exc:
        raise ValueError(str(exc)) from None


# --- command line -----------------------------------------------------------------------------


def parse_devices(text: str) -> Optional[set[int]]:
    listed = parse_device_list(text)
    return None if listed is None else set(listed)


def parse_device_list(text: str) -> Optional[list[int]]:
    """`all` (None) or device ids such as 0,1, in the order given."""
    if text == "all":
        return None
    try:
        return [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--devices {text!r}: expected all or device ids such as 0,1"
        ) from None


def _parse_kept(text: str) -> Any:
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"--kept: not JSON ({exc})") from None


def _plan_chips(args: argparse.Namespace) -> list[dict[str, Any]]:
    if args.summary is None:
        return read_chips(args.npu_smi, args.input)
    text = sys.stdin.read() if args.summary == "-" else Path(args.summary).read_text()
    try:
        return json.loads(text)["chips"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"--summary: not npu_smi's JSON summary ({exc!r})") from None


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specfleet_helpers.host.npu_memory",
        description="NPU devices and memory for vLLM servers: the devices the stages use and "
        "their ids where the stages run, the memory settings their HBM allows (kept from an "
        "earlier run while they still fit), and waiting until a device's memory is free for the "
        "next server.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "plan",
        help="print the devices the stages use and the memory settings for them",
        description="The devices made available, the first --count of them the stages use, "
        "their ids where the stages run (--runtime), the other devices npu-smi lists, and the "
        "memory plan for the devices used: the one --kept names while the devices and their HBM "
        "are the same and its share still fits beside what each holds of its own (the memory of "
        "the processes npu-smi lists there is not the device's own), else measured again.",
    )
    p.add_argument(
        "--devices",
        type=parse_device_list,
        default=None,
        help="the devices made available: all (every device npu-smi lists) or logical ids such "
        "as 4,5 (specfleet_npu_devices; default all)",
    )
    p.add_argument(
        "--count",
        type=int,
        default=1,
        help="how many of them the stages use at once, the first ones (train's ranks, serve's "
        "servers measured together; default 1)",
    )
    p.add_argument(
        "--runtime",
        choices=RUNTIMES,
        default="host",
        help="where the stages run: on the host (its ids), or in a container, which numbers the "
        "devices mounted from 0 (default host)",
    )
    p.add_argument(
        "--kept",
        type=_parse_kept,
        default=None,
        help="the plan an earlier run recorded, as JSON (npu_env.json's npu.memory; empty or "
        "null: none)",
    )
    p.add_argument(
        "--summary",
        help="npu_smi's JSON summary in this file ('-': stdin) instead of running npu-smi",
    )
    p.add_argument("--input", help="saved `npu-smi info` output instead of running npu-smi")
    p.add_argument(
        "--utilization",
        type=float,
        default=1.0,
        help="the largest share wanted (default 1.0: what the devices can give)",
    )
    w = sub.add_parser("wait", help="wait until the devices have total x utilisation free")
    w.add_argument("--utilization", type=float, required=True, help="the server's share")
    w.add_argument(
        "--devices",
        type=parse_devices,
        default=None,
        help="device ids as npu-smi lists them where the wait runs (in a container: the "
        "container's, from 0); all: every device",
    )
    w.add_argument("--timeout", type=float, required=True, help="seconds to wait at most")
    for sp in (p, w):
        sp.add_argument("--npu-smi", default="npu-smi", help="npu-smi program (default: on PATH)")
    args = parser.parse_args(argv)
    try:
        if args.command == "plan":
            out = plan(
                _plan_chips(args),
                args.devices,
                args.count,
                args.runtime,
                kept=args.kept,
                wanted=args.utilization,
            )
        else:
            out = wait(
                args.utilization, args.devices, args.timeout, lambda: read_chips(args.npu_smi)
            )
    except (ValueError, OSError) as exc:
        print(f"npu_memory {args.command}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
