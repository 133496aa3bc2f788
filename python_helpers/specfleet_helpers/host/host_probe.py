"""Measure what the preflight checks compare against thresholds: free disk under the work
root and on the filesystem of each other path given (the ModelScope cache), free RAM, CPU
flags, a Python interpreter's version, and whether ports are free.

Only measures; the thresholds and the pass/fail decision live in the npu_env role, so the
messages a user sees name the Ansible variable to change. Standard library only: this runs
with the host's own Python before anything is installed.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

GIB = 1024**3


def existing_ancestor(path: Path) -> Path:
    """The path itself or its nearest existing parent (the work root may not exist yet)."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def disk_free_gb(path: Path) -> float:
    return round(shutil.disk_usage(existing_ancestor(path)).free / GIB, 2)


def mount_point(path: Path) -> Path:
    """The top directory of the filesystem holding an existing path (st_dev changes above it)."""
    path = path.absolute()
    device = path.stat().st_dev
    while path != path.parent and path.parent.stat().st_dev == device:
        path = path.parent
    return path


def filesystem(path: str) -> dict[str, Any]:
    """Free space of the filesystem that holds `path`, or will once it is created.

    The device id tells whether two paths share a filesystem: the preflight then needs their
    requirements together on it, not each one alone.
    """
    measured = existing_ancestor(Path(path))
    usage = shutil.disk_usage(measured)
    return {
        "path": path,
        "measured": str(measured),
        "device": measured.stat().st_dev,
        "mount": str(mount_point(measured)),
        "free_gb": round(usage.free / GIB, 2),
        "total_gb": round(usage.total / GIB, 2),
    }


def meminfo(text: Optional[str] = None) -> dict[str, float]:
    """Total and available RAM in GB from /proc/meminfo."""
    if text is None:
        text = Path("/proc/meminfo").read_text()
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            values[key.strip()] = int(parts[0]) * 1024
    available = values.get("MemAvailable", values.get("MemFree", 0))
    return {
        "ram_total_gb": round(values.get("MemTotal", 0) / GIB, 2),
        "ram_available_gb": round(available / GIB, 2),
    }


def cpu_flags(text: Optional[str] = None) -> list[str]:
    """CPU feature flags of the first processor (x86 `flags`, Arm `Features`)."""
    if text is None:
        try:
            text = Path("/proc/cpuinfo").read_text()
        except OSError:
            return []
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return sorted(set(value.split()))
    return []


def python_version(interpreter: str) -> dict[str, Any]:
    """Version of an interpreter found on PATH (or an absolute path)."""
    found = shutil.which(interpreter)
    if not found:
        return {"interpreter": interpreter, "found": False, "path": None, "version": None}
    try:
        # -S: its site packages are not needed to print its version (they took half the time).
        out = subprocess.run(
            [found, "-S", "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out = None
    return {"interpreter": interpreter, "found": True, "path": found, "version": out}


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                inodes.add(inode)
    return inodes


# Set by the launcher of a service specfleet deployed (serve_mode service): a port its server
# holds is specfleet's own, redeployed by its stage, not a conflict.
SERVICE_ENV = b"SPECFLEET_SERVICE="


def _service_of(proc: Path) -> Optional[str]:
    try:
        environ = (proc / "environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in environ:
        if item.startswith(SERVICE_ENV):
            return item[len(SERVICE_ENV) :].decode(errors="replace") or None
    return None


def port_owner(port: int) -> Optional[dict[str, Any]]:
    """Best effort: the process listening on the port (visible only to root or its owner)."""
    inodes = _listening_inodes(port)
    if not inodes:
        return None
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:[") and target[8:-1] in inodes:
                    cmdline = (
                        (proc / "cmdline")
                        .read_bytes()
                        .replace(b"\0", b" ")
                        .decode(errors="replace")
                    )
                    return {
                        "pid": int(proc.name),
                        "cmdline": cmdline.strip()[:200],
                        "service": _service_of(proc),
                    }
        except OSError:
            continue
    return {"pid": None, "cmdline": None}


def port_free(host: str, port: int) -> bool:
    """True when a server could bind host:port now."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def probe(
    root: Path,
    host: str,
    ports: list[int],
    pythons: list[str],
    tools: list[str],
    disks: Optional[list[str]] = None,
) -> dict[str, Any]:
    result: dict[str, Any] = {
        "tools": {tool: shutil.which(tool) for tool in tools},
        "arch": platform.machine(),
        "kernel": platform.release(),
        "cpu_count": os.cpu_count(),
        "cpu_flags": cpu_flags(),
        "disk_path": str(existing_ancestor(root)),
        "disk_free_gb": disk_free_gb(root),
        # The work root first, then each path asked for, as given (the role looks them up so).
        "disks": [filesystem(str(root))] + [filesystem(path) for path in disks or []],
        "ports": [],
        "pythons": [python_version(p) for p in pythons],
    }
    result.update(meminfo())
    for port in ports:
        free = port_free(host, port)
        result["ports"].append(
            {"port": port, "host": host, "free": free, "owner": None if free else port_owner(port)}
        )
    return result


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specfleet_helpers.host.host_probe",
        description="Print the host measurements the specfleet preflight checks use, as JSON.",
    )
    parser.add_argument("--root", type=Path, required=True, help="work root (need not exist yet)")
    parser.add_argument("--bind-host", default="127.0.0.1", help="address servers will bind")
    parser.add_argument(
        "--port", type=int, action="append", default=[], help="port to check (repeat)"
    )
    parser.add_argument(
        "--python", action="append", default=[], help="interpreter whose version to report (repeat)"
    )
    parser.add_argument(
        "--tool", action="append", default=[], help="command to look up on PATH (repeat)"
    )
    parser.add_argument(
        "--disk",
        action="append",
        default=[],
        help="another path whose filesystem to measure, e.g. the ModelScope cache (repeat)",
    )
    args = parser.parse_args(argv)
    report = probe(args.root, args.bind_host, args.port, args.python, args.tool, args.disk)
    print(json.dumps(report, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
