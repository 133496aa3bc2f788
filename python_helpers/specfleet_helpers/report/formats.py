"""What every view of the fleet report shares: the stage statuses, and how values read in a
report (seconds, counts, bytes, a stage's cell), for fleet.md, fleet.html and junit.xml alike."""

from __future__ import annotations

import json
import math
import re
from datetime import datetime, timezone
from typing import Any, Callable, Optional

from specfleet_helpers.files import strip_ansi

NO_GROUP = "ungrouped"
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
XML_INVALID = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def parse_time(value: Any) -> Optional[datetime]:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def clean_text(text: str) -> str:
    """Without ANSI escapes and characters XML 1.0 cannot carry."""
    return XML_INVALID.sub("", strip_ansi(text))


def number_format(spec: str, scale: float = 1, suffix: str = "") -> Callable[[Any], str]:
    return lambda v: f"{v * scale:{spec}}{suffix}" if is_number(v) else "-"


def fmt_seconds(value: Any) -> str:
    if not is_number(value) or not math.isfinite(value):
        return "-"
    if value < 60:
        return f"{value:.1f}s"
    minutes, seconds = divmod(round(value), 60)
    if minutes < 60:
        return f"{minutes}m {seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


def fmt_num(value: Any) -> str:
    if not is_number(value):
        return "-"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def fmt_bytes(value: Any) -> str:
    if not is_number(value):
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
            f"passed {fmt_seconds(rec['duration_s'])}" if is_number(rec["duration_s"]) else "passed"
        )
    if status == FAILED:
        return "REFUSED" if rec.get("this_run") == "refused" else "FAILED"
    if status == SKIPPED and rec["detail"].startswith("would run"):
        return "would run"
    return status


def artifact_cell(tests: dict[str, Any]) -> str:
    if not tests.get("ran"):
        return "-"
    if tests["failed"]:
        return f"{tests['failed']} failed"
    cell = f"{tests['passed']}/{tests['passed'] + tests['failed']}"
    cell += f", {tests['skipped']} skipped" if tests["skipped"] else ""
    # Not run again: nothing the suite reads changed since that report's pass.
    return cell + (f" (as in {tests['reused_from']})" if tests.get("reused_from") else "")


def fmt_positions(values: Any) -> str:
    """Acceptance per draft position, as percentages: `93% / 90% / 88%`."""
    if not isinstance(values, list) or not values:
        return "-"
    return " / ".join(f"{x * 100:.0f}%" for x in values if is_number(x))


# The value formats both templates use (fleet.md.j2, fleet.html.j2), by filter name.
FILTERS: dict[str, Callable[..., Any]] = {
    "fmt_seconds": fmt_seconds,
    "fmt_num": fmt_num,
    "fmt_bytes": fmt_bytes,
    "fmt_loss": number_format(".4g"),
    "fmt_percent": number_format(".1f", 100, "%"),
    "fmt_fixed2": number_format(".2f"),
    "fmt_ratio": number_format(".2f", 1, "x"),
    "fmt_rate": number_format(".1f"),
    "fmt_positions": fmt_positions,
    "stage_cell": stage_cell,
    "artifact_cell": artifact_cell,
    "clean_text": clean_text,
    "tojson_compact": json.dumps,
}


def _stages_this_run(hosts: list[dict[str, Any]], status: str) -> dict[str, int]:
    counted: dict[str, int] = {}
    for h in hosts:
        for stage, rec in (h.get("stages") or {}).items():
            if rec.get("this_run") == status:
                counted[stage] = counted.get(stage, 0) + 1
    return counted


def redone_stages(hosts: list[dict[str, Any]], check_mode: bool = False) -> dict[str, int]:
    """{stage: how many hosts ran it in this run}, in the order the stages first appear.
    Nothing is redone in check mode (npu_env's checks run there, and change nothing)."""
    return {} if check_mode else _stages_this_run(hosts, "ran")


def would_run_stages(hosts: list[dict[str, Any]]) -> dict[str, int]:
    """{stage: how many hosts a real run would run it on}: a check mode run's plan."""
    return _stages_this_run(hosts, "would_run")


def nothing_redone(report: dict[str, Any]) -> str:
    """What a run that redid no stage says about it: why, when every stage was not simply up
    to date (the report's outcome: check mode, refused, unreachable, interrupted)."""
    if report.get("outcome"):
        return f"nothing ({report['outcome']})"
    return "nothing, every stage was up to date" if report.get("green") else "nothing"
