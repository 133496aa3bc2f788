"""Tests for specfleet_helpers.report.fleet_html: fleet.html and index.html written by the
report's CLI from the same input documents as test_fleet_report, parsed back with
html.parser, and opened in a real headless Chromium (Debian's chromium, driven by Playwright):
the page loads with no console error and no network request, the failed host shows failed with
its re-run command, the filters work, and a screenshot is kept with the test artifacts."""

from __future__ import annotations

import json
import os
import re
from datetime import datetime, timedelta, timezone
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from specfleet_helpers.report import fleet_html, fleet_report
from test_fleet_report import LOG_TAIL, document, failed_fleet, green_fleet, host, run

REPO_ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("SPECFLEET_CHROMIUM", "/usr/bin/chromium")
# Where screenshots are kept: CI collects this directory with the test output.
ARTIFACTS = Path(os.environ.get("SPECFLEET_TEST_ARTIFACTS", REPO_ROOT / ".work" / "test-artifacts"))


class Page(HTMLParser):
    """The elements of a page: tag, attributes and the text directly inside, in order; and
    every URL it would load."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[dict[str, Any]] = []
        self.stack: list[dict[str, Any]] = []
        self.loads: list[str] = []
        self.row: str | None = None  # data-host of the table row being read
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "tr":
            self.row = dict(attrs).get("data-host")
        element = {"tag": tag, "attrs": dict(attrs), "text": "", "row": self.row}
        self.elements.append(element)
        if tag not in ("meta", "input", "br", "link", "img"):
            self.stack.append(element)
        for name, value in attrs:
            loaded = name in ("src", "href", "action", "srcset", "poster", "data") and tag != "a"
            if loaded and value and not value.startswith("#"):
                self.loads.append(value)
        if tag == "link":
            self.loads.append(dict(attrs).get("href") or "")

    def handle_endtag(self, tag: str) -> None:
        while self.stack:
            if self.stack.pop()["tag"] == tag:
                break

    def handle_data(self, data: str) -> None:
        for element in self.stack:
            element["text"] += data

    def find(self, tag: str, **attrs: str) -> list[dict[str, Any]]:
        return [
            e
            for e in self.elements
            if e["tag"] == tag and all(e["attrs"].get(k) == v for k, v in attrs.items())
        ]


def page_of(out: Path) -> tuple[str, Page]:
    text = (out / "fleet.html").read_text()
    return text, Page(text)


def grid_rows(page: Page) -> dict[str, dict[str, Any]]:
    rows = [e for e in page.elements if e["tag"] == "tr" and "data-host" in e["attrs"]]
    return {
        r["attrs"]["data-host"]: r for r in rows[: len({r["attrs"]["data-host"] for r in rows})]
    }


def test_a_green_fleet_page(tmp_path):
    result = run(tmp_path, green_fleet())
    assert result.rc == 0
    text, page = page_of(result.out)
    report = json.loads((result.out / "fleet.json").read_text())
    banner = page.find("div", id="verdict")[0]
    assert (
        "green" in banner["attrs"]["class"].split() and "not-green" not in banner["attrs"]["class"]
    )
    assert "GREEN: 3 of 3 hosts passed every stage" in banner["text"]
    rows = grid_rows(page)
    assert list(rows) == [h["name"] for h in report["hosts"]]
    assert all(r["attrs"]["data-green"] == "yes" for r in rows.values())
    cells = [e for e in page.elements if e["tag"] == "td" and "cell" in e["attrs"].get("class", "")]
    stage_cells = [
        c for c in cells if c["attrs"].get("title", "").split(":")[0] in report["stages"]
    ]
    assert len(stage_cells) == 3 * len(report["stages"])
    assert all("passed" in c["attrs"]["class"].split() for c in stage_cells)
    # self-contained: nothing to load, no script or style from elsewhere
    assert page.loads == []
    assert "http://" not in text and "https://" not in text
    # the measured numbers are there, per host and per group
    assert page.find("table", id="measures") and page.find("table", id="group-measures")
    assert "25.0%" in text and "2.25" in text


def test_a_failed_host_shows_its_stage_error_log_tail_and_rerun(tmp_path):
    result = run(tmp_path, failed_fleet())
    _, page = page_of(result.out)
    banner = page.find("div", id="verdict")[0]
    assert "not-green" in banner["attrs"]["class"].split()
    assert "NOT GREEN" in banner["text"] and "a950-node1: train" in banner["text"]
    rows = grid_rows(page)
    assert rows["a950-node1"]["attrs"]["data-green"] == "no"
    assert rows["a950-node1"]["attrs"]["data-status"] == "failed"
    assert rows["a3-node1"]["attrs"]["data-status"] == "unreachable"
    assert rows["a2-node1"]["attrs"]["data-green"] == "yes"
    cells = {
        c["attrs"]["title"].split(":")[0]: c["attrs"]["class"].split()
        for c in page.elements
        if c["tag"] == "td" and c["row"] == "a950-node1" and "title" in c["attrs"]
    }
    assert list(cells) == list(failed_fleet()["stages"])
    assert "failed" in cells["train"] and "not-reached" in cells["serve"]
    section = page.find("section", id="host-a950-node1")[0]
    assert "failed-host" in section["attrs"]["class"].split()
    assert "stage train failed on a950-node1: exit code 2" in section["text"]
    assert all(line in section["text"] for line in LOG_TAIL)
    rerun = [
        e for e in page.elements if e["tag"] == "pre" and "rerun" in e["attrs"].get("class", "")
    ]
    assert [e["text"] for e in rerun] == ["bash /srv/specfleet/run/train.sh"]
    assert "Unreachable" in page.find("section", id="host-a3-node1")[0]["text"]


def test_the_timeline_places_this_runs_stages_on_one_axis():
    report = {
        "generated": "2026-12-01T10:01:40Z",
        "hosts": [
            {
                "name": "fast",
                "wall_time_s": 50.0,
                "stages": {
                    "data": {
                        "this_run": "ran",
                        "ended": "2026-12-01T10:01:00Z",
                        "duration_s": 20.0,
                        "status": "passed",
                    },
                    "train": {
                        "this_run": "up_to_date",
                        "ended": "2026-11-30T09:00:00Z",
                        "duration_s": 9.0,
                        "status": "passed",
                    },
                },
            },
            {
                "name": "slow",
                "wall_time_s": 100.0,
                "stages": {
                    "data": {
                        "this_run": "ran",
                        "ended": "2026-12-01T10:01:20Z",
                        "duration_s": 80.0,
                        "status": "passed",
                    },
                    "train": {
                        "this_run": "failed",
                        "ended": "2026-12-01T10:01:30Z",
                        "duration_s": 10.0,
                        "status": "failed",
                    },
                },
            },
        ],
    }
    placed = fleet_html.timeline(report)
    # the axis runs from the slow host's start (100 s before the report) to the report
    assert placed["span_s"] == pytest.approx(100.0)
    slow, fast = placed["hosts"]["slow"], placed["hosts"]["fast"]
    assert slow["run"] == {"left": 0.0, "width": 100.0}
    assert fast["run"] == {"left": 50.0, "width": 50.0}
    assert [(b["stage"], b["left"], b["width"], b["status"]) for b in slow["bars"]] == [
        ("data", 0.0, 80.0, "passed"),
        ("train", 80.0, 10.0, "failed"),
    ]
    # an up-to-date stage takes no time in this run
    assert [(b["stage"], b["left"], b["width"]) for b in fast["bars"]] == [("data", 40.0, 20.0)]


def test_a_run_where_nothing_ran_has_no_bars(tmp_path):
    doc = green_fleet()
    for h in doc["hosts"].values():
        h["run"] = {s: {"status": "up_to_date", "reason": "", "duration_s": None} for s in h["run"]}
    result = run(tmp_path, doc)
    _text, page = page_of(result.out)
    divs = [e["attrs"].get("class", "").split() for e in page.elements if e["tag"] == "div"]
    assert not [c for c in divs if "bar" in c]
    assert len([c for c in divs if "run" in c]) == 3  # each host's run, with nothing in it


def test_hostile_names_and_errors_stay_text(tmp_path):
    doc = failed_fleet()
    failing = doc["hosts"]["a950-node1"]["run"]["train"]
    failing["error"] = '<script>alert("x")</script> & "quotes"'
    failing["rerun"] = "echo '</pre><b>bold</b>'"
    result = run(tmp_path, doc)
    text, page = page_of(result.out)
    assert "<script>alert" not in text
    assert len(page.find("script")) == 1  # only the page's own
    assert not page.find("b")
    rerun = [
        e for e in page.elements if e["tag"] == "pre" and "rerun" in e["attrs"].get("class", "")
    ]
    assert rerun[0]["text"] == "echo '</pre><b>bold</b>'"


def test_the_index_lists_every_report_newest_first(tmp_path):
    reports = tmp_path / "reports"
    older = document(
        {"a2-node1": host("atlas-a2")},
        report_id="20261201T100000Z-aaaaaa",
        generated="2026-12-01T10:00:00Z",
    )
    newer = failed_fleet()
    newer.update(report_id="20261202T100000Z-bbbbbb", generated="2026-12-02T10:00:00Z")
    for doc in (older, newer):
        source = tmp_path / f"{doc['report_id']}.json"
        source.write_text(json.dumps(doc))
        out = reports / doc["report_id"]
        assert (
            fleet_report.main(
                [
                    "--input",
                    str(source),
                    "--out-dir",
                    str(out),
                    "--latest",
                    str(reports / "latest"),
                    "--index",
                    str(reports),
                ]
            )
            == 0
        )
    (reports / "check").mkdir()  # a directory without a report is left out
    index = Page((reports / "index.html").read_text())
    rows = [e for e in index.elements if e["tag"] == "tr" and "data-report" in e["attrs"]]
    assert [r["attrs"]["data-report"] for r in rows] == [
        "20261202T100000Z-bbbbbb",
        "20261201T100000Z-aaaaaa",
    ]
    assert [r["attrs"]["data-green"] for r in rows] == ["no", "yes"]
    assert "NOT GREEN" in rows[0]["text"] and "a950-node1" in rows[0]["text"]
    # what each run redid: every stage ran on the one host of the older run
    assert "train \u00d71" in rows[1]["text"]
    links = [e["attrs"]["href"] for e in index.elements if e["tag"] == "a"]
    assert "20261202T100000Z-bbbbbb/fleet.html" in links
    assert index.loads == []


def test_older_reports_are_pruned_keeping_latest_and_this_one(tmp_path):
    reports = tmp_path / "reports"
    ids = [f"2026120{day}T100000Z-{day:06x}" for day in range(1, 6)]
    for report_id in ids:
        source = tmp_path / f"{report_id}.json"
        source.write_text(json.dumps({**green_fleet(), "report_id": report_id}))
        argv = ["--input", str(source), "--out-dir", str(reports / report_id)]
        argv += ["--latest", str(reports / "latest")]
        assert fleet_report.main([*argv, "--index", str(reports), "--keep", "2"]) == 0
    (reports / "notes").mkdir()  # not a report id: never touched
    # `latest` pointing at an old report (a --tags run elsewhere moved it) is kept too
    (reports / "latest").unlink()
    (reports / "latest").symlink_to(ids[3])
    source = tmp_path / "new.json"
    source.write_text(json.dumps({**green_fleet(), "report_id": "20261206T100000Z-abcdef"}))
    argv = ["--input", str(source), "--out-dir", str(reports / "20261206T100000Z-abcdef")]
    assert fleet_report.main([*argv, "--index", str(reports), "--keep", "2"]) == 0
    left = sorted(p.name for p in reports.iterdir() if p.is_dir() and not p.is_symlink())
    assert left == [ids[3], ids[4], "20261206T100000Z-abcdef", "notes"]
    listed = re.findall(r'data-report="([^"]+)"', (reports / "index.html").read_text())
    assert listed == ["20261206T100000Z-abcdef", ids[4], ids[3]]


def test_keep_needs_a_count_and_an_index(tmp_path):
    source = tmp_path / "in.json"
    source.write_text(json.dumps(green_fleet()))
    with pytest.raises(SystemExit) as exited:
        fleet_report.main(["--input", str(source), "--out-dir", str(tmp_path / "r"), "--keep", "3"])
    assert exited.value.code == 2


# --- in a real browser -------------------------------------------------------------------------


def timed(doc: dict[str, Any]) -> dict[str, Any]:
    """doc with the times of a real run: each host's stages one after the other from the same
    start, the later hosts slower, the stamps (and a failure record) ending when their stage
    did, the report a few seconds after the slowest host, when every host's wall time is
    measured."""
    start = datetime(2026, 11, 29, 21, 0, 0, tzinfo=timezone.utc)
    ends = []
    for n, (name, h) in enumerate(sorted(doc["hosts"].items())):
        if h["state"] is None:
            continue
        clock = start + timedelta(seconds=4)
        for stage in doc["stages"]:
            entry = h["run"].get(stage)
            if entry is None:
                continue
            entry["duration_s"] = round(6.0 * (1 + n) + 2 * doc["stages"].index(stage), 1)
            clock += timedelta(seconds=entry["duration_s"] + 1)
            ended = clock.strftime("%Y-%m-%dT%H:%M:%SZ")
            if entry["status"] == "failed":
                h["state"]["failures"][stage] = {"time": ended, "error": entry["error"]}
            elif stage in h["state"]["stamps"]:
                h["state"]["stamps"][stage].update(ended=ended, duration_s=entry["duration_s"])
        ends.append((name, clock))
    generated = max(clock for _, clock in ends) + timedelta(seconds=3)
    doc["generated"] = generated.strftime("%Y-%m-%dT%H:%M:%SZ")
    for name, _ in ends:  # every host's run started with the playbook and ends at the report
        doc["hosts"][name]["wall_time_s"] = (generated - start).total_seconds()
    return doc


def browser_or_skip():
    playwright = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        if os.environ.get("SPECFLEET_REQUIRE_BROWSER"):
            pytest.fail(
                f"{CHROMIUM} is missing and SPECFLEET_REQUIRE_BROWSER is set: make browser-deps"
            )
        pytest.skip(f"no {CHROMIUM} (Debian's chromium: make browser-deps)")
    return playwright


@pytest.fixture(scope="module")
def browser():
    sync_api = browser_or_skip()
    with sync_api.sync_playwright() as pw:
        chromium = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        yield chromium
        chromium.close()


def open_page(browser, path: Path, name: str):
    """The page at path, with what it logged as errors and every request it made."""
    page = browser.new_page(viewport={"width": 1366, "height": 900})
    errors: list[str] = []
    requests: list[str] = []
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("request", lambda req: requests.append(req.url))
    page.goto(path.resolve().as_uri(), wait_until="load")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
    # the first screenful, small enough for the README (docs/images/fleet-html.jpg is this one
    # of the fleet with a failed host)
    page.screenshot(path=str(ARTIFACTS / f"{name}-top.jpg"), type="jpeg", quality=55)
    return page, errors, requests


def test_a_green_fleet_in_chromium(tmp_path, browser):
    result = run(tmp_path, timed(green_fleet()))
    page, errors, requests = open_page(browser, result.out / "fleet.html", "fleet-html-green")
    assert errors == []
    assert requests == [(result.out / "fleet.html").resolve().as_uri()]
    assert page.locator("#verdict").inner_text().startswith("GREEN")
    assert page.locator("#grid tbody tr:visible").count() == 3
    page.select_option("#filter-status", "not-green")
    assert page.locator("#grid tbody tr:visible").count() == 0
    assert page.locator("#shown").inner_text() == "0 of 3 hosts shown"
    page.close()


def test_a_fleet_with_a_failed_host_in_chromium(tmp_path, browser):
    result = run(tmp_path, timed(failed_fleet()))
    page, errors, requests = open_page(browser, result.out / "fleet.html", "fleet-html-failed-host")
    # every stage of this run is on the timeline: 8 on the green host, 7 on the failed one
    # (train failed, serve not reached), none on the unreachable one
    bars = page.locator("#timeline .bar").evaluate_all("bars => bars.map(b => b.title)")
    assert len(bars) == 8 + 7 and any(b.startswith("train: failed") for b in bars), bars
    assert errors == []
    assert requests == [(result.out / "fleet.html").resolve().as_uri()]
    row = page.locator('#grid tbody tr[data-host="a950-node1"]')
    assert row.get_attribute("data-green") == "no"
    assert "not green" in row.inner_text()
    assert "failed" in row.locator("td[title^='train:']").get_attribute("class").split()
    section = page.locator("#host-a950-node1")
    assert section.locator("pre.rerun").inner_text() == "bash /srv/specfleet/run/train.sh"
    assert "RuntimeError: loss is nan" in section.locator("pre.log-tail").inner_text()
    # worst first: the failed host, then the unreachable one, then the green one
    page.select_option("#sort", "status")
    order = page.locator("#grid tbody tr").evaluate_all("rows => rows.map(r => r.dataset.host)")
    assert order == ["a950-node1", "a3-node1", "a2-node1"]
    page.select_option("#filter-status", "not-green")
    visible = page.locator("#grid tbody tr:visible").evaluate_all(
        "rows => rows.map(r => r.dataset.host)"
    )
    assert visible == ["a950-node1", "a3-node1"]
    assert page.locator("#host-a2-node1").is_hidden()
    page.select_option("#filter-status", "all")
    page.fill("#filter-text", "a950")
    assert page.locator("#grid tbody tr:visible").count() == 1
    page.close()


def test_fifty_hosts_filter_by_group_and_status_in_chromium(tmp_path, browser):
    groups = ("atlas-a2", "atlas-a3", "ascend-950")
    hosts = {f"{groups[i % 3].split('-')[1]}-node{i:02d}": host(groups[i % 3]) for i in range(50)}
    failed = sorted(hosts)[::17]  # three of them
    for name in failed:
        hosts[name]["run"]["train"] = {
            "status": "failed",
            "reason": "inputs changed",
            "duration_s": 3.0,
            "error": f"stage train failed on {name}",
            "rerun": "bash /srv/specfleet/run/train.sh",
        }
    result = run(tmp_path, timed(document(hosts)))
    page, errors, _ = open_page(browser, result.out / "fleet.html", "fleet-html-50-hosts")
    assert errors == []
    rows = "#grid tbody tr:visible"
    assert page.locator(rows).count() == 50
    page.select_option("#filter-status", "not-green")
    shown = page.locator(rows).evaluate_all("rows => rows.map(r => r.dataset.host)")
    assert sorted(shown) == failed
    page.select_option("#filter-status", "all")
    page.select_option("#filter-group", "atlas-a3")
    assert page.locator(rows).count() == len([i for i in range(50) if i % 3 == 1])
    assert page.locator("#shown").inner_text() == "17 of 50 hosts shown"
    page.close()


def test_the_index_in_chromium(tmp_path, browser):
    reports = tmp_path / "reports"
    for report_id, doc in (
        ("20261201T100000Z-aaaaaa", green_fleet()),
        ("20261202T100000Z-bbbbbb", failed_fleet()),
    ):
        source = tmp_path / f"{report_id}.json"
        source.write_text(json.dumps({**doc, "report_id": report_id}))
        argv = [
            "--input",
            str(source),
            "--out-dir",
            str(reports / report_id),
            "--index",
            str(reports),
        ]
        assert fleet_report.main(argv) == 0
    page, errors, requests = open_page(browser, reports / "index.html", "reports-index")
    assert errors == []
    assert requests == [(reports / "index.html").resolve().as_uri()]
    rows = page.locator("#reports tbody tr").evaluate_all("rows => rows.map(r => r.dataset.report)")
    assert rows == ["20261202T100000Z-bbbbbb", "20261201T100000Z-aaaaaa"]
    page.close()
