"""HCCL's host ports, kept out of the kernel's ephemeral range before a job binds them.

HCCL listens on HCCL_IF_BASE_PORT and the ports after it (CANN 8.5 to 9.1 document 32 ports
from the default 60000; older CANN 16), on every host whose ranks set up a communicator, one
host or several. Those ports lie inside Linux's default ephemeral range (32768-60999): any
outgoing connection of the host may be given one as its source port, and the rank that binds
it next fails ("host nic listen start failed, port[60000]") at random. CANN's
HCCL_IF_BASE_PORT page asks for them to be reserved:

    sysctl -w net.ipv4.ip_local_reserved_ports=60000-60031

``reserve`` does that when it is needed (the ports overlap the ephemeral range and are not all
reserved yet), adding the range to what is reserved already (ip_local_reserved_ports is one
list: other reservations are kept), and writes the same value to a sysctl.d file so that a
reboot keeps it. Both are per network namespace: the stage container shares the host's, so
this runs on the host. Prints one JSON line: {range, ephemeral, reserved_before, changed,
why}. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional

PROC = Path("/proc/sys/net/ipv4")
KEY = "net.ipv4.ip_local_reserved_ports"


def parse_ranges(text: str) -> list[tuple[int, int]]:
    """ip_local_reserved_ports' syntax: "8080,60000-60015" -> [(8080, 8080), (60000, 60015)]."""
    ranges = []
    for item in text.replace("\n", ",").split(","):
        item = item.strip()
        if not item:
            continue
        low, _, high = item.partition("-")
        ranges.append((int(low), int(high or low)))
    return ranges


def format_ranges(ranges: list[tuple[int, int]]) -> str:
    """Merged and sorted, in the kernel's syntax ("" for none)."""
    merged: list[list[int]] = []
    for low, high in sorted(ranges):
        if merged and low <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], high)
        else:
            merged.append([low, high])
    return ",".join(str(low) if low == high else f"{low}-{high}" for low, high in merged)


def needed(
    base: int, count: int, ephemeral: tuple[int, int], reserved: list[tuple[int, int]]
) -> list[int]:
    """The ports of [base, base + count) that the kernel may hand out as source ports: inside
    the ephemeral range and not reserved."""
    low, high = ephemeral
    return [
        port
        for port in range(base, base + count)
        if low <= port <= high and not any(a <= port <= b for a, b in reserved)
    ]


def reserve(
    base: int, count: int, proc: Path = PROC, persist: Optional[Path] = None, check: bool = False
) -> dict[str, object]:
    """Reserve [base, base + count) where needed; what was found and done."""
    low, high = (int(v) for v in (proc / "ip_local_port_range").read_text().split())
    before = (proc / "ip_local_reserved_ports").read_text().strip()
    ports = needed(base, count, (low, high), parse_ranges(before))
    wanted = f"{base}-{base + count - 1}"
    result: dict[str, object] = {
        "range": wanted,
        "ephemeral": f"{low}-{high}",
        "reserved_before": before,
        "changed": False,
    }
    if not ports:
        inside = any(low <= p <= high for p in range(base, base + count))
        result["why"] = (
            f"HCCL's ports {wanted} are reserved already"
            if inside
            else f"HCCL's ports {wanted} lie outside the ephemeral range {low}-{high}"
        )
        return result
    value = format_ranges([*parse_ranges(before), (base, base + count - 1)])
    result.update(
        changed=True,
        reserved=value,
        why=(
            f"HCCL's ports {wanted} lie in the ephemeral range {low}-{high}"
            f" ({len(ports)} not reserved): reserved ({KEY} = {value})"
        ),
    )
    if check:
        return result
    (proc / "ip_local_reserved_ports").write_text(value + "\n")
    if persist is not None:
        persist.parent.mkdir(parents=True, exist_ok=True)
        tmp = persist.with_name(f".{persist.name}.tmp")
        tmp.write_text(
            "# Written by specfleet (npu_env): HCCL's host ports kept out of the ephemeral range\n"
            "# (CANN's HCCL_IF_BASE_PORT page). One list: the reservations found are kept in it.\n"
            f"{KEY} = {value}\n"
        )
        tmp.chmod(0o644)
        tmp.replace(persist)
        result["persisted"] = str(persist)
    return result


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specfleet_helpers.host.hccl_ports",
        description="Reserve HCCL's host ports (net.ipv4.ip_local_reserved_ports) where they lie "
        "in the ephemeral range and are not reserved yet; print what was found and done as JSON.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("reserve", help="reserve HCCL_IF_BASE_PORT and the ports after it")
    r.add_argument("--base", type=int, required=True, help="HCCL_IF_BASE_PORT, e.g. 60000")
    r.add_argument("--count", type=int, required=True, help="ports from the base, e.g. 32")
    r.add_argument(
        "--persist", type=Path, help="sysctl.d file to write the value to (kept across reboots)"
    )
    r.add_argument("--check", action="store_true", help="say what would be done, change nothing")
    r.add_argument(
        "--proc", type=Path, default=PROC, help=f"where the sysctls are read (default {PROC})"
    )
    args = parser.parse_args(argv)
    if args.count < 1 or args.base < 1 or args.base + args.count - 1 > 65535:
        parser.error(f"--base {args.base} --count {args.count}: expected ports within 1..65535")
    try:
        result = reserve(args.base, args.count, args.proc, args.persist, args.check)
    except (OSError, ValueError) as exc:
        print(f"hccl_ports reserve: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
