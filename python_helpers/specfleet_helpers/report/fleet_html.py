"""fleet.html and the reports' index.html: the fleet report as pages people open.

fleet.html is rendered from the report dict that fleet.json holds (fleet_report.build_report),
through templates/fleet.html.j2: the same statuses, verdict and numbers as fleet.md, laid out
for a browser: a verdict banner, the host x stage grid coloured by status, a timeline of each
host's stages on one time axis, acceptance and speedup per host and per group as bars, and
every failed host's error, log tail and re-run command. One self-contained file (styles and the
small script for sorting and filtering are inline; nothing is fetched), readable from disk and
printable.

index.html lists every report kept in a reports directory, newest first, from each report's
fleet.json: verdict, host counts, wall time and what the run redid.
"""

from __future__ import annotations

import json
import statistics
from datetime import datetime
from pathlib import Path
from typing import Any, Optional

import jinja2

from specfleet_helpers.report import formats

TEMPLATES = Path(__file__).resolve().parent / "templates"
# The stages of a run that take time on the timeline: what this run did to them.
TIMED = ("ran", "failed")
# Host clocks and the controller's differ a little: a stage may seem to end this long before
# its host's run began and still be this run's.
CLOCK_SLACK_S = 5.0
# A bar narrower than this share of the axis would not show; it is drawn this wide.
MIN_BAR_PERCENT = 0.4
# Worst first: a host's status for sorting and filtering is the worst of its stages'.
SEVERITY = (
    formats.FAILED,
    formats.UNREACHABLE,
    formats.DAMAGED,
    formats.NOT_REACHED,
    formats.STALE,
    formats.UNVERIFIED,
    formats.SKIPPED,
    formats.PASSED,
)


def _epoch(text: Any) -> Optional[float]:
    when = formats.parse_time(text)
    return when.timestamp() if when is not None else None


def _number(value: Any) -> bool:
    return formats.is_number(value) and value == value and abs(value) != float("inf")


def css_status(status: Optional[str]) -> str:
    """The CSS class of a status: `not reached` -> `not-reached`."""
    return (status or "unknown").replace(" ", "-")


def host_status(host: dict[str, Any]) -> str:
    """The worst status among the host's stages, `failed` when an artifact test failed."""
    statuses = {rec["status"] for rec in host["stages"].values()}
    if host["artifact_tests"].get("failed"):
        statuses.add(formats.FAILED)
    return next((s for s in SEVERITY if s in statuses), formats.PASSED)


def timeline(report: dict[str, Any]) -> dict[str, Any]:
    """Each host's run and the stages this run ran (or failed) as bars on one axis shared by the
    fleet, in percent of it: {span_s, hosts: {name: {run, bars}}}. A host's run ends when the
    report was generated and started wall_time_s before; a stage ended at its `ended` and took
    its duration_s. A bar that would end before its host's run started is not this run's (an
    older stamp) and is left out."""
    generated = _epoch(report.get("generated"))
    rows: dict[str, dict[str, Any]] = {}
    points: list[float] = []
    for h in report["hosts"]:
        run = None
        if generated is not None and _number(h.get("wall_time_s")):
            run = (generated - h["wall_time_s"], generated)
            points += run
        bars = []
        for stage, rec in h["stages"].items():
            ended = _epoch(rec.get("ended"))
            duration = rec.get("duration_s")
            if rec.get("this_run") not in TIMED or ended is None or not _number(duration):
                continue
            if run is None or ended >= run[0] - CLOCK_SLACK_S:
                bars.append((stage, rec, ended - duration, ended))
                points += [ended - duration, ended]
        rows[h["name"]] = {"run": run, "bars": bars}
    if not points:
        return {"span_s": 0.0, "hosts": {}}
    origin, span = min(points), max(max(points) - min(points), 1e-9)

    def place(start: float, end: float) -> dict[str, float]:
        left = 100 * (start - origin) / span
        width = max(100 * (end - start) / span, MIN_BAR_PERCENT)
        return {"left": round(min(left, 100 - width), 3), "width": round(width, 3)}

    hosts = {}
    for name, row in rows.items():
        hosts[name] = {
            "run": place(*row["run"]) if row["run"] else None,
            "bars": [
                {
                    "stage": stage,
                    "status": rec["status"],
                    "duration_s": end - start,
                    **place(start, end),
                }
                for stage, rec, start, end in row["bars"]
            ],
        }
    return {"span_s": span, "hosts": hosts}


def _mean(values: list[Any]) -> Optional[float]:
    numbers = [v for v in values if _number(v)]
    return statistics.fmean(numbers) if numbers else None


def measures(report: dict[str, Any]) -> dict[str, Any]:
    """Acceptance rate, mean acceptance length and measured speedup per host and per group
    (means over the group's hosts that have them), with the scale of each bar chart."""
    hosts = []
    for h in report["hosts"]:
        summary = h.get("summary") or {}
        bench = summary.get("bench") or {}
        yardstick = bench.get("yardstick") or {}
        hosts.append(
            {
                "name": h["name"],
                "group": h["group"] or formats.NO_GROUP,
                "acceptance": summary.get("acceptance_rate"),
                "mal": summary.get("mean_acceptance_length"),
                "speedup": bench.get("speedup_output_throughput"),
                "yardstick_mal": yardstick.get("mean_acceptance_length"),
                "yardstick_speedup": yardstick.get("speedup"),
            }
        )
    groups = []
    for group in dict.fromkeys(h["group"] for h in hosts):
        members = [h for h in hosts if h["group"] == group]
        groups.append(
            {
                "name": group,
                "hosts": len(members),
                **{
                    key: _mean([h[key] for h in members])
                    for key in (
                        "acceptance",
                        "mal",
                        "speedup",
                        "yardstick_mal",
                        "yardstick_speedup",
                    )
                },
            }
        )
    measured = [h for h in hosts if any(_number(h[k]) for k in ("acceptance", "mal", "speedup"))]
    top = {
        key: max([h[key] for h in hosts if _number(h[key])] + [floor])
        for key, floor in (("mal", 1.0), ("speedup", 1.0))
    }
    return {"hosts": measured, "groups": groups if measured else [], "scale": top}


def _percent(value: Any, top: float) -> float:
    return round(max(0.0, min(100.0, 100 * value / top)), 2) if _number(value) and top else 0.0


HTML = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATES),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    autoescape=True,
)
HTML.filters.update(
    formats.FILTERS,
    fmt_lossless=lambda v: {True: "passed", False: "FAILED", None: "-"}.get(v, "-"),
    css_status=css_status,
    percent=_percent,
    sort_number=lambda v: f"{v:.6g}" if _number(v) else "",
    nothing_redone=formats.nothing_redone,
)


def render_html(report: dict[str, Any], verdict: str, sources: list[str]) -> str:
    """fleet.html, from templates/fleet.html.j2: `verdict` is the verdict line as plain text,
    `sources` what the controller fetched once and pushed, one line each."""
    return HTML.get_template("fleet.html.j2").render(
        r=report,
        verdict=verdict,
        sources=sources,
        timeline=timeline(report),
        measures=measures(report),
        host_status={h["name"]: host_status(h) for h in report["hosts"]},
        groups=list(dict.fromkeys(h["group"] or formats.NO_GROUP for h in report["hosts"])),
        statuses=[css_status(s) for s in SEVERITY],
    )


# --- the index of every report --------------------------------------------------------------


def index_entry(report_dir: Path) -> Optional[dict[str, Any]]:
    """One row of index.html from report_dir/fleet.json, or None when it has none (a report
    being written, or a directory that is not a report)."""
    try:
        report = json.loads((report_dir / "fleet.json").read_text())
        hosts = report["hosts"]
        totals = report["totals"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    walls = [h.get("wall_time_s") for h in hosts if _number(h.get("wall_time_s"))]
    return {
        "id": report_dir.name,
        "generated": report.get("generated"),
        "green": bool(report.get("green")),
        "check_mode": bool(report.get("check_mode")),
        "limit": report.get("limit"),
        "tags": report.get("tags") or [],
        "hosts": totals.get("hosts"),
        "green_hosts": totals.get("green"),
        "not_green": totals.get("not_green"),
        "unreachable": totals.get("unreachable"),
        "not_green_hosts": [h["name"] for h in hosts if not h.get("green")],
        "wall_time_s": max(walls) if walls else None,
        "redone": formats.redone_stages(hosts, bool(report.get("check_mode"))),
        "would_run": formats.would_run_stages(hosts) if report.get("check_mode") else {},
        "nothing_redone": formats.nothing_redone(report),
        "html": (report_dir / "fleet.html").is_file(),
    }


def render_index(reports_dir: Path) -> str:
    """index.html of reports_dir: every report directory in it, newest first."""
    entries = [
        entry
        for path in sorted(reports_dir.iterdir(), reverse=True)
        if path.is_dir() and not path.is_symlink()
        for entry in [index_entry(path)]
        if entry is not None
    ]
    return HTML.get_template("index.html.j2").render(
        entries=entries,
        title=str(reports_dir.name),
        written=datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S %Z"),
    )
