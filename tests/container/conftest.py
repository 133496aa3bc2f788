"""Fixtures of the container-runtime suite (molecule's `container` scenario, verify step).

It runs after converge, idempotence and the side effect (one more mount), against the host
that runs the stage container; molecule/container/record.yml appended one line per converge
to SPECFLEET_CONTAINER_HISTORY (the container's id, start time, image and mounts).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def history() -> list[dict[str, Any]]:
    path = Path(os.environ["SPECFLEET_CONTAINER_HISTORY"])
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    assert len(records) == 3, (
        f"{path}: expected 3 records (converge, idempotence, side effect), found {len(records)}"
    )
    return records


@pytest.fixture
def scenario_dir() -> Path:
    return Path(os.environ["SPECFLEET_CONTAINER_HISTORY"]).parent


@pytest.fixture
def hostvars(host) -> dict[str, Any]:
    return host.ansible.get_variables()


@pytest.fixture
def engine(hostvars) -> str:
    return str(hostvars["specfleet_container_engine"])


@pytest.fixture
def container_name(hostvars) -> str:
    return str(hostvars["specfleet_container_name"])


@pytest.fixture
def inspect(host, engine, container_name) -> dict[str, Any]:
    out = host.check_output(f"{engine} container inspect {container_name}")
    return json.loads(out)[0]
