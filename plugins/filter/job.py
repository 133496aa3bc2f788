"""Filters for a job across hosts (specfleet_job: the hosts of an inventory group train one draft).

shard_rows: the rows one host's generate-offline-data writes, as speculators 0.9.0 splits them
(data_generation/offline.py, get_indices_to_process: contiguous chunks, the remainder spread over
the first ranks), so that each host's hidden-state verifier checks exactly its share.

job_absent / job_ports: what npu_env's job check (roles/npu_env/tasks/job.yml) reads of the
other hosts: which hosts of the job did not announce themselves, and why; and the ports the
others announced they listen on, to connect to.

job_runs: the run ids of the stages a stage uses, on every host of the job, keyed by host: the
`upstream` input of a stage the whole job runs at once (train), the same on every host, so that
every host computes the same fingerprint and the same checkpoint directory, and a stage redone
on any host redoes the job on all of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Optional


def shard_rows(rows: Any, world_size: Any, rank: Any) -> dict[str, int]:
    """{"first", "count"}: the rows rank `rank` of `world_size` generates out of `rows`."""
    rows, world_size, rank = int(rows), int(world_size), int(rank)
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")
    chunk, remainder = divmod(max(rows, 0), world_size)
    first = rank * chunk + min(rank, remainder)
    return {"first": first, "count": chunk + (1 if rank < remainder else 0)}


def job_runs(hosts: Iterable[str], hostvars: Mapping[str, Any], stages: Iterable[str]) -> dict:
    """{host: {stage: run id}} of `stages` on each of `hosts` (their specfleet_stage_runs; a
    stage a host has not run is None)."""
    wanted = list(stages)
    out: dict[str, dict[str, Any]] = {}
    for host in hosts:
        runs = hostvars[host].get("specfleet_stage_runs") or {}
        out[str(host)] = {stage: runs.get(stage) for stage in wanted}
    return out


def _announced(hostvars: Mapping[str, Any], host: str, registered: str) -> Optional[dict]:
    result = hostvars[host].get(registered)
    if not isinstance(result, Mapping) or result.get("failed") or result.get("skipped"):
        return None
    card = result.get("json")
    return card if isinstance(card, Mapping) else None


def job_absent(hosts: Iterable[str], hostvars: Mapping[str, Any], registered: str) -> list[str]:
    """Each of `hosts` whose announcement (the registered result `registered`) is missing, as
    "HOST (why)": unreachable or refused (specfleet_host_stopped), failed an earlier check
    (specfleet_failed_stage), or failed to announce itself."""
    out = []
    for host in hosts:
        if _announced(hostvars, host, registered) is not None:
            continue
        vars_ = hostvars[host]
        stopped = vars_.get("specfleet_host_stopped") or {}
        failed = vars_.get("specfleet_failed_stage")
        if stopped:
            why = f"{stopped.get('why', 'stopped')}: {stopped.get('error') or ''}".strip(": ")
        elif failed:
            why = f"its {failed} stage failed"
        else:
            result = vars_.get(registered) or {}
            why = str(result.get("stderr") or result.get("msg") or "it did not announce itself")
        out.append(f"{host} ({' '.join(why.split())})")
    return out


def job_ports(
    hosts: Iterable[str], hostvars: Mapping[str, Any], registered: str, this: str
) -> list[str]:
    """Every port the other hosts announced they listen on, as HOST=ADDRESS:PORT."""
    out = []
    for host in hosts:
        card = _announced(hostvars, host, registered) if host != this else None
        for port in (card or {}).get("listening") or []:
            out.append(f"{host}={card['address']}:{port}")
    return out


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "shard_rows": shard_rows,
            "job_runs": job_runs,
            "job_absent": job_absent,
            "job_ports": job_ports,
        }
