"""Turn one run over a fleet into a report: fleet.json, fleet.md, fleet.html and junit.xml.

A play collects, per host, what this run did to each stage and what the host's work root
holds (stamps, failure records, npu_env.json, the stack versions) into one JSON document.
This module decides, per host and stage, passed | failed | skipped | not reached |
unreachable, whether each host and the fleet are green, and writes four views of it: a
machine-readable fleet.json (schema "specfleet.fleet/1", see docs/fleet-report.md), a
fleet.md to read at a glance, a fleet.html to open in a browser (fleet_html), and a junit.xml
that any CI renders. The optional pytest
junit XML of the testinfra artifact suite is mapped to hosts and folded in.

It never decides what to fail: it exits 0 whenever the files were written, green or not,
and prints one JSON line for the play to act on. Malformed input exits 2 with a message
naming the file and what was expected (the input and the output are described by
docs/fleet-report.schema.json, checked with jsonschema). Runs on the Ansible controller.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Callable, Optional

import jinja2
import jsonschema

from specfleet_helpers.files import atomic_path, write_atomic
from specfleet_helpers.report import fleet_html
from specfleet_helpers.report.formats import (
    DAMAGED,
    FAILED,
    FILTERS,
    NO_GROUP,
    NOT_REACHED,
    PASSED,
    SKIPPED,
    STALE,
    UNREACHABLE,
    UNVERIFIED,
    clean_text,
    fmt_bytes,
    fmt_num,
    is_number,
    nothing_redone,
    parse_time,
    redone_stages,
    would_run_stages,
)
from specfleet_helpers.report.testcases import REUSED_FROM, testcase_host

SCHEMA = "specfleet.fleet/1"
# Input and output, as JSON Schema: the checkout's docs/ (this runs on the controller).
SCHEMA_FILE = Path(__file__).resolve().parents[3] / "docs" / "fleet-report.schema.json"
FLEET_GROUPS = ("atlas-a2", "atlas-a3", "ascend-950")
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


def _schema(name: str) -> dict[str, Any]:
    """One definition of the schema file (input, report), with the file's $defs for refs."""
    try:
        doc = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read the schema {SCHEMA_FILE}: {exc}") from exc
    return {**doc, "$ref": f"#/$defs/{name}"}


def _where(path: Any) -> str:
    """An error's place in the document, as the messages have always named it:
    hosts["a2-node1"].run.train.status"""
    keys = list(path)
    out = ""
    for i, key in enumerate(keys):
        if isinstance(key, int) or (i == 1 and keys[0] == "hosts"):
            out += f"[{json.dumps(key)}]"
        else:
            out += ("." if out else "") + str(key)
    return out


def schema_problem(doc: Any, name: str) -> Optional[str]:
    """The most relevant way `doc` breaks the schema's definition `name`, in one line, or None."""
    validator = jsonschema.Draft202012Validator(_schema(name))
    error = jsonschema.exceptions.best_match(validator.iter_errors(doc))
    if error is None:
        return None
    where = _where(error.absolute_path)
    if error.validator == "required":
        key = next(k for k in error.validator_value if k not in error.instance)
        return f"{where}: missing key {key!r}" if where else f"missing top-level key {key!r}"
    expected = error.schema.get("x-expected") if isinstance(error.schema, dict) else None
    if expected is None:
        return f"{where or 'top level'}: {error.message}"
    return f"{where or 'top level'}: expected {expected}, got {_kind(error.instance)}"


def _or(obj: dict[str, Any], key: str, default: Any = None) -> Any:
    value = obj.get(key)
    return default if value is None else value


def validate(doc: Any) -> dict[str, Any]:
    """Check the collected document against the schema file (docs/fleet-report.schema.json)
    and fill optional fields with defaults. Raises InputError naming the offending field."""
    problem = schema_problem(doc, "input")
    if problem:
        raise InputError(problem)
    clean: dict[str, Any] = {
        "report_id": doc["report_id"],
        "generated": doc.get("generated"),
        "playbook": doc.get("playbook"),
        "check_mode": _or(doc, "check_mode", False),
        "limit": doc.get("limit"),
        "tags": _or(doc, "tags", []),
        "ended_early": doc.get("ended_early"),
        "stages": doc["stages"],
        "hosts": {},
    }
    for name, host in doc["hosts"].items():
        state = host.get("state")
        if state is not None:
            state = {
                "stamps": _or(state, "stamps", {}),
                "failures": _or(state, "failures", {}),
                "environment": _or(state, "environment", {}),
                "versions": _or(state, "versions", {}),
            }
        clean["hosts"][name] = {
            "groups": _or(host, "groups", []),
            "verification": host.get("verification"),
            "reachable": host["reachable"],
            "wall_time_s": host.get("wall_time_s"),
            "settings": _or(host, "settings", {}),
            "verification_error": host.get("verification_error"),
            "restored_modes": _or(host, "restored_modes", []),
            "state": state,
            "run": _or(host, "run", {}),
            "unreachable_error": host.get("unreachable_error"),
            "refused": host.get("refused"),
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
        raise InputError(f"{path}: {exc} (schema: docs/{SCHEMA_FILE.name})") from exc


# --- small helpers ------------------------------------------------------------------------


def _get(obj: Any, *keys: str) -> Any:
    """obj[k1][k2]... or None as soon as a level is missing or not an object."""
    for key in keys:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


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
    failed_at, ended = parse_time(failure.get("time")), parse_time(stamp.get("ended"))
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
    refused = host.get("refused")
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
            "this_run": None,
            "ended": None,
        }
        if refused:
            # Refused before any host work: nothing ran, whatever the host holds.
            if stage == refused["stage"]:
                rec.update(
                    status=FAILED,
                    this_run="refused",
                    detail=f"settings refused: {_first_line(refused['error'])}",
                    error=refused["error"],
                )
            else:
                rec.update(
                    status=NOT_REACHED,
                    detail=f"not run: {refused['stage']}'s settings were refused",
                )
            out[stage] = rec
            continue
        entry = host["run"].get(stage)
        stamp = stamps.get(stage)
        if stamp is None and stage == ENVIRONMENT_STAGE and state.get("environment"):
            # npu_env leaves npu_env.json (what the host is), not a stamp.
            stamp = {"ended": None}
        if entry is not None:
            status, reason = entry["status"], entry.get("reason")
            ended = (failures.get(stage) or {}).get("time") if status == "failed" else None
            rec.update(
                this_run=status,
                ended=ended or (stamp or {}).get("ended"),
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
            elif status == "held":
                # A rollout stopped before this host's batch (playbooks/serve.yml).
                rec.update(status=SKIPPED, detail=f"held: {reason}" if reason else "held")
            else:
                error = entry.get("error")
                rec.update(status=FAILED, detail=_first_line(error) or "failed", error=error)
        elif first_failed is not None:
            rec.update(status=NOT_REACHED, detail=f"after {first_failed} failed")
        elif not host["reachable"]:
            why = _first_line(host.get("unreachable_error"))
            rec.update(
                status=UNREACHABLE, detail=f"host unreachable: {why}" if why else "host unreachable"
            )
        elif stage in failures and _failure_is_newer(failures[stage], stamp):
            failure = failures[stage]
            at = failure.get("time") or "an unknown time"
            rec.update(
                status=FAILED,
                detail=f"failed in an earlier run at {at}",
                ended=failure.get("time"),
                error=failure.get("error"),
                log=failure.get("log"),
                rerun=failure.get("rerun"),
                log_tail=failure.get("log_tail") or [],
            )
        elif stamp is not None:
            rec.update(
                status=PASSED,
                detail=f"earlier run, ended {stamp.get('ended') or 'at an unknown time'}",
                ended=stamp.get("ended"),
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
        found = testcase_host(name, hosts)
        if found is None:
            continue
        test, host = found
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
            message = readable_failure(detail.get("message") or _first_line(text) or outcome)
        try:
            seconds = float(case.get("time", "0"))
        except ValueError:
            seconds = 0.0
        reused_from = next(
            (p.get("value") for p in case.iter("property") if p.get("name") == REUSED_FROM), None
        )
        by_host.setdefault(host, []).append(
            {
                "name": name,
                "test": test,
                "classname": case.get("classname"),
                "outcome": outcome,
                "message": message,
                "text": text,
                "time": seconds,
                "reused_from": reused_from,
            }
        )
    return by_host


# pytest's assertion rewriting: the lines after an assertion's own message that show how
# Python evaluated it ("assert False", "+  where False = <built-in method ... at 0x7f...>").
_INTROSPECTION = re.compile(r"^\s*(assert |\+|where |and |or |At index|Full diff|Use -v)")
_ADDRESS = re.compile(r" at 0x[0-9a-f]+>")


def readable_failure(message: str) -> str:
    """A failed test's message as a person reads it: the assertion's own message, without
    pytest's evaluation of the expression and the objects' memory addresses."""
    kept = []
    for line in str(message).splitlines():
        if kept and _INTROSPECTION.match(line):
            break
        kept.append(line)
    text = _ADDRESS.sub(">", "\n".join(kept).strip())
    return text.removeprefix("AssertionError: ") or str(message).strip()


def artifact_summary(cases: Optional[list[dict[str, Any]]]) -> dict[str, Any]:
    """The host's artifact tests, counted; `reused_from` names the report whose verdict stands
    for this run when the suite was not run again (nothing it reads changed: artifact_suite)."""
    if not cases:
        return {"ran": False}
    count = {o: sum(c["outcome"] == o for c in cases) for o in ("passed", "failed", "skipped")}
    reused = {c.get("reused_from") for c in cases}
    return {
        "ran": True,
        **count,
        "failures": [
            {"test": c["test"], "message": c["message"]} for c in cases if c["outcome"] == "failed"
        ],
        "reused_from": reused.pop() if len(reused) == 1 else None,
    }


# --- the report ---------------------------------------------------------------------------


def _devices(env: dict[str, Any], profile: Optional[str]) -> Optional[str]:
    if not env:
        return None
    npu = env.get("npu") if isinstance(env.get("npu"), dict) else {}
    count = npu.get("device_count") or npu.get("npu_count") or 0
    if is_number(count) and count > 0:
        chips = npu.get("chip_names") or []
        family = npu.get("family") or (chips[0] if chips else None) or "NPU"
        text = f"{fmt_num(count)} x {family}"
        hbm = [m for m in npu.get("hbm_total_mb") or [] if is_number(m)]
        if hbm and len(set(hbm)) == 1:
            text += f", {fmt_num(hbm[0])} MB HBM each"
        elif hbm:
            text += f", HBM {'/'.join(fmt_num(m) for m in hbm)} MB"
        if npu.get("health_ok") is False:
            text += ", health check FAILED"
        return text
    cores, ram = env.get("cpu_count"), env.get("ram_total_gb")
    parts = []
    if is_number(cores):
        parts.append(f"{fmt_num(cores)} cores")
    if is_number(ram):
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
        # What npu_env warned of although nothing failed (a 950PR host, an image whose
        # vllm-ascend replaces a reduced-vocabulary draft's lm_head), and that gate as read;
        # what this run's close set again under the work root (the write bit for others).
        "warnings": [w for w in env.get("warnings") or [] if isinstance(w, str)]
        + (
            [f"the work root had what others may write to; set again: {', '.join(restored)}"]
            if (restored := host.get("restored_modes"))
            else []
        ),
        "dflash_lm_head_gate": _get(env, "stack", "dflash_lm_head", "gate"),
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
        # speculators' global step at the published checkpoint: optimizer steps of each rank
        "optimizer_steps": metric("train", "metrics", "training_state", "global_step"),
        "acceptance_rate": metric("serve", "acceptance_rate"),
        "acceptance_measured_on": metric("serve", "acceptance_measured_on"),
        "mean_acceptance_length": metric("serve", "mean_acceptance_length"),
        "bench": bench_summary(metric("serve", "bench")),
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


def _median(spread: Any) -> Any:
    return spread.get("median") if isinstance(spread, dict) else None


def draft_summary(measured: Any) -> Optional[dict[str, Any]]:
    """One draft's figures of a measurement (serve_bench.summarize), flat: medians over the
    rounds, the speedup's spread."""
    if not isinstance(measured, dict):
        return None
    speedup = measured.get("speedup") if isinstance(measured.get("speedup"), dict) else {}
    return {
        "draft": measured.get("draft"),
        "acceptance_rate": measured.get("acceptance_rate"),
        "mean_acceptance_length": measured.get("mean_acceptance_length"),
        "per_position_acceptance": measured.get("per_position_acceptance"),
        "output_throughput": _median(measured.get("output_throughput")),
        "mean_tpot_ms": _median(measured.get("mean_tpot_ms")),
        "speedup": speedup.get("median"),
        "speedup_min": speedup.get("min"),
        "speedup_max": speedup.get("max"),
        "speedup_tpot": _median(measured.get("speedup_tpot")),
    }


def bench_summary(bench: Any) -> Optional[dict[str, Any]]:
    """The measurement of a serve stamp's `bench` (serve_bench.summarize), for the report: the
    plain verifier, the trained draft and the yardstick, side by side."""
    if not isinstance(bench, dict) or not isinstance(bench.get("trained"), dict):
        return None
    plain = bench.get("plain") if isinstance(bench.get("plain"), dict) else {}
    trained = draft_summary(bench.get("trained")) or {}
    throughput = plain.get("output_throughput") if isinstance(plain, dict) else None
    dates = plain.get("dates") if isinstance(plain.get("dates"), list) else []
    return {
        "rounds": bench.get("rounds"),
        "servers": bench.get("servers"),
        "plain_output_throughput": _median(throughput),
        "plain_output_throughput_min": throughput.get("min")
        if isinstance(throughput, dict)
        else None,
        "plain_output_throughput_max": throughput.get("max")
        if isinstance(throughput, dict)
        else None,
        "plain_mean_tpot_ms": _median(plain.get("mean_tpot_ms")),
        "trained": trained,
        "yardstick": draft_summary(bench.get("yardstick")),
        # the trained draft's, under the names the host table sorts by
        "speedup_output_throughput": trained.get("speedup"),
        "per_position_acceptance": trained.get("per_position_acceptance"),
        "measured": dates[0] if dates else None,
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


def _cut(text: Any, limit: int) -> str:
    """Jinja's truncate(limit): whole within limit + 5, else cut at a word and ended with '...'."""
    said = "" if text is None else str(text)
    if len(said) <= limit + 5:
        return said
    return said[: limit - 3].rsplit(" ", 1)[0] + "..."


def gate_verdict(entry: dict[str, Any], report_dir: str) -> dict[str, Any]:
    """What the validate role's gate does with a host after the report (its one task,
    specfleet_verdict): {unreachable: true, msg} ends it as unreachable; {fail: msg} fails it
    (its settings refused, a stage failed, a stage damaged, artifact tests failed); neither:
    it passes. Stages skipped or stale (--tags, --check) do not fail it: the next full run
    redoes them. A refusal's message is whole: it says what to fix."""
    # The report on a line of its own under the message (what the console shows last).
    name, where = entry["name"], f"\nreport: {report_dir}/fleet.md"
    if not entry["reachable"] and not entry["failed_stage"]:
        said = f"{name} is not green: unreachable: {_cut(entry.get('error') or '', 300)};{where}"
        return {"unreachable": True, "msg": said}
    damaged = [s for s, r in entry["stages"].items() if r["status"] == DAMAGED]
    tests = entry["artifact_tests"]
    refused = entry.get("refused")
    if isinstance(refused, dict):
        why = f"settings refused ({refused.get('stage')}): {refused.get('error')}"
    elif entry["failed_stage"]:
        why = f"stage {entry['failed_stage']} failed: {_cut(entry.get('error') or '', 300)}"
    elif damaged:
        why = _cut("; ".join(f"{s} {entry['stages'][s].get('detail', '')}" for s in damaged), 600)
    elif int(tests.get("failed") or 0) > 0:
        failures = tests.get("failures") or [{}]
        why = (
            f"{tests['failed']} artifact test(s) failed: "
            f"{', '.join(str(f.get('test', '')) for f in tests.get('failures') or [])} "
            f"({_cut(failures[0].get('message', ''), 300)})"
        )
    else:
        return {}
    return {"fail": f"{name} is not green: {why};{where}"}


def not_green_reason(entry: dict[str, Any]) -> str:
    parts = []
    if entry["refused"]:
        parts.append(f"{entry['refused']['stage']} settings refused")
    elif entry["failed_stage"]:
        parts.append(f"{entry['failed_stage']} failed")
    elif not entry["reachable"]:
        parts.append("unreachable")
    else:
        damaged = [s for s, r in entry["stages"].items() if r["status"] == DAMAGED]
        for stage in damaged:
            parts.append(f"{stage} damaged")
        for stage, rec in entry["stages"].items():
            if rec["status"] != PASSED and not damaged:
                word = next(
                    (w for w in ("would run", "held") if rec["detail"].startswith(w)), rec["status"]
                )
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
            # its settings were refused before any work: {stage (the role), error}
            "refused": host.get("refused"),
            # an unreachable host's error is the connection error
            "error": (
                (host.get("refused") or {}).get("error")
                or (first.get("error") if failed else host.get("unreachable_error"))
            ),
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
    report = {
        "schema": SCHEMA,
        "report_id": doc["report_id"],
        "generated": doc["generated"],
        "playbook": doc["playbook"],
        "check_mode": doc["check_mode"],
        "limit": doc["limit"],
        "tags": doc["tags"],
        "ended_early": doc["ended_early"],
        # ended by Ctrl-C (playbooks/interrupted.yml says where: "interrupted at ...")
        "interrupted": str(doc["ended_early"] or "").startswith("interrupted"),
        "outcome": None,
        # a run that ended before its report checked nothing it did not reach
        "green": bool(hosts) and n_green == len(hosts) and not doc["ended_early"],
        "stages": stages,
        "totals": {
            "hosts": len(hosts),
            "green": n_green,
            "not_green": len(hosts) - n_green,
            "unreachable": sum(not h["reachable"] for h in hosts),
            "by_group": by_group,
        },
        "controller_sources": controller_sources(hosts),
        "jobs": job_summaries(doc, hosts),
        "hosts": hosts,
    }
    report["outcome"] = run_outcome(report)
    return report


def run_outcome(report: dict[str, Any]) -> Optional[str]:
    """Why this run redid nothing, when that is not "every stage was up to date": check mode,
    a run that ended early, every host refused or unreachable. None otherwise."""
    hosts = report["hosts"]
    if report["check_mode"]:
        return "check mode changes nothing"
    if report["ended_early"]:
        return str(report["ended_early"])
    if hosts and all(h["refused"] for h in hosts):
        return "the settings were refused before any host work"
    if hosts and all(not h["reachable"] for h in hosts):
        return "no host could be reached"
    if hosts and all(h["refused"] or not h["reachable"] for h in hosts):
        return "every host was refused or unreachable"
    return None


def _sha256_of(files: Any, name: str) -> Optional[str]:
    for entry in files if isinstance(files, list) else []:
        if isinstance(entry, dict) and entry.get("name") == name:
            return entry.get("sha256")
    return None


def job_summaries(doc: dict[str, Any], hosts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per job of several hosts (specfleet_job), from its hosts' stamps: the hosts in
    node order with their share of the rows and of the hidden-state files, their time in train
    and the checksum of the draft each published; the job's ranks, rows and loss; whether every
    host has the same draft; and the hosts lost to it (unreachable, or named by address in
    another host's train failure: the peer its collectives lost). A host that could not report
    (unreachable) is known from the others' list of the job's hosts."""
    entries = {h["name"]: h for h in hosts}
    by_job: dict[str, list[str]] = {}
    for raw in doc["hosts"].values():
        job = (raw.get("settings") or {}).get("job") or {}
        if job.get("name") and len(job.get("hosts") or []) > 1:
            by_job.setdefault(job["name"], list(job["hosts"]))
    jobs = []
    for job_name, names in sorted(by_job.items()):
        per_host, nproc, rows, loss = [], None, None, None
        # what each host's own entry says ({} for a host that could not report)
        reported = {name: entries.get(name) or {} for name in names}
        train_results = {n: (reported[n].get("stages") or {}).get("train") or {} for n in names}
        for rank, name in enumerate(names):
            raw = doc["hosts"].get(name) or {}
            job = (raw.get("settings") or {}).get("job") or {}
            stamps = (raw.get("state") or {}).get("stamps") or {}
            hs_metrics = _get(stamps.get("hidden_states"), "metrics") or {}
            train = stamps.get("train") or {}
            nproc = nproc or _get(train, "inputs", "nproc_per_node")
            rows = rows or _get(stamps.get("data"), "metrics", "rows")
            host_loss = _get(train, "metrics", "metrics", "val_loss")
            loss = loss if loss is not None else host_loss
            per_host.append(
                {
                    "host": name,
                    "node_rank": rank,
                    "address": job.get("address"),
                    "rows_first": hs_metrics.get("first"),
                    "hidden_state_files": hs_metrics.get("files"),
                    "train": train_results[name].get("status"),
                    "train_s": train.get("duration_s"),
                    "optimizer_steps": _get(
                        train, "metrics", "metrics", "training_state", "global_step"
                    ),
                    "draft_sha256": _sha256_of(
                        _get(train, "metrics", "files"), "model.safetensors"
                    ),
                }
            )
        checksums = {p["draft_sha256"] for p in per_host}
        addresses = {p["address"]: p["host"] for p in per_host if p["address"]}
        lost = [name for name in names if not reported[name].get("reachable")]
        for name in names:
            train = train_results[name]
            if train.get("status") != FAILED:
                continue
            said = "\n".join([train.get("error") or "", *(train.get("log_tail") or [])])
            for address, other in addresses.items():
                if (
                    other != name
                    and other not in lost
                    and re.search(rf"(?<![0-9.]){re.escape(address)}(?![0-9])", said)
                ):
                    lost.append(other)
        jobs.append(
            {
                "name": job_name,
                "hosts": names,
                "nodes": len(names),
                "nproc_per_node": nproc,
                "ranks": nproc * len(names) if isinstance(nproc, int) else None,
                "rows": rows,
                "green": all(reported[n].get("green") for n in names),
                "val_loss": _finite(loss),
                "draft_sha256": checksums.pop() if len(checksums) == 1 else None,
                "same_draft": len(checksums) <= 1
                and None not in {p["draft_sha256"] for p in per_host},
                "lost": lost,
                "per_host": per_host,
            }
        )
    return jobs


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
            size = sum(b for b in s["model_bytes"].values() if is_number(b))
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
    text = " ".join(clean_text(str(value)).split())
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
    body = [clean_text(line).rstrip("\n") for line in lines]
    longest = max((len(run) for line in body for run in re.findall(r"`{3,}", line)), default=0)
    fence = "`" * max(3, longest + 1)
    return [f"{fence}{info}", *body, fence]


def _names(items: list[str]) -> str:
    shown = ", ".join(items[:MAX_NAMES])
    return shown + (f" and {len(items) - MAX_NAMES} more" if len(items) > MAX_NAMES else "")


def _bold(text: str) -> str:
    return f"**{text}**"


def verdict(
    report: dict[str, Any],
    text: Callable[[str], str] = md_text,
    strong: Callable[[str], str] = _bold,
) -> str:
    """The verdict line: markdown by default; `text` escapes names, `strong` marks the word
    GREEN or NOT GREEN (plain text with str and str)."""
    hosts = report["hosts"]
    total = len(hosts)
    if not hosts:
        return f"{strong('NOT GREEN')}: the report has no hosts"
    if report["green"]:
        return f"{strong('GREEN')}: {total} of {total} hosts passed every stage"
    failed, refused, unreachable, incomplete = [], [], [], []
    for h in hosts:
        if h["green"]:
            continue
        name = text(h["name"])
        if h["refused"]:
            refused.append(f"{name}: {text(h['refused']['stage'])} settings")
            continue
        tests_failed = h["artifact_tests"].get("failed") or 0
        damaged = [text(s) + " damaged" for s, r in h["stages"].items() if r["status"] == DAMAGED]
        if not h["reachable"] and not h["failed_stage"]:
            unreachable.append(name)
        elif h["failed_stage"] or tests_failed or damaged:
            what = ([text(h["failed_stage"])] if h["failed_stage"] else []) + damaged
            if tests_failed:
                what.append(f"{tests_failed} artifact test{'s' if tests_failed != 1 else ''}")
            failed.append(f"{name}: {', '.join(what)}")
        else:
            incomplete.append(f"{name}: {text(h['not_green_reason'])}")
    parts = []
    for label, items in (
        ("failed", failed),
        ("refused", refused),
        ("unreachable", unreachable),
        ("incomplete", incomplete),
    ):
        if items:
            count = f"{len(items)} of {total} hosts" if not parts else str(len(items))
            parts.append(f"{count} {label} ({_names(items)})")
    if report.get("ended_early"):
        parts.append(
            "the run was interrupted"
            if report.get("interrupted")
            else "the run ended before its report"
        )
    prefix = "check mode, " if report["check_mode"] else ""
    return f"{strong('NOT GREEN')}: {prefix}{'; '.join(parts)}"


def source_lines(report: dict[str, Any], text: Callable[[str], str] = md_text) -> list[str]:
    """What the controller fetched once and pushed, one markdown list item per source (`text`
    escapes the host names)."""
    sources = report.get("controller_sources") or {}
    lines = []
    for kind, label in (("wheelhouse", "Wheelhouse"), ("models", "Models")):
        src = sources.get(kind) or {}
        if src.get("hosts"):
            lines.append(
                f"- {label}: {fmt_bytes(src['fetched_bytes'])} fetched once on the controller; "
                f"{fmt_bytes(src['pushed_bytes'])} pushed to {len(src['hosts'])} host(s) "
                f"({text(', '.join(src['hosts']))}), when their stage last ran"
            )
    return lines


TEMPLATES = Path(__file__).resolve().parent / "templates"
MARKDOWN = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATES),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
    autoescape=False,  # markdown, escaped by md_text and md_code
)
MARKDOWN.filters.update(
    FILTERS,
    md_text=md_text,
    md_code=md_code,
    md_block=md_block,
    fmt_lossless=lambda v: {True: "passed", False: "**FAILED**", None: "-"}.get(v, "-"),
    any_number=lambda values: any(is_number(v) for v in values),
    not_passed=lambda h: [
        (s, r) for s, r in h["stages"].items() if r["status"] not in (PASSED, FAILED, UNREACHABLE)
    ],
)


def summary_lines(report: dict[str, Any], report_dir: str) -> list[str]:
    """The few lines a run ends with on the console: verdict, hosts per group, what this run
    redid, where the report is."""
    by_group = report["totals"]["by_group"]
    groups = ", ".join(f"{g} {c['green']}/{c['hosts']}" for g, c in by_group.items())
    total = len(report["hosts"])

    def counted(stages: dict[str, int]) -> str:
        return ", ".join(
            stage if count == total else f"{stage} ({count} of {total} hosts)"
            for stage, count in stages.items()
        )

    if report["check_mode"]:
        would = would_run_stages(report["hosts"])
        nothing = "nothing, every stage is up to date" if report["green"] else "nothing"
        redid = f"would run: {counted(would) if would else nothing}"
    else:
        redone = redone_stages(report["hosts"])
        redid = f"redone: {counted(redone)}" if redone else f"redone: {nothing_redone(report)}"
    return [
        verdict(report, text=str, strong=str),
        f"hosts green per group: {groups}" if groups else "hosts: none",
        redid,
        f"report: {os.path.join(report_dir, 'fleet.html')} (fleet.md, fleet.json beside it)",
    ]


def render_markdown(report: dict[str, Any]) -> str:
    """fleet.md, from templates/fleet.md.j2."""
    measured = [h for h in report["hosts"] if (h.get("summary") or {}).get("bench")]
    return MARKDOWN.get_template("fleet.md.j2").render(
        r=report,
        verdict=verdict(report),
        sources=source_lines(report),
        measured=measured,
        groups=fleet_html.measures(report)["groups"] if measured else [],
    )


# --- junit --------------------------------------------------------------------------------


def _xml(value: Any) -> str:
    return clean_text(str(value))


def _seconds(value: Any) -> float:
    return float(value) if is_number(value) and math.isfinite(value) else 0.0


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


def write_report(
    report: dict[str, Any], artifacts: Optional[dict[str, list[dict[str, Any]]]], out_dir: Path
) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    markdown = render_markdown(report)
    page = fleet_html.render_html(
        report,
        verdict=verdict(report, text=str, strong=str),
        sources=[line.removeprefix("- ") for line in source_lines(report, text=str)],
    )
    tree = render_junit(report, artifacts)
    document = json.dumps(_finite(report), indent=2, ensure_ascii=False) + "\n"
    with atomic_path(out_dir / "junit.xml") as tmp:
        tree.write(tmp, encoding="utf-8", xml_declaration=True)
    write_atomic(out_dir / "fleet.md", markdown)
    write_atomic(out_dir / "fleet.html", page)
    # fleet.json last: when it is complete, so are the others
    write_atomic(out_dir / "fleet.json", document)


REPORT_ID = re.compile(r"^\d{8}T\d{6}Z-[0-9a-f]+$")


def prune_reports(reports_dir: Path, keep: int, current: Path) -> list[str]:
    """Remove the report directories of reports_dir beyond the newest `keep` (report ids sort
    by time), never `current` nor the one `latest` points at; the names removed. Only
    directories named like a report id are touched."""
    kept = {current.resolve()}
    latest = reports_dir / "latest"
    if latest.is_symlink():
        kept.add(latest.resolve())
    reports = sorted(
        (p for p in reports_dir.iterdir() if p.is_dir() and not p.is_symlink()),
        key=lambda p: p.name,
        reverse=True,
    )
    removed = []
    for path in [p for p in reports if REPORT_ID.match(p.name)][keep:]:
        if path.resolve() in kept:
            continue
        shutil.rmtree(path)
        removed.append(path.name)
    return removed


def write_index(reports_dir: Path) -> None:
    """reports_dir/index.html: every report in reports_dir, newest first."""
    write_atomic(reports_dir / "index.html", fleet_html.render_index(reports_dir))


def point_latest(link: Path, report_dir: Path) -> None:
    """`link` -> report_dir (relative when they share a directory), replaced in one rename:
    a reader sees the old report or the new one, never neither."""
    target = report_dir.name if report_dir.parent == link.parent else str(report_dir.resolve())
    with atomic_path(link) as tmp:
        tmp.symlink_to(target)


def cache_templates(directory: Path) -> None:
    """Keep fleet.md's, fleet.html's and the index's templates compiled in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    cache = jinja2.FileSystemBytecodeCache(str(directory))
    MARKDOWN.bytecode_cache = cache
    fleet_html.HTML.bytecode_cache = cache


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specfleet_helpers.report.fleet_report",
        description=(
            "Write fleet.json, fleet.md and junit.xml for one run over a fleet and print one "
            "JSON line with the verdict. Exit 0 when written (green or not), 2 on bad input."
        ),
    )
    parser.add_argument(
        "--input",
        type=Path,
        required=True,
        help="the host report JSON collected by the play; '-': read it from stdin and keep it"
        " as hosts.json in --out-dir",
    )
    parser.add_argument(
        "--out-dir", type=Path, required=True, help="directory for the report (created)"
    )
    parser.add_argument(
        "--latest",
        type=Path,
        help="once the report is written, point this symlink at --out-dir (e.g. reports/latest)",
    )
    parser.add_argument(
        "--index",
        type=Path,
        help="once the report is written, rewrite INDEX/index.html: every report directory in"
        " INDEX, newest first (e.g. the reports directory)",
    )
    parser.add_argument(
        "--keep",
        type=int,
        metavar="N",
        help="with --index: keep the newest N reports there (this one and `latest` always), "
        "remove the older ones; 0 keeps every report",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        help="keep the report's templates compiled here (Jinja's bytecode cache, keyed by each"
        " template's source): compiling them was most of a no-op run's report",
    )
    parser.add_argument(
        "--artifact-junit",
        type=Path,
        help="pytest junit XML of the testinfra artifact suite run against the hosts",
    )
    args = parser.parse_args(argv)
    if args.keep is not None and (args.keep < 0 or args.index is None):
        parser.error(f"--keep {args.keep}: expected a count >= 0 (0 keeps all), with --index")
    source = args.input
    if str(source) == "-":
        # Kept first, as it came: the raw input of a report, readable even when it is refused.
        source = args.out_dir / "hosts.json"
        try:
            args.out_dir.mkdir(parents=True, exist_ok=True)
            write_atomic(source, sys.stdin.read())
        except OSError as exc:
            print(f"fleet_report: cannot write {source}: {exc}", file=sys.stderr)
            return 1
    try:
        doc = load_input(source)
        artifacts = None
        if args.artifact_junit is not None:
            artifacts = read_artifact_junit(args.artifact_junit, list(doc["hosts"]))
    except InputError as exc:
        print(f"fleet_report: error: {exc}", file=sys.stderr)
        return 2
    report = build_report(doc, artifacts)
    try:
        if args.cache_dir is not None:
            cache_templates(args.cache_dir)
        write_report(report, artifacts, args.out_dir)
        if args.latest is not None:
            point_latest(args.latest, args.out_dir)
        if args.index is not None:
            if args.keep:
                prune_reports(args.index, args.keep, args.out_dir)
            write_index(args.index)
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
        "summary": summary_lines(report, os.path.abspath(args.out_dir)),
        # What the gate does with each host (roles/validate/tasks/gate.yml).
        "verdicts": {
            h["name"]: gate_verdict(h, os.path.abspath(args.out_dir)) for h in report["hosts"]
        },
    }
    print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
