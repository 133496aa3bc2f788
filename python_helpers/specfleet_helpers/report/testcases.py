"""Which host a testinfra test case is about: its id names the host as its parameter
(test_x[ansible://a2-node1], test_x[ssh://user@a2-node1], test_x[ansible://a2-node1-extra] when
another parametrization follows). Shared by the report (fleet_report) and the artifact suite's
runner (artifact_suite); standard library only, so the runner starts fast.
"""

from __future__ import annotations

import re
from typing import Optional

TESTCASE_ID = re.compile(r"^(?P<test>[^\[]+)\[(?P<param>.*)\]$")
# The property artifact_suite puts on a test case it took from an earlier run's pass, naming
# that run's report; fleet_report reads it back as the host's `reused_from`.
REUSED_FROM = "specfleet_reused_from"


def host_of(param: str, hosts: list[str]) -> Optional[tuple[str, str]]:
    """(host, remaining parameter id) for a testinfra parameter id like 'ansible://a2-node1'
    or 'ansible://a2-node1-extra'; None when it names none of `hosts`."""
    bare = param.split("://", 1)[1] if "://" in param else param
    candidates = [bare]
    if "@" in bare:
        candidates.append(bare.split("@", 1)[1])  # ssh://user@host
    for candidate in candidates:
        if candidate in hosts:
            return candidate, ""
        for host in sorted(hosts, key=len, reverse=True):
            if candidate.startswith(host + "-"):
                return host, candidate[len(host) + 1 :]
    return None


def testcase_host(name: str, hosts: list[str]) -> Optional[tuple[str, str]]:
    """(test name with any parametrization after the host, host) of a test case's name."""
    match = TESTCASE_ID.match(name)
    found = host_of(match["param"], hosts) if match else None
    if not match or found is None:
        return None
    host, rest = found
    return match["test"] + (f"[{rest}]" if rest else ""), host
