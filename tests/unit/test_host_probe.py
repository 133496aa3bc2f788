"""Tests for specfleet_helpers.host.host_probe: /proc parsing on literal samples, and ports,
interpreters and the CLI against this machine for real."""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from specfleet_helpers.host.host_probe import (
    cpu_flags,
    disk_free_gb,
    existing_ancestor,
    filesystem,
    meminfo,
    mount_point,
    port_free,
    port_owner,
    python_version,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
HELPERS = REPO_ROOT / "python_helpers"
THIS_VERSION = ".".join(str(part) for part in sys.version_info[:3])

MEMINFO = """\
MemTotal:       33554432 kB
MemFree:         1048576 kB
MemAvailable:   12582912 kB
Buffers:          204800 kB
HugePages_Total:       0
Hugepagesize:       2048 kB
"""

MEMINFO_WITHOUT_AVAILABLE = """\
MemTotal:        8388608 kB
MemFree:         3145728 kB
"""

X86_CPUINFO = """\
processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8380 CPU @ 2.30GHz
flags\t\t: fpu vme sse4_2 avx2 avx512f avx2 fma
bogomips\t: 4600.00

processor\t: 1
vendor_id\t: GenuineIntel
flags\t\t: fpu
"""

ARM_CPUINFO = """\
processor\t: 0
BogoMIPS\t: 200.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid
CPU implementer\t: 0x48
CPU architecture: 8

processor\t: 1
BogoMIPS\t: 200.00
Features\t: fp
"""


@pytest.fixture
def listening_port():
    """A real TCP socket listening on 127.0.0.1 at a port the kernel picked."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_meminfo_uses_mem_available():
    assert meminfo(MEMINFO) == {"ram_total_gb": 32.0, "ram_available_gb": 12.0}


def test_meminfo_falls_back_to_mem_free():
    assert meminfo(MEMINFO_WITHOUT_AVAILABLE) == {"ram_total_gb": 8.0, "ram_available_gb": 3.0}


def test_meminfo_of_this_host():
    info = meminfo()
    assert info["ram_total_gb"] > 0
    assert 0 < info["ram_available_gb"] <= info["ram_total_gb"]


def test_cpu_flags_x86_first_processor_sorted_unique():
    assert cpu_flags(X86_CPUINFO) == ["avx2", "avx512f", "fma", "fpu", "sse4_2", "vme"]


def test_cpu_flags_arm_features():
    flags = cpu_flags(ARM_CPUINFO)
    assert flags == sorted(flags)
    assert {"asimd", "fp", "atomics", "cpuid"} <= set(flags)
    assert len(flags) == 12


def test_cpu_flags_without_a_flags_line():
    assert cpu_flags("processor\t: 0\nmodel name\t: something\n") == []
    assert cpu_flags("") == []


def test_existing_ancestor_of_a_nested_missing_path(tmp_path):
    missing = tmp_path / "a" / "b" / "c"
    assert existing_ancestor(missing) == tmp_path
    assert existing_ancestor(tmp_path) == tmp_path
    assert not (tmp_path / "a").exists()
    assert disk_free_gb(missing) > 0


def test_existing_ancestor_makes_relative_paths_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert existing_ancestor(Path("x/y")) == tmp_path


def other_filesystem(than: Path) -> Path:
    """A writable directory on another filesystem than `than` (Linux's /dev/shm tmpfs)."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)) or shm.stat().st_dev == than.stat().st_dev:
        pytest.skip("no writable /dev/shm on another filesystem than the test's tmp dir")
    return shm


def test_filesystem_of_a_cache_not_created_yet(tmp_path):
    cache = tmp_path / "home" / ".cache" / "modelscope" / "hub"
    fs = filesystem(str(cache))
    assert fs["path"] == str(cache)
    assert fs["measured"] == str(tmp_path)
    assert fs["device"] == tmp_path.stat().st_dev
    usage = shutil.disk_usage(tmp_path)
    assert abs(fs["free_gb"] - usage.free / 1024**3) < 1
    assert fs["total_gb"] == round(usage.total / 1024**3, 2)
    assert Path(fs["mount"]) in (tmp_path, *tmp_path.parents)


def test_filesystem_keeps_the_path_as_given(tmp_path):
    given = f"{tmp_path}/cache/"
    assert filesystem(given)["path"] == given


def test_paths_on_one_filesystem_share_its_device_and_mount(tmp_path):
    root, cache = filesystem(str(tmp_path / "root")), filesystem(str(tmp_path / "cache"))
    assert root["device"] == cache["device"]
    assert root["mount"] == cache["mount"]


def test_paths_on_two_filesystems_are_told_apart(tmp_path):
    shm = other_filesystem(tmp_path)
    root, cache = filesystem(str(tmp_path / "root")), filesystem(str(shm / "specfleet-x" / "hub"))
    assert root["device"] != cache["device"]
    assert root["mount"] != cache["mount"]
    assert cache["measured"] == str(shm)
    assert cache["free_gb"] == round(shutil.disk_usage(shm).free / 1024**3, 2)


def test_mount_point_is_where_the_device_changes(tmp_path):
    top = mount_point(tmp_path)
    assert top.stat().st_dev == tmp_path.stat().st_dev
    assert top == top.parent or top.parent.stat().st_dev != top.stat().st_dev
    assert mount_point(Path("/")) == Path("/")


def test_port_free_for_a_free_port():
    assert port_free("127.0.0.1", free_port()) is True


def test_port_free_false_while_a_socket_listens(listening_port):
    assert port_free("127.0.0.1", listening_port) is False


def test_port_owner_is_this_process(listening_port):
    owner = port_owner(listening_port)
    assert owner is not None
    assert owner["pid"] == os.getpid()
    assert owner["cmdline"]


def test_port_owner_of_a_port_nobody_listens_on():
    assert port_owner(free_port()) is None


def test_python_version_of_this_interpreter():
    result = python_version(sys.executable)
    assert result == {
        "interpreter": sys.executable,
        "found": True,
        "path": sys.executable,
        "version": THIS_VERSION,
    }


def test_python_version_of_a_missing_interpreter():
    assert python_version("python-specfleet-missing9.99") == {
        "interpreter": "python-specfleet-missing9.99",
        "found": False,
        "path": None,
        "version": None,
    }


def test_python_version_of_an_interpreter_that_fails(tmp_path):
    fake = tmp_path / "broken-python"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    result = python_version(str(fake))
    assert result["found"] is True
    assert result["version"] is None


def test_cli_json(tmp_path, listening_port):
    free = free_port()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "specfleet_helpers.host.host_probe",
            f"--root={tmp_path / 'work' / 'root'}",
            f"--disk={tmp_path / 'cache' / 'hub'}",
            f"--port={listening_port}",
            f"--port={free}",
            f"--python={sys.executable}",
            "--python=python-specfleet-missing9.99",
            "--tool=bash",
            "--tool=specfleet-no-such-tool",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(HELPERS)},
        check=True,
    )
    report = json.loads(proc.stdout)
    for key in ("tools", "ports", "pythons", "disk_free_gb", "ram_available_gb", "cpu_flags"):
        assert key in report
    assert report["arch"] == platform.machine()
    assert report["tools"] == {"bash": shutil.which("bash"), "specfleet-no-such-tool": None}
    assert report["disk_path"] == str(tmp_path)
    assert report["disk_free_gb"] > 0
    root, cache = report["disks"]
    assert root["path"] == str(tmp_path / "work" / "root")
    assert cache["path"] == str(tmp_path / "cache" / "hub")
    assert root["measured"] == cache["measured"] == str(tmp_path)
    assert root["device"] == cache["device"] == tmp_path.stat().st_dev
    assert 0 < report["ram_available_gb"] <= report["ram_total_gb"]
    assert isinstance(report["cpu_flags"], list)
    busy, idle = report["ports"]
    assert busy["port"] == listening_port
    assert busy["host"] == "127.0.0.1"
    assert busy["free"] is False
    assert busy["owner"]["pid"] == os.getpid()
    assert idle == {"port": free, "host": "127.0.0.1", "free": True, "owner": None}
    this, missing = report["pythons"]
    assert this["found"] is True
    assert this["version"] == THIS_VERSION
    assert missing["found"] is False
