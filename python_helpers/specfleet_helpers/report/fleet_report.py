"""Turn one run over a fleet into a report: fleet.json, fleet.md and junit.xml.

A play collects, per host, what this run did to each stage and what the host's work root
holds (stamps, failure records, npu_env.json, the stack versions) into one JSON document.
This module decides, per host and stage, passed | failed | skipped | not reached |
unreachable, whether each host and the fleet are green, and writes three views of it: a
machine-readable fleet.json (schema "specfleet.fleet/1", see docs/fleet-report.md), a
fleet.md to read at a glance, and a junit.xml that any CI renders. The optional pytest
junit XML of the testinfra artifact suite is mapped to hosts and folded in.

It never decides what to fail: it exits 0 whenever the files were written, green or not,
and prints one JSON line for the play to act on. Malformed input exits 2 with a message
naming the file and what was expected. Runs on the Ansible controller; standard library only.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Optional

SCHEMA = "specfleet.fleet/1"
FLEET_GROUPS = ("atlas-a2", "atlas-a3", "ascend-950")
NO_GROUP = "ungrouped"
RUN_STATUSES = ("ran", "up_to_date", "would_run", "failed")
PASSED, FAILED, SKIPPED, NOT_REACHED, UNREACHABLE = (
    "passed",
    "failed",
    "skipped",
    "not reached",
    "unreachable",
)
# A stamp whose files or facts no longer verify (checks/stage_verify.py), one built from an
# upstream run that has since been redone, one nothing could verify: none of them is passed.
DAMAGED, STALE, UNVERIFIED = "damaged", "stale", "unverified"
# The values the hosts ran with, read from the stamps' inputs: (setting, stage, keys...).
EFFECTIVE_SETTINGS = (
    ("num_speculative_tokens", "serve", "speculative_config", "num_speculative_tokens"),
    ("serve_gpu_memory_utilization", "serve", "gpu_memory_utilization"),
    ("serve_max_model_len", "serve", "max_model_len"),
    ("train_epochs", "train", "epochs"),
    ("data_seq_length", "data", "seq_length"),
    ("target_layer_ids", "hidden_states", "target_layer_ids"),
)
VERSION_KEYS = ("vllm", "vllm-ascend", "torch", "torch_npu", "transformers")
MAX_NAMES = 10  # hosts named in the verdict line before "and N more"

ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-_]")
XML_INVALID = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


class InputError(ValueError):
    """The input does not follow the documented schema (exit 2)."""


# --- reading and checking the input -------------------------------------------------------


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return f"a number ({value!r})"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"a string ({json.dumps(shown)})"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check(ok: bool, where: str, expected: str, value: Any) -> None:
    if not ok:
        raise InputError(f"{where}: expected {expected}, got {_kind(value)}")


def _opt(obj: dict[str, Any], key: str, where: str, kind: str, default: Any = None) -> Any:
    """obj[key] checked against kind ("str", "bool", "number", "dict", "list[str]"); null or
    absent gives default."""
    value = obj.get(key)
    if value is None:
        return default
    here = f"{where}.{key}" if where else key
    if kind == "str":
        _check(isinstance(value, str), here, "a string or null", value)
    elif kind == "bool":
        _check(isinstance(value, bool), here, "true or false", value)
    elif kind == "number":
        _check(_is_number(value), here, "a number or null", value)
    elif kind == "dict":
        _check(isinstance(value, dict), here, "an object or null", value)
    elif kind == "list[str]":
        _check(
            isinstance(value, list) and all(isinstance(v, str) for v in value),
            here,
            "a list of strings or null",
            value,
        )
    return value


def _records(obj: dict[str, Any], key: str, where: str) -> dict[str, dict[str, Any]]:
    """A {stage: object} mapping (stamps, failures, run)."""
    value = _opt(obj, key, where, "dict", {})
    for stage, record in value.items():
        _check(isinstance(record, dict), f"{where}.{key}.{stage}", "an object", record)
    return value


def validate(doc: Any) -> dict[str, Any]:
    """Check the shape of the collected document and fill optional fields with defaults.
    Raises InputError naming the offending field."""
    _check(isinstance(doc, dict), "top level", "an object", doc)
    for key in ("report_id", "stages", "hosts"):
        if key not in doc:
            raise InputError(f"missing top-level key {key!r}")
    _check(isinstance(doc["report_id"], str), "report_id", "a string", doc["report_id"])
    stages = doc["stages"]
    _check(
        isinstance(stages, list) and all(isinstance(s, str) and s for s in stages),
        "stages",
        "a list of stage names",
        stages,
    )
    if len(set(stages)) != len(stages):
        raise InputError(f"stages: expected distinct stage names, got {stages}")
    _check(
        isinstance(doc["hosts"], dict), "hosts", "an object {inventory name: host}", doc["hosts"]
    )
    clean: dict[str, Any] = {
        "report_id": doc["report_id"],
        "generated": _opt(doc, "generated", "", "str"),
        "playbook": _opt(doc, "playbook", "", "str"),
        "check_mode": _opt(doc, "check_mode", "", "bool", False),
        "limit": _opt(doc, "limit", "", "str"),
        "tags": _opt(doc, "tags", "", "list[str]", []),
        "stages": stages,
        "hosts": {},
    }
    for name, host in doc["hosts"].items():
        where = f"hosts[{json.dumps(name)}]"
        _check(isinstance(host, dict), where, "an object", host)
        if "reachable" not in host:
            raise InputError(f"{where}: missing key 'reachable'")
        _check(
            isinstance(host["reachable"], bool),
            f"{where}.reachable",
            "true or false",
            host["reachable"],
        )
        state = _opt(host, "state", where, "dict")
        if state is not None:
            sw = f"{where}.state"
            stamps = _records(state, "stamps", sw)
            for stage, stamp in stamps.items():
                _opt(stamp, "ended", f"{sw}.stamps.{stage}", "str")
                _opt(stamp, "duration_s", f"{sw}.stamps.{stage}", "number")
            failures = _records(state, "failures", sw)
            for stage, failure in failures.items():
                fw = f"{sw}.failures.{stage}"
                for key in ("time", "error", "log", "rerun"):
                    _opt(failure, key, fw, "str")
                _opt(failure, "log_tail", fw, "list[str]")
            state = {
                "stamps": stamps,
                "failures": failures,
                "environment": _opt(state, "environment", sw, "dict", {}),
                "versions": _opt(state, "versions", sw, "dict", {}),
            }
        run = _records(host, "run", where)
        for stage, entry in run.items():
            rw = f"{where}.run.{stage}"
            status = entry.get("status")
            _check(
                status in RUN_STATUSES, f"{rw}.status", f"one of {', '.join(RUN_STATUSES)}", status
            )
            for key in ("reason", "error", "log", "rerun"):
                _opt(entry, key, rw, "str")
            _opt(entry, "duration_s", rw, "number")
            _opt(entry, "log_tail", rw, "list[str]")
        verification = _opt(host, "verification", where, "dict")
        for stage, result in (verification or {}).items():
            _check(
                isinstance(result, dict) and isinstance(result.get("status"), str),
                f"{where}.verification.{stage}",
                "an object with a status",
                result,
            )
        clean["hosts"][name] = {
            "groups": _opt(host, "groups", where, "list[str]", []),
            "verification": verification,
            "reachable": host["reachable"],
            "wall_time_s": _opt(host, "wall_time_s", where, "number"),
            "settings": _opt(host, "settings", where, "dict", {}),
            "verification_error": _opt(host, "verification_error", where, "str"),
            "state": state,
            "run": run,
        }
    return clean


def load_input(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read it ({exc})") from exc
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise InputError(
            f"{path}: not JSON ({exc}); expected the host report JSON collected by the play"
        ) from exc
    try:
        return validate(doc)
    except InputError as exc:
        raise InputError(f"{path}: {exc} (schema: docs/fleet-report.md)") from exc


# --- small helpers ------------------------------------------------------------------------


def _get(obj: Any, *keys: str) -> Any:
    """obj[k1][k2]... or None as soon as a level is missing or not an object."""
    for key in keys:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _time(value: Any) -> Optional[datetime]:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def _first_line(text: Optional[str]) -> str:
    lines = (text or "").strip().splitlines()
    return lines[0].strip() if lines else ""


def _group(groups: list[str]) -> Optional[str]:
    for group in groups:
        if group in FLEET_GROUPS:
            return group
    return groups[0] if groups else None


def _group_rank(group: Optional[str]) -> int:
    return FLEET_GROUPS.index(group) if group in FLEET_GROUPS else len(FLEET_GROUPS)


def _clean_text(text: str) -> str:
    """Without ANSI escapes and characters XML 1.0 cannot carry."""
    return XML_INVALID.sub("", ANSI.sub("", text))


def _finite(value: Any) -> Any:
    """JSON has no NaN/Infinity: such numbers become null, recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


# --- statuses -----------------------------------------------------------------------------


def _failure_is_newer(failure: dict[str, Any], stamp: Optional[dict[str, Any]]) -> bool:
    """A failure record counts unless a stamp shows the stage succeeded after it. When the
    times cannot be compared, a stamp with an end time wins (a failure without time, too)."""
    if stamp is None:
        return True
    failed_at, ended = _time(failure.get("time")), _time(stamp.get("ended"))
    if failed_at is None:
        return False
    if ended is None:
        return True
    return failed_at > ended


ENVIRONMENT_STAGE = "npu_env"


def stale_upstream(stage: str, stamps: dict[str, Any]) -> Optional[str]:
    """Why a stamp is stale: an upstream stage it was built from has another run id now."""
    upstream = _get(stamps.get(stage), "inputs", "upstream")
    if not isinstance(upstream, dict):
        return None
    for name, run_id in sorted(upstream.items()):
        now = _get(stamps.get(name), "run_id")
        if now is not None and now != run_id:
            return f"built from {name} run {run_id}; {name} is now run {now}"
    return None


def stage_statuses(stages: list[str], host: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The status of every stage of one host, by the rules in docs/fleet-report.md."""
    state = host["state"] or {}
    stamps, failures = state.get("stamps", {}), state.get("failures", {})
    verification = host.get("verification") or {}
    out: dict[str, dict[str, Any]] = {}
    first_failed: Optional[str] = None
    for stage in stages:
        rec: dict[str, Any] = {
            "status": None,
            "detail": "",
            "duration_s": None,
            "reason": None,
            "error": None,
            "log": None,
            "rerun": None,
            "log_tail": [],
        }
        entry = host["run"].get(stage)
        stamp = stamps.get(stage)
        if stamp is None and stage == ENVIRONMENT_STAGE and state.get("environment"):
            # npu_env leaves npu_env.json (what the host is), not a stamp.
            stamp = {"ended": None}
        if entry is not None:
            status, reason = entry["status"], entry.get("reason")
            rec.update(
                reason=reason,
                duration_s=entry.get("duration_s"),
                log=entry.get("log"),
                rerun=entry.get("rerun"),
                log_tail=entry.get("log_tail") or [],
            )
            if status == "ran":
                rec.update(status=PASSED, detail=f"ran: {reason}" if reason else "ran")
            elif status == "up_to_date":
                rec.update(status=PASSED, detail="up to date")
            elif status == "would_run":
                rec.update(status=SKIPPED, detail=f"would run: {reason}" if reason else "would run")
            else:
                error = entry.get("error")
                rec.update(status=FAILED, detail=_first_line(error) or "failed", error=error)
        elif first_failed is not None:
            rec.update(status=NOT_REACHED, detail=f"after {first_failed} failed")
        elif not host["reachable"]:
            rec.update(status=UNREACHABLE, detail="host unreachable")
        elif stage in failures and _failure_is_newer(failures[stage], stamp):
            failure = failures[stage]
            at = failure.get("time") or "an unknown time"
            rec.update(
                status=FAILED,
                detail=f"failed in an earlier run at {at}",
                error=failure.get("error"),
                log=failure.get("log"),
                rerun=failure.get("rerun"),
                log_tail=failure.get("log_tail") or [],
            )
        elif stamp is not None:
            rec.update(
                status=PASSED,
                detail=f"earlier run, ended {stamp.get('ended') or 'at an unknown time'}",
                duration_s=stamp.get("duration_s"),
                reason=stamp.get("reason") if isinstance(stamp.get("reason"), str) else None,
            )
        else:
            blocker = next(
                ((s, r["status"]) for s, r in out.items() if r["status"] != PASSED), None
            )
            if blocker:
                rec.update(status=NOT_REACHED, detail=f"not run; {blocker[0]} is {blocker[1]}")
            else:
                rec.update(status=SKIPPED, detail="not run")
        if rec["status"] == PASSED and (entry is None or entry["status"] == "up_to_date"):
            checked = verification.get(stage) or {}
            if not checked and entry is None and host.get("verification_error"):
                checked = {"status": UNVERIFIED, "problem": host["verification_error"]}
            stale = stale_upstream(stage, stamps)
            if checked.get("status") == DAMAGED:
                rec.update(status=DAMAGED, detail=f"damaged: {checked.get('problem')}")
            elif checked.get("status") == UNVERIFIED:
                rec.update(status=UNVERIFIED, detail=f"unverified: {checked.get('problem')}")
            elif stale:
                rec.update(status=STALE, detail=f"stale: {stale}")
        if rec["status"] == FAILED and first_failed is None:
            first_failed = stage
        out[stage] = rec
    return out


# --- artifact tests -----------------------------------------------------------------------

TESTCASE_ID = re.compile(r"^(?P<test>[^\[]+)\[(?P<param>.*)\]$")


def _host_of(param: str, hosts: list[str]) -> Optional[tuple[str, str]]:
    """(host, remaining parameter id) for a testinfra id like 'ansible://a2-node1' or
    'ansible://a2-node1-extra' (another parametrization after the host)."""
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


def read_artifact_junit(path: Path, hosts: list[str]) -> dict[str, list[dict[str, Any]]]:
    """{host: [testcase]} from a pytest junit XML; testcases without a known host are dropped."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as exc:
        raise InputError(
            f"{path}: cannot read it as XML ({exc}); expected a pytest junit XML"
        ) from exc
    if root.tag not in ("testsuites", "testsuite"):
        raise InputError(
            f"{path}: root element is <{root.tag}>; expected a pytest junit XML "
            "(<testsuites> or <testsuite>)"
        )
    by_host: dict[str, list[dict[str, Any]]] = {}
    for case in root.iter("testcase"):
        name = case.get("name", "")
        match = TESTCASE_ID.match(name)
        found = _host_of(match["param"], hosts) if match else None
        if not match or found is None:
            continue
        host, rest = found
        test = match["test"] + (f"[{rest}]" if rest else "")
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        skipped = case.find("skipped")
        if problem is not None:
            outcome = "failed"
            detail = problem
        elif skipped is not None:
            outcome, detail = "skipped", skipped
        else:
            outcome, detail = "passed", None
        message = None
        text = None
        if detail is not None:
            text = (detail.text or "").strip()
            message = detail.get("message") or _first_line(text) or outcome
        try:
            seconds = float(case.get("time", "0"))
        except ValueError:
            seconds = 0.0
        by_host.setdefault(host, []).append(
            {
                "name": name,
                "test": test,
                "classname": case.get("classname"),
                "outcome": outcome,
                "message": message,
                "text": text,
                "time": seconds,
            }
        )
    return by_host


def artifact_summary(cases: Optional[list[dict[str, Any]]]) -> dict[str, Any]:
    if not cases:
        return {"ran": False}
    count = {o: sum(c["outcome"] == o for c in cases) for o in ("passed", "failed", "skipped")}
    return {
        "ran": True,
        **count,
        "failures": [
            {"test": c["test"], "message": c["message"]} for c in cases if c["outcome"] == "failed"
        ],
    }


# --- the report ---------------------------------------------------------------------------


def _devices(env: dict[str, Any], profile: Optional[str]) -> Optional[str]:
    if not env:
        return None
    npu = env.get("npu") if isinstance(env.get("npu"), dict) else {}
    count = npu.get("device_count") or npu.get("npu_count") or 0
    if _is_number(count) and count > 0:
        chips = npu.get("chip_names") or []
        family = npu.get("family") or (chips[0] if chips else None) or "NPU"
        text = f"{fmt_num(count)} x {family}"
        hbm = [m for m in npu.get("hbm_total_mb") or [] if _is_number(m)]
        if hbm and len(set(hbm)) == 1:
            text += f", {fmt_num(hbm[0])} MB HBM each"
        elif hbm:
            text += f", HBM {'/'.join(fmt_num(m) for m in hbm)} MB"
        if npu.get("health_ok") is False:
            text += ", health check FAILED"
        return text
    cores, ram = env.get("cpu_count"), env.get("ram_total_gb")
    parts = []
    if _is_number(cores):
        parts.append(f"{fmt_num(cores)} cores")
    if _is_number(ram):
        parts.append(f"{float(ram):.1f} GB RAM")
    isa = _get(env, "stack", "cpu_isa")
    text = "cpu: " + (", ".join(parts) or "unknown")
    if isinstance(isa, list) and isa:
        text += f" ({', '.join(str(i) for i in isa)})"
    if profile not in (None, "cpu"):
        text = "no NPU found; " + text
    return text


def host_summary(host: dict[str, Any]) -> dict[str, Any]:
    state = host["state"] or {}
    stamps = state.get("stamps", {})
    env = state.get("environment") or {}
    versions = state.get("versions") or {}

    def metric(stage: str, *keys: str) -> Any:
        return _get(stamps.get(stage), "metrics", *keys)

    profile = env.get("profile") or host["settings"].get("profile")
    val_loss = metric("train", "metrics", "val_loss")
    if val_loss is None:
        val_loss = metric("train", "val_loss")
    wheelhouse = metric("speculators_install", "wheelhouse")
    return {
        "profile": profile,
        "devices": _devices(env, profile),
        "versions": {
            "python": versions.get("python") or _get(env, "stack", "python"),
            "speculators": metric("speculators_install", "speculators_version")
            or _get(versions, "versions", "speculators"),
            **{k: _get(versions, "versions", k) for k in VERSION_KEYS},
        },
        "sources": {
            "speculators": _get(stamps.get("speculators_install"), "inputs", "source"),
            "models": _get(stamps.get("models"), "inputs", "source"),
        },
        "wheelhouse": {
            "wheels": wheelhouse.get("wheels"),
            "bytes": wheelhouse.get("bytes"),
            "pushed_bytes": wheelhouse.get("pushed_bytes"),
        }
        if isinstance(wheelhouse, dict)
        else None,
        "model_bytes": {
            "verifier": metric("models", "verifier", "bytes"),
            "draft": metric("models", "draft", "bytes"),
        },
        "dataset_rows": metric("data", "rows"),
        "hidden_state_files": metric("hidden_states", "files"),
        "val_loss": val_loss,
        "acceptance_rate": metric("serve", "acceptance_rate"),
        "mean_acceptance_length": metric("serve", "mean_acceptance_length"),
        "num_drafts": metric("serve", "num_drafts"),
        "num_draft_tokens": metric("serve", "num_draft_tokens"),
        "num_accepted_tokens": metric("serve", "num_accepted_tokens"),
        "lossless": metric("serve", "lossless"),
        "smoke": {
            "content": metric("serve", "content"),
            "completion_tokens": metric("serve", "completion_tokens"),
            "finish_reason": metric("serve", "finish_reason"),
        },
    }


def effective_settings(host: dict[str, Any]) -> dict[str, Any]:
    """The play's settings, with the values the stages ran with (their stamps' inputs) over
    them: a stage run with `-e serve_num_speculative_tokens=3` shows 3, whatever the defaults."""
    stamps = (host["state"] or {}).get("stamps", {})
    out = dict(host["settings"])
    for setting, stage, *keys in EFFECTIVE_SETTINGS:
        value = _get(stamps.get(stage), "inputs", *keys)
        if value is not None:
            out[setting] = value
    return out


def not_green_reason(entry: dict[str, Any]) -> str:
    parts = []
    if entry["failed_stage"]:
        parts.append(f"{entry['failed_stage']} failed")
    elif not entry["reachable"]:
        parts.append("unreachable")
    else:
        damaged = [s for s, r in entry["stages"].items() if r["status"] == DAMAGED]
        for stage in damaged:
            parts.append(f"{stage} damaged")
        for stage, rec in entry["stages"].items():
            if rec["status"] != PASSED and not damaged:
                word = "would run" if rec["detail"].startswith("would run") else rec["status"]
                parts.append(f"{stage} {word}")
                break
    failed_tests = entry["artifact_tests"].get("failed") or 0
    if failed_tests:
        parts.append(f"{failed_tests} artifact test{'s' if failed_tests != 1 else ''} failed")
    return "; ".join(parts)


def build_report(
    doc: dict[str, Any], artifacts: Optional[dict[str, list[dict[str, Any]]]]
) -> dict[str, Any]:
    stages = doc["stages"]
    hosts = []
    for name, host in doc["hosts"].items():
        statuses = stage_statuses(stages, host)
        failed = next((s for s, r in statuses.items() if r["status"] == FAILED), None)
        first = statuses[failed] if failed else {}
        tests = artifact_summary((artifacts or {}).get(name))
        green = (
            host["reachable"]
            and all(r["status"] == PASSED for r in statuses.values())
            and not tests.get("failed")
        )
        entry = {
            "name": name,
            "group": _group(host["groups"]),
            "groups": host["groups"],
            "reachable": host["reachable"],
            "state_collected": host["state"] is not None,
            "green": bool(green),
            "wall_time_s": host["wall_time_s"],
            "failed_stage": failed,
            "error": first.get("error"),
            "log_tail": first.get("log_tail", []),
            "rerun": first.get("rerun"),
            "stages": statuses,
            "summary": host_summary(host),
            "settings": effective_settings(host),
            "artifact_tests": tests,
        }
        entry["not_green_reason"] = None if green else not_green_reason(entry)
        hosts.append(entry)
    hosts.sort(key=lambda h: (_group_rank(h["group"]), h["name"]))
    by_group: dict[str, dict[str, int]] = {}
    for h in hosts:
        bucket = by_group.setdefault(h["group"] or NO_GROUP, {"hosts": 0, "green": 0})
        bucket["hosts"] += 1
        bucket["green"] += h["green"]
    n_green = sum(h["green"] for h in hosts)
    return {
        "schema": SCHEMA,
        "report_id": doc["report_id"],
        "generated": doc["generated"],
        "playbook": doc["playbook"],
        "check_mode": doc["check_mode"],
        "limit": doc["limit"],
        "tags": doc["tags"],
        "green": bool(hosts) and n_green == len(hosts),
        "stages": stages,
        "totals": {
            "hosts": len(hosts),
            "green": n_green,
            "not_green": len(hosts) - n_green,
            "unreachable": sum(not h["reachable"] for h in hosts),
            "by_group": by_group,
        },
        "controller_sources": controller_sources(hosts),
        "hosts": hosts,
    }


def controller_sources(hosts: list[dict[str, Any]]) -> dict[str, Any]:
    """What the controller fetched once and pushed to the hosts (from their stamps): the
    wheelhouse (speculators_install_source=wheelhouse) and the models (models_source=controller)."""
    wheel_sets: dict[tuple[Any, Any], None] = {}
    wheels_pushed, wheel_hosts = 0, []
    models_bytes: dict[Any, None] = {}
    models_pushed, model_hosts = 0, []
    for h in hosts:
        s = h["summary"]
        wh = s.get("wheelhouse")
        if s["sources"].get("speculators") == "wheelhouse" and wh:
            wheel_sets[(wh.get("wheels"), wh.get("bytes"))] = None
            wheel_hosts.append(h["name"])
            wheels_pushed += wh.get("pushed_bytes") or 0
        if s["sources"].get("models") == "controller":
            size = sum(b for b in s["model_bytes"].values() if _is_number(b))
            models_bytes[size] = None
            model_hosts.append(h["name"])
            models_pushed += size
    return {
        "wheelhouse": {
            "hosts": wheel_hosts,
            "fetched_bytes": sum(b or 0 for _, b in wheel_sets) if wheel_hosts else None,
            "pushed_bytes": wheels_pushed if wheel_hosts else None,
        },
        "models": {
            "hosts": model_hosts,
            "fetched_bytes": sum(models_bytes) if model_hosts else None,
            "pushed_bytes": models_pushed if model_hosts else None,
        },
    }


# --- markdown -----------------------------------------------------------------------------


def md_text(value: Any) -> str:
    """Plain text safe in markdown prose and table cells."""
    text = " ".join(_clean_text(str(value)).split())
    text = re.sub(r"([\\`*<>\[\]|])", r"\\\1", text)
    return re.sub(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])", r"\_", text)


def md_code(value: Any) -> str:
    """An inline code span that holds any text (backticks, non-ASCII) intact on one line."""
    text = str(value).replace("\r", "\\r").replace("\n", "\\n")
    if not text:
        return '`""`'
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text[0] == "`" or text[-1] == "`" or (text[0] == text[-1] == " ") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def md_block(lines: list[str], info: str = "text") -> list[str]:
    body = [_clean_text(line).rstrip("\n") for line in lines]
    longest = max((len(run) for line in body for run in re.findall(r"`{3,}", line)), default=0)
    fence = "`" * max(3, longest + 1)
    return [f"{fence}{info}", *body, fence]


def fmt_seconds(value: Any) -> str:
    if not _is_number(value) or not math.isfinite(value):
        return "-"
    if value < 60:
        return f"{value:.1f}s"
    minutes, seconds = divmod(round(value), 60)
    if minutes < 60:
        return f"{minutes}m {seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


def fmt_num(value: Any) -> str:
    if not _is_number(value):
        return "-"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def fmt_bytes(value: Any) -> str:
    if not _is_number(value):
        return "-"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{fmt_num(value)} B"


def stage_cell(rec: dict[str, Any]) -> str:
    status = rec["status"]
    if status == PASSED:
        if rec["detail"] == "up to date":
            return "up to date"
        return (
            f"passed {fmt_seconds(rec['duration_s'])}"
            if _is_number(rec["duration_s"])
            else "passed"
        )
    if status == FAILED:
        return "FAILED"
    if status == SKIPPED and rec["detail"].startswith("would run"):
        return "would run"
    return status


def artifact_cell(tests: dict[str, Any]) -> str:
    if not tests.get("ran"):
        return "-"
    if tests["failed"]:
        return f"{tests['failed']} failed"
    cell = f"{tests['passed']}/{tests['passed'] + tests['failed']}"
    return cell + (f", {tests['skipped']} skipped" if tests["skipped"] else "")


def _names(items: list[str]) -> str:
    shown = ", ".join(items[:MAX_NAMES])
    return shown + (f" and {len(items) - MAX_NAMES} more" if len(items) > MAX_NAMES else "")


def verdict(report: dict[str, Any]) -> str:
    hosts = report["hosts"]
    total = len(hosts)
    if not hosts:
        return "**NOT GREEN**: the report has no hosts"
    if report["green"]:
        return f"**GREEN**: {total} of {total} hosts passed every stage"
    failed, unreachable, incomplete = [], [], []
    for h in hosts:
        if h["green"]:
            continue
        name = md_text(h["name"])
        tests_failed = h["artifact_tests"].get("failed") or 0
        damaged = [
            md_text(s) + " damaged" for s, r in h["stages"].items() if r["status"] == DAMAGED
        ]
        if not h["reachable"] and not h["failed_stage"]:
            unreachable.append(name)
        elif h["failed_stage"] or tests_failed or damaged:
            what = ([md_text(h["failed_stage"])] if h["failed_stage"] else []) + damaged
            if tests_failed:
                what.append(f"{tests_failed} artifact test{'s' if tests_failed != 1 else ''}")
            failed.append(f"{name}: {', '.join(what)}")
        else:
            incomplete.append(f"{name}: {md_text(h['not_green_reason'])}")
    parts = []
    for label, items in (
        ("failed", failed),
        ("unreachable", unreachable),
        ("incomplete", incomplete),
    ):
        if items:
            count = f"{len(items)} of {total} hosts" if not parts else str(len(items))
            parts.append(f"{count} {label} ({_names(items)})")
    prefix = "check mode, " if report["check_mode"] else ""
    return f"**NOT GREEN**: {prefix}{'; '.join(parts)}"


def render_markdown(report: dict[str, Any]) -> str:
    stages = report["stages"]
    tags = ", ".join(report["tags"])
    out = [
        f"# specfleet fleet report {md_text(report['report_id'])}",
        "",
        f"Generated {md_text(report['generated'] or '-')}; playbook "
        f"{md_code(report['playbook']) if report['playbook'] else '-'}; limit "
        f"{md_code(report['limit']) if report['limit'] else 'none'}; tags "
        f"{md_code(tags) if report['tags'] else '-'}; check mode "
        f"{'yes' if report['check_mode'] else 'no'}.",
        "",
        verdict(report),
        "",
    ]
    header = ["Host", "Group", *[md_text(s) for s in stages], "Artifacts", "Wall time"]
    out.append("| " + " | ".join(header) + " |")
    out.append("|" + "|".join("---" for _ in header) + "|")
    for h in report["hosts"]:
        cells = [
            md_text(h["name"]),
            md_text(h["group"] or "-"),
            *[stage_cell(h["stages"][s]) for s in stages],
            artifact_cell(h["artifact_tests"]),
            fmt_seconds(h["wall_time_s"]),
        ]
        out.append("| " + " | ".join(cells) + " |")
    sources = report.get("controller_sources") or {}
    lines = []
    for kind, label in (("wheelhouse", "Wheelhouse"), ("models", "Models")):
        src = sources.get(kind) or {}
        if src.get("hosts"):
            lines.append(
                f"- {label}: {fmt_bytes(src['fetched_bytes'])} fetched once on the controller; "
                f"{fmt_bytes(src['pushed_bytes'])} pushed to {len(src['hosts'])} host(s) "
                f"({md_text(', '.join(src['hosts']))}), when their stage last ran"
            )
    if lines:
        out += ["", "Controller sources:", "", *lines]
    for h in report["hosts"]:
        out += ["", *host_section(h, stages)]
    return "\n".join(out) + "\n"


def host_section(h: dict[str, Any], stages: list[str]) -> list[str]:
    title = md_text(h["name"]) + (f" ({md_text(h['group'])})" if h["group"] else "")
    out = [f"## {title}", ""]
    if not h["reachable"]:
        out += ["Host **unreachable**.", ""]
    if h["failed_stage"]:
        rec = h["stages"][h["failed_stage"]]
        out.append(f"- **Failed stage:** {md_text(h['failed_stage'])} ({md_text(rec['detail'])})")
        error = _clean_text(h["error"] or "")
        if "\n" in error.strip():
            out += [
                "- **Error:**",
                "",
                *["  " + line for line in md_block(error.strip().splitlines())],
            ]
        else:
            out.append(f"- **Error:** {md_code(error.strip() or '-')}")
        out.append(f"- **Re-run:** {md_code(h['rerun']) if h['rerun'] else '-'}")
        if rec["log"]:
            out.append(f"- **Log:** {md_code(rec['log'])}")
        out.append("")
        if h["log_tail"]:
            out += ["Log tail:", "", *md_block(h["log_tail"]), ""]
    other = [
        (s, r) for s, r in h["stages"].items() if r["status"] not in (PASSED, FAILED, UNREACHABLE)
    ]
    if other:
        out.append("Stages not passed:")
        out += [f"- {md_text(s)}: {r['status']}, {md_text(r['detail'])}" for s, r in other]
        out.append("")
    # each list follows a paragraph, so that adjacent lists never merge into one
    out.append("Stack and results:" if h["state_collected"] else "No state was read from the host.")
    out.append("")
    s = h["summary"]
    v = s["versions"]
    versions = ", ".join(f"{md_text(k)} {md_code(v[k]) if v[k] else '-'}" for k in v)
    sources = []
    for kind in ("speculators", "models"):
        text = f"{kind} {md_text(s['sources'][kind] or '-')}"
        if kind == "speculators" and s["wheelhouse"]:
            wheels = s["wheelhouse"]
            text += (
                f" (wheelhouse: {fmt_num(wheels['wheels'])} wheels, {fmt_bytes(wheels['bytes'])})"
            )
        if kind == "models" and any(_is_number(b) for b in s["model_bytes"].values()):
            mb = s["model_bytes"]
            text += f" (verifier {fmt_bytes(mb['verifier'])}, draft {fmt_bytes(mb['draft'])})"
        sources.append(text)
    rate = s["acceptance_rate"]
    loss = s["val_loss"]
    mean = s["mean_acceptance_length"]
    smoke = s["smoke"]
    if smoke["content"] is None:
        smoke_text = "-"
    else:
        smoke_text = (
            f"{md_code(smoke['content'])} ({fmt_num(smoke['completion_tokens'])} tokens, "
            f"finish reason {md_text(smoke['finish_reason'] or '-')})"
        )
    lossless = {True: "passed", False: "**FAILED**", None: "-"}.get(s["lossless"], "-")
    results = [
        f"- Profile: {md_text(s['profile'] or '-')}",
        f"- Devices: {md_text(s['devices'] or '-')}",
        f"- Versions: {versions}",
        f"- Sources: {'; '.join(sources)}",
        f"- Dataset rows: {fmt_num(s['dataset_rows'])}",
        f"- Hidden-state files: {fmt_num(s['hidden_state_files'])}",
        f"- Val loss: {f'{loss:.4g}' if _is_number(loss) else '-'}",
        f"- Acceptance rate: {f'{rate * 100:.1f}%' if _is_number(rate) else '-'}",
        f"- Mean acceptance length: {f'{mean:.2f}' if _is_number(mean) else '-'}",
        f"- Drafts: {fmt_num(s['num_drafts'])} ({fmt_num(s['num_draft_tokens'])} draft tokens, "
        f"{fmt_num(s['num_accepted_tokens'])} accepted)",
        f"- Smoke completion: {smoke_text}",
        f"- Lossless check: {lossless}",
    ]
    if h["state_collected"]:
        out += results
    settings = h["settings"]
    if settings:
        shown = ", ".join(
            f"{md_text(k)} {md_code(v if isinstance(v, str) else json.dumps(v))}"
            for k, v in settings.items()
        )
        out.append(f"- Settings: {shown}")
    else:
        out.append("- Settings: -")
    tests = h["artifact_tests"]
    if tests.get("failures"):
        out += ["", "Failed artifact tests:"]
        out += [
            f"- {md_code(f['test'])}: {md_text(f['message'] or '-')}" for f in tests["failures"]
        ]
    return out


# --- junit --------------------------------------------------------------------------------


def _xml(value: Any) -> str:
    return _clean_text(str(value))


def _seconds(value: Any) -> float:
    return float(value) if _is_number(value) and math.isfinite(value) else 0.0


def render_junit(
    report: dict[str, Any], artifacts: Optional[dict[str, list[dict[str, Any]]]]
) -> ET.ElementTree:
    root = ET.Element("testsuites", name="specfleet")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0, "time": 0.0}
    for h in report["hosts"]:
        suite = ET.SubElement(root, "testsuite", name=_xml(h["name"]), hostname=_xml(h["name"]))
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0, "time": 0.0}
        classname = f"specfleet.{h['group'] or NO_GROUP}.{h['name']}"
        for stage, rec in h["stages"].items():
            seconds = _seconds(rec["duration_s"])
            case = ET.SubElement(
                suite,
                "testcase",
                classname=_xml(classname),
                name=_xml(stage),
                time=f"{seconds:.3f}",
            )
            counts["tests"] += 1
            counts["time"] += seconds
            if rec["status"] == FAILED:
                counts["failures"] += 1
                body = [rec["error"] or rec["detail"]]
                if rec["log_tail"]:
                    body += ["", f"--- log tail ({rec['log'] or 'log'}) ---", *rec["log_tail"]]
                if rec["rerun"]:
                    body += ["", f"re-run: {rec['rerun']}"]
                failure = ET.SubElement(case, "failure", message=_xml(rec["detail"]))
                failure.text = _xml("\n".join(body))
            elif rec["status"] == DAMAGED:
                counts["failures"] += 1
                failure = ET.SubElement(case, "failure", message=_xml(rec["detail"]))
                failure.text = _xml(rec["detail"])
            elif rec["status"] in (SKIPPED, NOT_REACHED, STALE, UNVERIFIED):
                counts["skipped"] += 1
                ET.SubElement(case, "skipped", message=_xml(f"{rec['status']}: {rec['detail']}"))
            elif rec["status"] == UNREACHABLE:
                counts["errors"] += 1
                ET.SubElement(case, "error", message="host unreachable")
        for test in (artifacts or {}).get(h["name"], []):
            case = ET.SubElement(
                suite,
                "testcase",
                classname=_xml(f"{classname}.artifacts"),
                name=_xml(test["name"]),
                time=f"{test['time']:.3f}",
            )
            counts["tests"] += 1
            counts["time"] += test["time"]
            if test["outcome"] == "failed":
                counts["failures"] += 1
                failure = ET.SubElement(case, "failure", message=_xml(test["message"]))
                failure.text = _xml(test["text"] or test["message"])
            elif test["outcome"] == "skipped":
                counts["skipped"] += 1
                ET.SubElement(case, "skipped", message=_xml(test["message"]))
        for key, value in counts.items():
            suite.set(key, f"{value:.3f}" if key == "time" else str(value))
            totals[key] += value
    for key, value in totals.items():
        root.set(key, f"{value:.3f}" if key == "time" else str(value))
    ET.indent(root)
    return ET.ElementTree(root)


# --- writing ------------------------------------------------------------------------------


def _write_atomic(path: Path, write: Callable[[Path], object]) -> None:
    """write(tmp_path) then rename over path; an interrupted write leaves only a dot-tmp file,
    removed here when the write raised."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_report(
    report: dict[str, Any], artifacts: Optional[dict[str, list[dict[str, Any]]]], out_dir: Path
) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    markdown = render_markdown(report)
    tree = render_junit(report, artifacts)
    document = json.dumps(_finite(report), indent=2, ensure_ascii=False) + "\n"
    _write_atomic(
        out_dir / "junit.xml", lambda p: tree.write(p, encoding="utf-8", xml_declaration=True)
    )
    _write_atomic(out_dir / "fleet.md", lambda p: p.write_text(markdown, encoding="utf-8"))
    # fleet.json last: when it is complete, so are the other two
    _write_atomic(out_dir / "fleet.json", lambda p: p.write_text(document, encoding="utf-8"))


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specfleet_helpers.report.fleet_report",
        description=(
            "Write fleet.json, fleet.md and junit.xml for one run over a fleet and print one "
            "JSON line with the verdict. Exit 0 when written (green or not), 2 on bad input."
        ),
    )
    parser.add_argument(
        "--input", type=Path, required=True, help="the host report JSON collected by the play"
    )
    parser.add_argument(
        "--out-dir", type=Path, required=True, help="directory for the report (created)"
    )
    parser.add_argument(
        "--artifact-junit",
        type=Path,
        help="pytest junit XML of the testinfra artifact suite run against the hosts",
    )
    args = parser.parse_args(argv)
    try:
        doc = load_input(args.input)
        artifacts = None
        if args.artifact_junit is not None:
            artifacts = read_artifact_junit(args.artifact_junit, list(doc["hosts"]))
    except InputError as exc:
        print(f"fleet_report: error: {exc}", file=sys.stderr)
        return 2
    report = build_report(doc, artifacts)
    try:
        write_report(report, artifacts, args.out_dir)
    except OSError as exc:
        print(f"fleet_report: cannot write the report to {args.out_dir}: {exc}", file=sys.stderr)
        return 1
    line = {
        "green": report["green"],
        "report_dir": os.path.abspath(args.out_dir),
        "hosts": len(report["hosts"]),
        "green_hosts": [h["name"] for h in report["hosts"] if h["green"]],
        "not_green_hosts": {
            h["name"]: h["not_green_reason"] for h in report["hosts"] if not h["green"]
        },
    }
    print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
