"""Tests for specfleet_helpers.host.hccl_ports: HCCL's host ports reserved where they lie in the
ephemeral range, other reservations kept; for real in a network namespace of its own (the
sysctl is per namespace), as root."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
from procutil import HELPERS
from specfleet_helpers.host import hccl_ports


def fake_proc(tmp_path: Path, port_range: str, reserved: str) -> Path:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "ip_local_port_range").write_text(port_range + "\n")
    (proc / "ip_local_reserved_ports").write_text(reserved + "\n")
    return proc


def test_ranges_merge_in_the_kernels_syntax() -> None:
    assert hccl_ports.parse_ranges("8080,60000-60015\n") == [(8080, 8080), (60000, 60015)]
    assert hccl_ports.format_ranges([(60016, 60031), (8080, 8080), (60000, 60015)]) == (
        "8080,60000-60031"
    )
    assert hccl_ports.format_ranges([]) == ""


def test_the_default_ports_are_reserved_beside_what_was_reserved(tmp_path: Path) -> None:
    """Linux's default range holds HCCL's 60000-60031: they are reserved, the existing
    reservation kept, the value written to the sysctl.d file too."""
    proc = fake_proc(tmp_path, "32768\t60999", "8080")
    persist = tmp_path / "sysctl.d" / "60-specfleet-hccl-ports.conf"
    done = hccl_ports.reserve(60000, 32, proc, persist)
    assert done["changed"] and done["reserved"] == "8080,60000-60031", done
    assert (proc / "ip_local_reserved_ports").read_text().strip() == "8080,60000-60031"
    assert "net.ipv4.ip_local_reserved_ports = 8080,60000-60031" in persist.read_text()
    again = hccl_ports.reserve(60000, 32, proc, persist)
    assert not again["changed"] and "reserved already" in again["why"], again


def test_ports_outside_the_ephemeral_range_need_nothing(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, "32768\t59999", "")
    done = hccl_ports.reserve(60000, 32, proc)
    assert not done["changed"] and "outside the ephemeral range" in done["why"], done
    assert (proc / "ip_local_reserved_ports").read_text().strip() == ""


def test_check_mode_says_and_changes_nothing(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, "32768 60999", "60000-60015")
    done = hccl_ports.reserve(60000, 32, proc, check=True)
    assert done["changed"] and "16 not reserved" in done["why"], done
    assert (proc / "ip_local_reserved_ports").read_text().strip() == "60000-60015"


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and ip (a netns)"
)
def test_the_kernel_takes_the_reservation_in_a_namespace(tmp_path: Path) -> None:
    """The real sysctl, in a network namespace made for the test (the machine's is not
    touched): reserved once, then found reserved."""
    name = f"sfhccl{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        argv = ["ip", "netns", "exec", name, "python3", "-m", "specfleet_helpers.host.hccl_ports"]
        env = {**os.environ, "PYTHONPATH": str(HELPERS)}
        reserve = [*argv, "reserve", "--base", "60000", "--count", "32"]
        first, second = (
            json.loads(
                subprocess.run(reserve, capture_output=True, text=True, env=env, check=True).stdout
            )
            for _ in range(2)
        )
        assert first["changed"] and first["reserved"] == "60000-60031", first
        assert not second["changed"], second
        seen = subprocess.run(
            ["ip", "netns", "exec", name, "cat", "/proc/sys/net/ipv4/ip_local_reserved_ports"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        assert seen.stdout.strip() == "60000-60031"
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)
