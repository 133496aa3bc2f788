"""What a job across hosts needs of each host before any work (npu_env, tasks/job.yml).

A job (specfleet_job) keeps its data, hidden states and checkpoints under one directory that
every host mounts, and trains as one torchrun world whose rendezvous listens on the first
host. Two steps, each run on every host of the job at once (one Ansible task each, so every
host has finished the first before any starts the second):

``announce`` writes this host's card to ``<dir>/.specfleet/hosts/<host>.json``: the run's token
(the host lock's, which Ansible knows for every host), the settings the job must agree on, and
the address this host's ranks talk over: ``--address``, else the source address of its route
to the other hosts (the kernel's choice: a UDP socket connected to each peer, no packet sent),
with the interface that holds it (``--ifname``, else found by address). With ``--listen`` it
then leaves a listener on those ports (the rendezvous port on the first host; HCCL's on NPU
hosts), in a process of its own, so that the others can connect: it ends once every other host
connected to each port, or after ``--listen-for`` seconds; the next announce of the host ends
one that is still there (its pid is on the card).

``check`` reads every host's card: a card that is missing, or holds another token than the one
Ansible gave that host, means this host does not see the storage the other host wrote to (not
one shared storage: a local directory, another export); settings that differ from this host's
are named with both values. Then it connects to the ports the others listen on (``--connect
HOST=ADDR:PORT``, retried until ``--timeout``): one it cannot reach is a firewall or a route
that torchrun or HCCL would meet hours later.

Both print one JSON line; ``check`` lists its findings in "problems" (exit 0: the role's rule
decides and names them), a card that cannot be written or a port already in use exits 1.
Standard library only: this runs with the host's python3.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import select
import signal
import socket
import struct
import sys
import time
from pathlib import Path
from typing import Any, Optional

from specfleet_helpers.files import write_json_atomic
from specfleet_helpers.host import procs

CARDS = Path(".specfleet") / "hosts"
_SIOCGIFADDR = 0x8915
_RETRY_S = 0.5


def card_path(job_dir: Path, host: str) -> Path:
    return job_dir / CARDS / f"{host}.json"


def route_source(peer: str) -> Optional[str]:
    """The address this host sends from towards `peer` (a name or an address), or None."""
    try:
        infos = socket.getaddrinfo(peer, 9, socket.AF_INET, socket.SOCK_DGRAM)
    except OSError:
        return None
    for *_, sockaddr in infos:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                probe.connect(sockaddr)  # a UDP connect only picks the route: nothing is sent
            except OSError:
                continue
            return str(probe.getsockname()[0])
    return None


def interface_addresses() -> dict[str, str]:
    """{interface: its IPv4 address} of the interfaces that have one."""
    found = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                reply = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, request)
            except OSError:
                continue
            found[name] = socket.inet_ntoa(reply[20:24])
    return found


def find_network(
    peers: list[str], address: str = "", ifname: str = ""
) -> tuple[Optional[str], Optional[str], list[str]]:
    """(address, interface, problems) this host's ranks use."""
    problems: list[str] = []
    by_name = interface_addresses()
    if not address and ifname:
        address = by_name.get(ifname, "")
        if not address:
            problems.append(f"specfleet_job_ifname {ifname} has no IPv4 address on this host")
    if not address:
        sources = [route_source(peer) for peer in peers]
        usable = [a for a in sources if a and not a.startswith("127.")]
        if usable:
            address = usable[0]
        elif any(sources):
            problems.append(
                f"this host reaches {', '.join(peers)} over loopback only: set "
                "specfleet_job_address to the address the other hosts reach it at"
            )
        elif peers:
            problems.append(
                f"no route from this host to {', '.join(peers)}: set specfleet_job_address"
            )
    if address and not ifname:
        ifname = next((name for name, addr in by_name.items() if addr == address), "")
        if not ifname:
            problems.append(f"no interface holds {address}: set specfleet_job_ifname")
    return address or None, ifname or None, problems


def _bind(address: str, port: int) -> socket.socket:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        server.bind((address, port))
    except OSError:
        server.close()
        raise
    server.listen(64)
    server.setblocking(False)
    return server


def serve_ports(servers: list[socket.socket], seconds: float, expected: int = 0) -> None:
    """Accept (and close) connections on `servers` until each had `expected` of them (the
    other hosts), or `seconds` have passed."""
    deadline = time.monotonic() + seconds
    accepted = {server.fileno(): 0 for server in servers}
    waiting = list(servers)
    while waiting and (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select(waiting, [], [], min(left, 1.0))
        for server in ready:
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            conn.close()
            accepted[server.fileno()] += 1
            if expected and accepted[server.fileno()] >= expected:
                waiting.remove(server)
    for server in servers:
        server.close()


def end_listener(card: Optional[dict[str, Any]]) -> None:
    """End the listener an earlier announce of this host left (it holds the ports still)."""
    pid = int((card or {}).get("listener_pid") or 0)
    if pid <= 0 or not procs.same_process(pid, (card or {}).get("listener_starttime")):
        return  # gone, or its pid reused by another process: not ours
    try:
        os.kill(pid, signal.SIGTERM)
    except OSError:
        return
    deadline = time.monotonic() + 5
    while procs.process_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def _detach(servers: list[socket.socket], seconds: float, expected: int) -> int:
    """Leave the listeners to a process of their own; returns its pid."""
    pid = os.fork()
    if pid:
        for server in servers:
            server.close()
        return pid
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    try:
        serve_ports(servers, seconds, expected)
    finally:
        os._exit(0)


def announce(
    job_dir: Path,
    host: str,
    token: str,
    settings: dict[str, Any],
    peers: list[str],
    address: str = "",
    ifname: str = "",
    listen: Optional[list[int]] = None,
    listen_for: float = 120.0,
) -> dict[str, Any]:
    found_address, found_ifname, problems = find_network(peers, address, ifname)
    path = card_path(job_dir, host)
    end_listener(procs.read_json(path))
    card = {
        "host": host,
        "token": token,
        "address": found_address,
        "ifname": found_ifname,
        "settings": settings,
        "written": time.time(),
    }
    listening: list[int] = []
    if listen and found_address:
        servers = []
        try:
            for port in listen:
                servers.append(_bind(found_address, port))
        except OSError as exc:
            for server in servers:
                server.close()
            raise PortBusy(
                f"port {port} on {host} ({found_address}) cannot be listened on: {exc}"
            ) from None
        card["listener_pid"] = _detach(servers, listen_for, len(peers))
        stat = procs.proc_stat(card["listener_pid"])
        card["listener_starttime"] = stat[2] if stat else None
        listening = list(listen)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, card)
    return {
        "host": host,
        "token": token,
        "card": str(path),
        "address": found_address,
        "ifname": found_ifname,
        "listening": listening,
        "problems": problems,
    }


class PortBusy(Exception):
    """A port the job needs is taken on this host (exit 1)."""


def _differences(mine: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    names = sorted(set(mine) | set(theirs))
    return [
        f"{name} {json.dumps(mine.get(name))} here, {json.dumps(theirs.get(name))} there"
        for name in names
        if mine.get(name) != theirs.get(name)
    ]


def reachable(address: str, port: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((address, port), timeout=max(0.5, min(2.0, timeout_s))):
                return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(_RETRY_S)


def check(
    job_dir: Path,
    host: str,
    expect: dict[str, str],
    connect: list[tuple[str, str, int]],
    timeout_s: float = 30.0,
) -> dict[str, Any]:
    """The findings on every host's card and on the ports to reach (see the module doc)."""
    problems: list[str] = []
    mine = procs.read_json(card_path(job_dir, host))
    if mine is None:
        problems.append(f"this host's own card {card_path(job_dir, host)} cannot be read back")
    seen = []
    for other, token in expect.items():
        if other == host:
            continue
        card = procs.read_json(card_path(job_dir, other))
        if card is None:
            problems.append(
                f"{host} does not see the card {other} wrote to {job_dir}: "
                f"{card_path(job_dir, other)} is missing here, so {job_dir} is not one storage "
                f"shared by {host} and {other} (specfleet_job_shared_dir)"
            )
            continue
        if card.get("token") != token:
            problems.append(
                f"{host} reads another run's card for {other} in {job_dir}: this host does not "
                f"see the storage {other} wrote to (specfleet_job_shared_dir)"
            )
            continue
        seen.append(other)
        if mine is not None:
            differ = _differences(mine.get("settings") or {}, card.get("settings") or {})
            if differ:
                problems.append(
                    f"the job's settings differ between {host} and {other}: "
                    + "; ".join(differ)
                    + " (a job trains with one set: set them for the whole group)"
                )
    reached = []
    for other, address, port in connect:
        if reachable(address, port, timeout_s):
            reached.append(f"{other}={address}:{port}")
        else:
            problems.append(
                f"{host} cannot reach port {port} of {other} at {address} within "
                f"{timeout_s:.0f}s (a firewall, or a route the job's collectives would not have)"
            )
    return {"host": host, "cards_seen": seen, "reached": reached, "problems": problems}


def _pairs(values: list[str], what: str) -> list[tuple[str, str]]:
    out = []
    for value in values:
        name, sep, rest = value.partition("=")
        if not sep or not name or not rest:
            raise SystemExit(f"job_probe: {what} {value!r} is not HOST=VALUE")
        out.append((name, rest))
    return out


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specfleet_helpers.host.job_probe",
        description="Prove a job's shared storage, find each host's collective address, and "
        "check the ports the job's hosts must reach (see the module's doc).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    a = sub.add_parser("announce", help="write this host's card, find its address, listen")
    c = sub.add_parser("check", help="read every host's card and reach the others' ports")
    for p in (a, c):
        p.add_argument("--dir", type=Path, required=True, help="the job's shared directory")
        p.add_argument("--host", required=True, help="this host's inventory name")
    a.add_argument("--token", required=True, help="this run's token on this host")
    a.add_argument("--settings-json", default="{}", help="the settings the job must agree on")
    a.add_argument("--peer", action="append", default=[], help="another host of the job")
    a.add_argument("--address", default="", help="the address to use (default: routed)")
    a.add_argument("--ifname", default="", help="the interface to use (default: of the address)")
    a.add_argument("--listen", type=int, action="append", default=[], help="a port to listen on")
    a.add_argument("--listen-for", type=float, default=120.0, help="seconds to keep listening")
    c.add_argument(
        "--expect", action="append", default=[], help="HOST=TOKEN of every host of the job"
    )
    c.add_argument(
        "--connect", action="append", default=[], help="HOST=ADDRESS:PORT to reach (repeatable)"
    )
    c.add_argument("--timeout", type=float, default=30.0, help="seconds to reach each port")
    args = parser.parse_args(argv)
    if args.command == "announce":
        try:
            settings = json.loads(args.settings_json)
            result = announce(
                args.dir,
                args.host,
                args.token,
                settings,
                args.peer,
                args.address,
                args.ifname,
                args.listen,
                args.listen_for,
            )
        except (OSError, ValueError, PortBusy) as exc:
            print(f"job_probe: {exc}", file=sys.stderr)
            return 1
    else:
        connect = []
        for other, target in _pairs(args.connect, "--connect"):
            address, _, port = target.rpartition(":")
            if not address or not port.isdigit():
                raise SystemExit(f"job_probe: --connect {other}={target} is not HOST=ADDRESS:PORT")
            connect.append((other, address, int(port)))
        result = check(
            args.dir, args.host, dict(_pairs(args.expect, "--expect")), connect, args.timeout
        )
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
