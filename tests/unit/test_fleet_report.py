"""Tests for specfleet_helpers.report.fleet_report: real input documents written to tmp_path, the
CLI's main() run on them, and the three written files parsed back (JSON, markdown text,
junit XML with ElementTree)."""

from __future__ import annotations

import copy
import io
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, NamedTuple, Optional

import pytest
from specfleet_helpers.report import fleet_report

REPO_ROOT = Path(__file__).resolve().parents[2]
HELPERS = REPO_ROOT / "python_helpers"
STAGES = [
    "npu_env",
    "speculators_install",
    "models",
    "convert",
    "data",
    "hidden_states",
    "train",
    "serve",
]
CPU_ENV = {
    "accelerator_setting": "cpu",
    "arch": "x86_64",
    "cpu_count": 2,
    "hardware_family": "none",
    "npu": {
        "chip_names": [],
        "device_count": 0,
        "family": None,
        "hbm_total_mb": [],
        "health_ok": None,
        "npu_count": 0,
        "npu_smi_version": None,
    },
    "profile": "cpu",
    "ram_total_gb": 24.0,
    "stack": {"cpu_isa": ["amx_bf16", "avx2", "avx512_bf16", "avx512f"], "python": "3.11.7"},
}
NPU_ENV = {
    "accelerator_setting": "npu",
    "arch": "aarch64",
    "cpu_count": 192,
    "profile": "npu",
    "ram_total_gb": 1500.0,
    "npu": {
        "chip_names": ["910B3"],
        "device_count": 8,
        "family": "Ascend910B3",
        "hbm_total_mb": [65536] * 8,
        "health_ok": True,
        "npu_count": 8,
        "npu_smi_version": "24.1.rc2",
    },
    "stack": {"python": "3.11.7"},
}
VERSIONS = {
    "python": "3.11.7",
    "versions": {
        "torch": "2.13.0+cpu",
        "vllm": "0.32.0+cpu",
        "vllm-ascend": None,
        "torch_npu": None,
        "transformers": "5.19.0",
    },
}
METRICS: dict[str, dict[str, Any]] = {
    "speculators_install": {"speculators_version": "0.9.0"},
    "models": {"verifier": {"bytes": 2305176}, "draft": {"bytes": 395728}},
    "data": {"rows": 10, "expected_rows": 10},
    "hidden_states": {"files": 10, "tokens": 520, "bytes": 538160},
    "train": {"metrics": {"val_loss": 2.86571, "val_loss_finite": True}},
    "serve": {
        "acceptance_rate": 0.25,
        "mean_acceptance_length": 2.25,
        "completion_tokens": 8,
        "content": " _boave',-- `Theror`| ünï",
        "finish_reason": "length",
        "lossless": True,
        "lossless_prompts": 3,
        "num_drafts": 52.0,
        "num_draft_tokens": 260.0,
        "num_accepted_tokens": 65.0,
    },
}
INPUTS = {"speculators_install": {"source": "pypi"}, "models": {"source": "synthetic"}}
LOG_TAIL = ["epoch 1/3", "Traceback (most recent call last):", "RuntimeError: loss is nan"]


def stamp(stage: str, ended: str = "2026-11-29T20:10:02Z", duration: float = 71.0) -> dict:
    return {
        "stage": stage,
        "run_id": "77bc5d943cff411e",
        "fingerprint": "f" * 16,
        "inputs": INPUTS.get(stage, {}),
        "reason": "inputs changed: upstream",
        "host": "localhost",
        "started": "2026-11-29T20:08:51Z",
        "ended": ended,
        "duration_s": duration,
        "artifacts": {},
        "metrics": METRICS.get(stage, {}),
        "specfleet_stamp_version": 1,
    }


def host(group: str, env: Optional[dict] = None, **extra: Any) -> dict[str, Any]:
    data = {
        "groups": ["ascend", group],
        "reachable": True,
        "wall_time_s": 41.2,
        "settings": {"profile": "cpu", "num_speculative_tokens": 5},
        "state": {
            "stamps": {s: stamp(s) for s in STAGES},
            "failures": {},
            "environment": env if env is not None else CPU_ENV,
            "versions": VERSIONS,
        },
        "run": {
            s: {"status": "ran", "reason": "inputs changed", "duration_s": 12.3} for s in STAGES
        },
    }
    data.update(extra)
    return data


def document(hosts: dict[str, Any], **extra: Any) -> dict[str, Any]:
    doc = {
        "report_id": "20261129T210501Z-3f2a",
        "generated": "2026-11-29T21:05:01Z",
        "playbook": "site.yml",
        "check_mode": False,
        "limit": None,
        "tags": ["all"],
        "stages": STAGES,
        "hosts": hosts,
    }
    doc.update(extra)
    return doc


def green_fleet() -> dict[str, Any]:
    # inserted out of fleet order: the report sorts by group, then name
    return document(
        {
            "a950-node1": host("ascend-950"),
            "a3-node1": host("atlas-a3"),
            "a2-node1": host("atlas-a2", env=NPU_ENV),
        }
    )


def failed_fleet() -> dict[str, Any]:
    failing = host("ascend-950")
    failing["run"]["train"] = {
        "status": "failed",
        "reason": "inputs changed: epochs",
        "duration_s": 3.5,
        "error": "stage train failed on a950-node1: exit code 2\nmore detail",
        "log_tail": LOG_TAIL,
        "log": "/srv/specfleet/logs/train.log",
        "rerun": "bash /srv/specfleet/run/train.sh",
    }
    del failing["run"]["serve"]
    down = host("atlas-a3", reachable=False, state=None, run={}, wall_time_s=None)
    return document({"a2-node1": host("atlas-a2"), "a3-node1": down, "a950-node1": failing})


class Result(NamedTuple):
    rc: int
    line: dict[str, Any]  # the JSON line printed on success
    out: Path
    err: str


def run(
    tmp_path: Path,
    doc: Any,
    junit: Optional[str] = None,
    capsys: Optional[pytest.CaptureFixture] = None,
) -> Result:
    src = tmp_path / "hosts.json"
    src.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    out = tmp_path / "report"
    argv = ["--input", str(src), "--out-dir", str(out)]
    if junit is not None:
        (tmp_path / "artifacts.xml").write_text(junit)
        argv += ["--artifact-junit", str(tmp_path / "artifacts.xml")]
    rc = fleet_report.main(argv)
    line: dict[str, Any] = {}
    err = ""
    if capsys is not None:
        captured = capsys.readouterr()
        err = captured.err
        if rc == 0:
            assert len(captured.out.strip().splitlines()) == 1
            line = json.loads(captured.out)
    return Result(rc, line, out, err)


def fleet_json(out: Path) -> dict[str, Any]:
    """fleet.json as written, which must follow the schema file's report definition."""
    report = json.loads((out / "fleet.json").read_text())
    assert fleet_report.schema_problem(report, "report") is None, fleet_report.schema_problem(
        report, "report"
    )
    return report


def statuses(report: dict[str, Any], name: str) -> list[str]:
    entry = next(h for h in report["hosts"] if h["name"] == name)
    return [entry["stages"][s]["status"] for s in report["stages"]]


def test_green_fleet_json(tmp_path, capsys):
    rc, line, out, _ = run(tmp_path, green_fleet(), capsys=capsys)
    assert rc == 0
    assert line == {
        "green": True,
        "report_dir": os.path.abspath(out),
        "hosts": 3,
        "green_hosts": ["a2-node1", "a3-node1", "a950-node1"],
        "not_green_hosts": {},
        "summary": [
            "GREEN: 3 of 3 hosts passed every stage",
            "hosts green per group: atlas-a2 1/1, atlas-a3 1/1, ascend-950 1/1",
            "redone: " + ", ".join(STAGES),
            f"report: {os.path.abspath(out)}/fleet.html (fleet.md, fleet.json beside it)",
        ],
        # The gate passes every host (roles/validate/tasks/gate.yml).
        "verdicts": {"a2-node1": {}, "a3-node1": {}, "a950-node1": {}},
    }
    report = fleet_json(out)
    assert report["schema"] == "specfleet.fleet/1"
    assert report["green"] is True
    assert [h["name"] for h in report["hosts"]] == ["a2-node1", "a3-node1", "a950-node1"]
    assert [h["group"] for h in report["hosts"]] == ["atlas-a2", "atlas-a3", "ascend-950"]
    assert report["totals"] == {
        "hosts": 3,
        "green": 3,
        "not_green": 0,
        "unreachable": 0,
        "by_group": {
            "atlas-a2": {"hosts": 1, "green": 1},
            "atlas-a3": {"hosts": 1, "green": 1},
            "ascend-950": {"hosts": 1, "green": 1},
        },
    }
    a2 = report["hosts"][0]
    assert statuses(report, "a2-node1") == ["passed"] * len(STAGES)
    assert a2["stages"]["train"]["detail"] == "ran: inputs changed"
    assert a2["stages"]["train"]["duration_s"] == 12.3
    assert a2["failed_stage"] is None and a2["error"] is None and a2["log_tail"] == []
    assert a2["artifact_tests"] == {"ran": False}
    assert a2["settings"] == {"profile": "cpu", "num_speculative_tokens": 5}


def test_summary_fields(tmp_path):
    out = run(tmp_path, green_fleet()).out
    hosts = {h["name"]: h for h in fleet_json(out)["hosts"]}
    s = hosts["a3-node1"]["summary"]
    assert s["profile"] == "cpu"
    assert s["devices"] == "cpu: 2 cores, 24.0 GB RAM (amx_bf16, avx2, avx512_bf16, avx512f)"
    assert s["versions"] == {
        "python": "3.11.7",
        "speculators": "0.9.0",
        "vllm": "0.32.0+cpu",
        "vllm-ascend": None,
        "torch": "2.13.0+cpu",
        "torch_npu": None,
        "transformers": "5.19.0",
    }
    assert s["sources"] == {"speculators": "pypi", "models": "synthetic"}
    assert (s["dataset_rows"], s["hidden_state_files"], s["val_loss"]) == (10, 10, 2.86571)
    assert (s["acceptance_rate"], s["mean_acceptance_length"], s["lossless"]) == (0.25, 2.25, True)
    assert (s["num_drafts"], s["num_draft_tokens"], s["num_accepted_tokens"]) == (52, 260, 65)
    assert s["smoke"] == {
        "content": METRICS["serve"]["content"],
        "completion_tokens": 8,
        "finish_reason": "length",
    }
    assert hosts["a2-node1"]["summary"]["devices"] == "8 x Ascend910B3, 65536 MB HBM each"


def test_missing_metrics_are_null_and_dash(tmp_path):
    doc = document({"bare": host("atlas-a2")})
    doc["hosts"]["bare"]["state"].update(environment={}, versions={})
    for s in doc["hosts"]["bare"]["state"]["stamps"].values():
        s.pop("metrics")
        s.pop("inputs")
    out = run(tmp_path, doc).out
    s = fleet_json(out)["hosts"][0]["summary"]
    assert s["devices"] is None and s["val_loss"] is None and s["sources"]["models"] is None
    assert s["versions"]["vllm"] is None and s["smoke"]["content"] is None
    md = (out / "fleet.md").read_text()
    assert "- Val loss: -" in md and "- Smoke completion: -" in md


def test_failed_and_unreachable_fleet(tmp_path, capsys):
    rc, line, out, _ = run(tmp_path, failed_fleet(), capsys=capsys)
    assert rc == 0  # not green is not an error: the play decides
    assert line["green"] is False
    assert line["green_hosts"] == ["a2-node1"]
    assert line["not_green_hosts"] == {"a3-node1": "unreachable", "a950-node1": "train failed"}
    report = fleet_json(out)
    assert statuses(report, "a950-node1") == ["passed"] * 6 + ["failed", "not reached"]
    assert statuses(report, "a3-node1") == ["unreachable"] * len(STAGES)
    a950 = next(h for h in report["hosts"] if h["name"] == "a950-node1")
    assert a950["failed_stage"] == "train"
    assert a950["error"] == "stage train failed on a950-node1: exit code 2\nmore detail"
    assert a950["stages"]["train"]["detail"] == "stage train failed on a950-node1: exit code 2"
    assert a950["stages"]["serve"]["detail"] == "after train failed"
    assert a950["log_tail"] == LOG_TAIL
    assert a950["rerun"] == "bash /srv/specfleet/run/train.sh"
    assert report["totals"]["green"] == 1 and report["totals"]["not_green"] == 2
    assert report["totals"]["unreachable"] == 1
    assert report["totals"]["by_group"]["ascend-950"] == {"hosts": 1, "green": 0}
    verdict, groups, redone, where = line["summary"]
    assert verdict.startswith("NOT GREEN: 1 of 3 hosts failed (a950-node1: train)"), verdict
    assert groups == "hosts green per group: atlas-a2 1/1, atlas-a3 0/1, ascend-950 0/1"
    # the unreachable host ran nothing, a950-node1 every stage before the train that failed
    assert redone.startswith("redone: npu_env (2 of 3 hosts), "), redone
    assert redone.endswith(
        ", hidden_states (2 of 3 hosts), train (1 of 3 hosts), serve (1 of 3 hosts)"
    ), redone
    assert where.startswith(f"report: {os.path.abspath(out)}/fleet.html"), where


def test_summary_of_a_run_that_redid_nothing():
    report = fleet_report.build_report(fleet_report.validate(green_fleet()), {})
    for h in report["hosts"]:
        for record in h["stages"].values():
            record["this_run"] = "up_to_date"
            record["detail"] = "up to date"
    lines = fleet_report.summary_lines(report, "/r/x")
    assert lines[2] == "redone: nothing, every stage was up to date", lines
    report["green"] = False
    assert fleet_report.summary_lines(report, "/r/x")[2] == "redone: nothing", lines


def test_failed_fleet_markdown(tmp_path):
    out = run(tmp_path, failed_fleet()).out
    md = (out / "fleet.md").read_text()
    assert md.startswith("# specfleet fleet report 20261129T210501Z-3f2a\n")
    assert "**NOT GREEN**: 1 of 3 hosts failed (a950-node1: train); 1 unreachable (a3-node1)" in md
    header = "| Host | Group | " + " | ".join(STAGES) + " | Artifacts | Wall time |"
    assert header in md
    row = (
        "| a950-node1 | ascend-950 | "
        + "passed 12.3s | " * 6
        + "FAILED | not reached | - | 41.2s |"
    )
    assert row in md
    assert "| a2-node1 | atlas-a2 | " + "passed 12.3s | " * 8 + "- | 41.2s |" in md
    assert "| a3-node1 | atlas-a3 | " + "unreachable | " * 8 + "- | - |" in md
    section = md.split("## a950-node1 (ascend-950)", 1)[1]
    assert "- **Failed stage:** train" in section
    assert "`bash /srv/specfleet/run/train.sh`" in section
    assert "```text\n" + "\n".join(LOG_TAIL) + "\n```" in section
    # the failure comes before the summary of the host
    assert section.index("Failed stage") < section.index("- Profile:")


def test_markdown_summary_formatting(tmp_path):
    out = run(tmp_path, green_fleet()).out
    md = (out / "fleet.md").read_text()
    assert "**GREEN**: 3 of 3 hosts passed every stage" in md
    section = md.split("## a2-node1 (atlas-a2)", 1)[1].split("\n## ", 1)[0]
    assert "- Devices: 8 x Ascend910B3, 65536 MB HBM each" in section
    assert "- Val loss: 2.866" in section
    assert "- Acceptance rate: 25.0%" in section
    assert "- Mean acceptance length: 2.25" in section
    assert "- Drafts: 52 (260 draft tokens, 65 accepted)" in section
    # the completion holds backticks, a pipe and non-ASCII: a longer code span keeps it intact
    assert "- Smoke completion: `` _boave',-- `Theror`| ünï`` (8 tokens, finish reason length)" in (
        section
    )
    assert "- Lossless check: passed" in section
    assert "- Settings: profile `cpu`, num\\_speculative\\_tokens `5`" not in section
    assert "- Settings: profile `cpu`, num_speculative_tokens `5`" in section


def test_junit_counts(tmp_path):
    out = run(tmp_path, failed_fleet()).out
    raw = (out / "junit.xml").read_bytes()
    assert raw.startswith(b"<?xml version='1.0' encoding='utf-8'?>")
    root = ET.fromstring(raw)
    assert root.tag == "testsuites" and root.get("name") == "specfleet"
    assert (root.get("tests"), root.get("failures"), root.get("errors"), root.get("skipped")) == (
        "24",
        "1",
        "8",
        "1",
    )
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    assert list(suites) == ["a2-node1", "a3-node1", "a950-node1"]
    a950 = suites["a950-node1"]
    assert a950.get("hostname") == "a950-node1"
    train = a950.find("testcase[@name='train']")
    assert train.get("classname") == "specfleet.ascend-950.a950-node1"
    assert train.get("time") == "3.500"
    failure = train.find("failure")
    assert failure.get("message") == "stage train failed on a950-node1: exit code 2"
    assert "RuntimeError: loss is nan" in failure.text
    assert a950.find("testcase[@name='serve']/skipped") is not None
    assert suites["a3-node1"].find("testcase/error").get("message") == "host unreachable"
    assert len(suites["a2-node1"].findall("testcase")) == len(STAGES)
    assert suites["a2-node1"].find(".//failure") is None


def test_check_mode_would_run(tmp_path, capsys):
    doc = green_fleet()
    doc["check_mode"] = True
    for h in doc["hosts"].values():
        h["run"] = {s: {"status": "up_to_date", "reason": None, "duration_s": None} for s in STAGES}
    doc["hosts"]["a3-node1"]["run"]["train"] = {
        "status": "would_run",
        "reason": "inputs changed: epochs",
        "duration_s": None,
    }
    doc["hosts"]["a3-node1"]["run"]["serve"] = {"status": "would_run", "reason": "upstream"}
    rc, line, out, _ = run(tmp_path, doc, capsys=capsys)
    assert rc == 0 and line["green"] is False
    assert line["not_green_hosts"] == {"a3-node1": "train would run"}
    report = fleet_json(out)
    a3 = next(h for h in report["hosts"] if h["name"] == "a3-node1")
    assert statuses(report, "a3-node1") == ["passed"] * 6 + ["skipped", "skipped"]
    assert a3["stages"]["train"]["detail"] == "would run: inputs changed: epochs"
    assert a3["stages"]["npu_env"]["detail"] == "up to date"
    assert a3["stages"]["npu_env"]["duration_s"] is None
    md = (out / "fleet.md").read_text()
    assert "check mode yes" in md
    assert "| a3-node1 | atlas-a3 | " + "up to date | " * 6 + "would run | would run |" in md
    assert "**NOT GREEN**: check mode, 1 of 3 hosts incomplete (a3-node1: train would run)" in md


def test_a_host_held_by_a_stopped_rollout(tmp_path, capsys):
    doc = green_fleet()
    for h in doc["hosts"].values():
        h["run"] = {s: {"status": "up_to_date", "reason": None, "duration_s": None} for s in STAGES}
    reason = (
        "rollout stopped after a2-node1 failed its checks (the server exited while starting);"
        " still serving its previous draft"
    )
    held = {"status": "held", "reason": reason, "duration_s": None}
    doc["hosts"]["a3-node1"]["run"]["serve"] = held
    rc, line, out, _ = run(tmp_path, doc, capsys=capsys)
    assert rc == 0 and line["green"] is False
    assert line["not_green_hosts"] == {"a3-node1": "serve held"}
    report = fleet_json(out)
    a3 = next(h for h in report["hosts"] if h["name"] == "a3-node1")
    assert a3["stages"]["serve"]["status"] == "skipped"
    assert a3["stages"]["serve"]["detail"] == "held: " + reason
    assert "held: rollout stopped after a2-node1" in (out / "fleet.md").read_text()


def test_standalone_validate_from_disk_state(tmp_path):
    """No run entries: the statuses come from the stamps and failure records on disk."""
    h = host("ascend-950", run={})
    h["state"]["stamps"]["train"] = stamp("train", ended="2026-11-29T20:00:00Z", duration=30.0)
    h["state"]["failures"] = {
        "train": {
            "stage": "train",
            "host": "a950-1",
            "time": "2026-11-29T21:04:00Z",
            "error": "stage train failed on a950-1: exit code 2",
            "log_tail": LOG_TAIL,
            "log": "/srv/specfleet/logs/train.log",
            "rerun": "bash /srv/specfleet/run/train.sh",
            "task": "Fail with the log tail: train",
        },
        # older than its stamp: that stage succeeded since
        "data": {"stage": "data", "time": "2026-11-28T10:00:00Z", "error": "old"},
    }
    out = run(tmp_path, document({"a950-1": h}, playbook="validate.yml")).out
    report = fleet_json(out)
    assert statuses(report, "a950-1") == ["passed"] * 6 + ["failed", "not reached"]
    entry = report["hosts"][0]
    assert entry["stages"]["data"]["detail"] == "earlier run, ended 2026-11-29T20:10:02Z"
    assert entry["stages"]["data"]["duration_s"] == 71.0
    assert entry["stages"]["train"]["detail"] == "failed in an earlier run at 2026-11-29T21:04:00Z"
    assert entry["failed_stage"] == "train" and entry["log_tail"] == LOG_TAIL
    assert entry["rerun"] == "bash /srv/specfleet/run/train.sh"
    assert report["green"] is False


@pytest.mark.parametrize(
    ("failed_at", "ended", "newer"),
    [
        ("2026-11-29T21:04:00Z", "2026-11-29T20:00:00Z", True),
        ("2026-11-29T19:00:00Z", "2026-11-29T20:00:00Z", False),
        ("2026-11-29T21:00:00+01:00", "2026-11-29T20:30:00Z", False),  # 20:00 UTC
        (None, "2026-11-29T20:00:00Z", False),  # undated failure: the stamp wins
        ("2026-11-29T21:04:00Z", None, True),  # stamp without an end: the dated failure wins
    ],
)
def test_failure_record_against_stamp(failed_at, ended, newer):
    failure = {"stage": "train", "time": failed_at, "error": "boom"}
    assert fleet_report._failure_is_newer(failure, {"stage": "train", "ended": ended}) is newer
    assert fleet_report._failure_is_newer(failure, None) is True  # no stamp at all


def test_disk_state_missing_stamps(tmp_path):
    """Without stamp or failure the first missing stage is skipped, the rest not reached."""
    h = host("atlas-a2", run={})
    for s in ("hidden_states", "train", "serve"):
        del h["state"]["stamps"][s]
    none_collected = host("atlas-a3", run={}, state=None)
    out = run(tmp_path, document({"a2": h, "a3": none_collected})).out
    report = fleet_json(out)
    assert statuses(report, "a2") == ["passed"] * 5 + ["skipped", "not reached", "not reached"]
    assert statuses(report, "a3") == ["skipped"] + ["not reached"] * 7
    a2 = report["hosts"][0]
    assert a2["stages"]["train"]["detail"] == "not run; hidden_states is skipped"


def junit_case(module: str, name: str, time: str = "0", body: str = "") -> str:
    head = f'<testcase classname="tests.artifacts.{module}" name="{name}" time="{time}"'
    return f"{head}>{body}</testcase>" if body else f"{head}/>"


# shaped like pytest's junit XML for the testinfra suite run with --hosts='ansible://all'
JUNIT = "\n".join(
    [
        '<?xml version="1.0" encoding="utf-8"?>',
        '<testsuites><testsuite name="pytest" errors="1" failures="1" skipped="1" tests="8">',
        junit_case("test_pipeline", "test_models_verified[ansible://a2-node1]", "0.5"),
        junit_case("test_pipeline", "test_serve_result[ansible://a2-node1]", "0.25"),
        junit_case("test_pipeline", "test_models_verified[ansible://a3-node1]", "0.5"),
        junit_case(
            "test_pipeline",
            "test_serve_result[ansible://a3-node1]",
            "1.0",
            "<failure message=\"AssertionError: finish_reason is 'stop'\">"
            "assert 'stop' == 'length'</failure>",
        ),
        junit_case(
            "test_npu_env",
            "test_profile_facts[ansible://a3-node1]",
            "0.1",
            '<error message="error at setup of test_profile_facts">fixture failed</error>',
        ),
        junit_case(
            "test_rerun",
            "test_changed_epochs[ansible://a3-node1]",
            "0",
            '<skipped message="not a rerun">skip</skipped>',
        ),
        junit_case("test_pipeline", "test_x[ansible://elsewhere]"),  # not in the report
        junit_case("test_misc", "test_unparametrized"),  # no host
        "</testsuite></testsuites>",
    ]
)


def test_artifact_junit_mapped_to_hosts(tmp_path, capsys):
    rc, line, out, _ = run(tmp_path, green_fleet(), junit=JUNIT, capsys=capsys)
    assert rc == 0
    # a host without artifact testcases is still green: no artifact test of it failed
    assert line["green_hosts"] == ["a2-node1", "a950-node1"]
    assert line["not_green_hosts"] == {"a3-node1": "2 artifact tests failed"}
    hosts = {h["name"]: h for h in fleet_json(out)["hosts"]}
    assert hosts["a2-node1"]["artifact_tests"] == {
        "ran": True,
        "passed": 2,
        "failed": 0,
        "skipped": 0,
        "failures": [],
        "reused_from": None,
    }
    a3 = hosts["a3-node1"]["artifact_tests"]
    assert (a3["passed"], a3["failed"], a3["skipped"]) == (1, 2, 1)
    assert a3["failures"] == [
        {"test": "test_serve_result", "message": "finish_reason is 'stop'"},
        {"test": "test_profile_facts", "message": "error at setup of test_profile_facts"},
    ]
    assert hosts["a950-node1"]["artifact_tests"] == {"ran": False}
    assert hosts["a3-node1"]["green"] is False
    md = (out / "fleet.md").read_text()
    assert "| 2/2 | 41.2s |" in md and "| 2 failed | 41.2s |" in md
    assert "**NOT GREEN**: 1 of 3 hosts failed (a3-node1: 2 artifact tests)" in md
    assert "- `test_serve_result`: AssertionError: finish\\_reason is 'stop'" not in md
    assert "- `test_serve_result`: finish_reason is 'stop'" in md
    root = ET.parse(out / "junit.xml").getroot()
    cases = root.findall(".//testsuite[@name='a3-node1']/testcase")
    artifacts = [c for c in cases if c.get("classname") == "specfleet.atlas-a3.a3-node1.artifacts"]
    assert [c.get("name") for c in artifacts] == [
        "test_models_verified[ansible://a3-node1]",
        "test_serve_result[ansible://a3-node1]",
        "test_profile_facts[ansible://a3-node1]",
        "test_changed_epochs[ansible://a3-node1]",
    ]
    assert root.get("tests") == str(3 * len(STAGES) + 6)
    assert (root.get("failures"), root.get("skipped"), root.get("errors")) == ("2", "1", "0")


def test_malformed_input_exits_2_naming_the_file(tmp_path, capsys):
    result = run(tmp_path, "{not json", capsys=capsys)
    assert result.rc == 2
    assert "hosts.json" in result.err and "not JSON" in result.err
    assert not result.out.exists()

    missing = green_fleet()
    del missing["hosts"]
    result = run(tmp_path, missing, capsys=capsys)
    assert result.rc == 2
    assert "hosts.json" in result.err and "missing top-level key 'hosts'" in result.err

    wrong = green_fleet()
    wrong["hosts"]["a2-node1"]["run"]["train"]["status"] = "done"
    result = run(tmp_path, wrong, capsys=capsys)
    assert result.rc == 2
    assert 'hosts["a2-node1"].run.train.status: expected one of ran, up_to_date' in result.err

    wrong = green_fleet()
    wrong["hosts"]["a3-node1"]["reachable"] = "yes"
    result = run(tmp_path, wrong, capsys=capsys)
    assert result.rc == 2
    assert 'hosts["a3-node1"].reachable: expected true or false, got a string' in result.err

    wrong = green_fleet()
    wrong["hosts"]["a3-node1"]["state"]["failures"] = {"train": {"log_tail": "one string"}}
    result = run(tmp_path, wrong, capsys=capsys)
    assert result.rc == 2
    assert "state.failures.train.log_tail: expected a list of strings" in result.err
    assert not result.out.exists()  # nothing written for a malformed input


def test_malformed_artifact_junit_exits_2(tmp_path, capsys):
    result = run(tmp_path, green_fleet(), junit="<html><body>oops", capsys=capsys)
    assert result.rc == 2
    assert "artifacts.xml" in result.err and "pytest junit XML" in result.err


REPORT_FILES = ["fleet.html", "fleet.json", "fleet.md", "junit.xml"]


def test_atomic_writes_leave_no_temp_files(tmp_path):
    out = tmp_path / "report"
    out.mkdir()
    (out / "fleet.json").write_text("stale")
    run(tmp_path, failed_fleet())
    assert sorted(p.name for p in out.iterdir()) == REPORT_FILES
    assert fleet_json(out)["schema"] == "specfleet.fleet/1"

    # the report writes through files.atomic_path, as every helper does
    with pytest.raises(OSError), fleet_report.atomic_path(out / "fleet.json") as tmp:
        tmp.write_text('{"schema": "specf')
        raise OSError("disk full")
    assert sorted(p.name for p in out.iterdir()) == REPORT_FILES
    assert fleet_json(out)["schema"] == "specfleet.fleet/1"  # the complete file is untouched


def test_hostile_text_stays_well_formed(tmp_path):
    doc = failed_fleet()
    train = doc["hosts"]["a950-node1"]["run"]["train"]
    train["error"] = "boom | pipe <tag> & \x1b[31mred\x1b[0m \x00nul"
    train["log_tail"] = ["```", "line with ``` fence", "\x1b[1mbold\x1b[0m ok"]
    out = run(tmp_path, doc).out
    failure = ET.parse(out / "junit.xml").getroot().find(".//testcase[@name='train']/failure")
    assert failure.get("message") == "boom | pipe <tag> & red nul"
    md = (out / "fleet.md").read_text()
    assert "````text\n```\nline with ``` fence\nbold ok\n````" in md
    assert "\x1b" not in md
    assert fleet_json(out)["hosts"][2]["error"] == train["error"]  # JSON keeps it verbatim


def test_empty_fleet_is_not_green(tmp_path, capsys):
    rc, line, out, _ = run(tmp_path, document({}), capsys=capsys)
    assert rc == 0 and line["green"] is False and line["hosts"] == 0
    assert "**NOT GREEN**: the report has no hosts" in (out / "fleet.md").read_text()


def test_cli_help_and_module_entry(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(HELPERS)}
    cmd = [sys.executable, "-m", "specfleet_helpers.report.fleet_report"]
    helped = subprocess.run([*cmd, "--help"], capture_output=True, text=True, env=env, timeout=60)
    assert helped.returncode == 0 and "--artifact-junit" in helped.stdout
    src = tmp_path / "hosts.json"
    src.write_text(json.dumps(copy.deepcopy(green_fleet())))
    done = subprocess.run(
        [*cmd, "--input", str(src), "--out-dir", str(tmp_path / "r")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["green"] is True


def test_controller_sources_fetched_once_pushed_to_each(tmp_path):
    doc = green_fleet()
    for h in doc["hosts"].values():
        stamps = h["state"]["stamps"]
        stamps["speculators_install"]["inputs"] = {"source": "wheelhouse"}
        stamps["speculators_install"]["metrics"] = {
            "speculators_version": "0.9.0",
            "wheelhouse": {"wheels": 161, "bytes": 1000, "pushed_bytes": 1000},
        }
        stamps["models"]["inputs"] = {"source": "controller"}
    result = run(tmp_path, doc)
    sources = fleet_json(result.out)["controller_sources"]
    assert sources["wheelhouse"]["fetched_bytes"] == 1000
    assert sources["wheelhouse"]["pushed_bytes"] == 3000
    assert len(sources["wheelhouse"]["hosts"]) == 3
    assert sources["models"]["pushed_bytes"] == 3 * sources["models"]["fetched_bytes"]
    md = (result.out / "fleet.md").read_text()
    assert "fetched once on the controller" in md and "pushed to 3 host(s)" in md


def test_validate_alone_reports_damaged_stages_by_the_verifier(tmp_path):
    """validate.yml's stage verifier (checks/stage_verify.py) found broken artifacts: those
    stages are damaged (naming the file), the host is red, junit fails them."""
    h = host("atlas-a2", run={})
    h["verification"] = {
        s: {"status": "ok", "problem": None, "files": 3, "metrics": []} for s in STAGES[1:]
    }
    problem = "/srv/specfleet/hidden_states/hs_3.safetensors has 12 bytes, the stamp recorded 24"
    h["verification"]["hidden_states"] = {"status": "damaged", "problem": problem}
    h["verification"]["train"] = {"status": "damaged", "problem": "checker exited 1: no weights"}
    out = run(tmp_path, document({"a2-1": h}, playbook="validate.yml")).out
    report = fleet_json(out)
    assert statuses(report, "a2-1") == ["passed"] * 5 + ["damaged", "damaged", "passed"]
    entry = report["hosts"][0]
    assert entry["stages"]["hidden_states"]["detail"] == f"damaged: {problem}"
    assert entry["green"] is False and report["green"] is False
    assert entry["failed_stage"] is None
    assert entry["not_green_reason"] == "hidden_states damaged; train damaged"
    md = (out / "fleet.md").read_text()
    assert "**NOT GREEN**: 1 of 1 hosts failed (a2-1: hidden_states damaged, train damaged)" in md
    assert "- hidden_states: damaged, damaged: /srv/specfleet/hidden_states/hs_3" in md
    junit = ET.parse(out / "junit.xml").getroot()
    assert junit.get("failures") == "2"


def test_a_stage_built_from_an_older_upstream_run_is_stale(tmp_path):
    """After `--tags train`: train ran again, serve's stamp still names the old train run."""
    h = host("atlas-a2")
    del h["run"]["serve"]
    h["state"]["stamps"]["train"]["run_id"] = "newtrainrun00001"
    h["state"]["stamps"]["serve"]["inputs"] = {
        "upstream": {"models": "77bc5d943cff411e", "train": "77bc5d943cff411e"}
    }
    report = fleet_json(run(tmp_path, document({"a2-1": h})).out)
    entry = report["hosts"][0]
    assert entry["stages"]["serve"]["status"] == "stale"
    assert entry["stages"]["serve"]["detail"] == (
        "stale: built from train run 77bc5d943cff411e; train is now run newtrainrun00001"
    )
    assert entry["green"] is False and entry["not_green_reason"] == "serve stale"
    # a stage that ran in this run is current whatever its stamp says
    h["run"]["serve"] = {"status": "ran", "reason": "inputs changed: upstream"}
    assert fleet_json(run(tmp_path, document({"a2-1": h})).out)["green"] is True


def test_older_stamps_nothing_could_verify_are_not_passed(tmp_path):
    h = host("atlas-a2", run={})
    h["verification"] = {"models": {"status": "unverified", "problem": "no files listed"}}
    entry = fleet_json(run(tmp_path, document({"a2-1": h})).out)["hosts"][0]
    assert entry["stages"]["models"]["status"] == "unverified"
    assert entry["green"] is False
    # a verifier that did not run at all leaves every stage it would have checked unverified
    h = host("atlas-a2", run={}, verification=None, verification_error="exit 1: no python")
    entry = fleet_json(run(tmp_path, document({"a2-1": h})).out)["hosts"][0]
    assert set(statuses({"stages": STAGES, "hosts": [entry]}, "a2-1")) == {"unverified"}


def test_settings_show_the_values_the_stages_ran_with(tmp_path):
    """-e serve_num_speculative_tokens=3 reached serve's stamp; the play's default says 5."""
    h = host("atlas-a2")
    h["state"]["stamps"]["serve"]["inputs"] = {
        "speculative_config": {"method": "dflash", "num_speculative_tokens": 3},
        "gpu_memory_utilization": 0.8,
    }
    h["state"]["stamps"]["train"]["inputs"] = {"epochs": 2}
    out = run(tmp_path, document({"a2-1": h})).out
    settings = fleet_json(out)["hosts"][0]["settings"]
    assert settings["num_speculative_tokens"] == 3
    assert settings["serve_gpu_memory_utilization"] == 0.8
    assert settings["train_epochs"] == 2
    assert settings["profile"] == "cpu"
    assert "num_speculative_tokens `3`" in (out / "fleet.md").read_text()


def test_the_schema_file_is_what_the_input_is_checked_against(tmp_path, capsys):
    """docs/fleet-report.schema.json is a real schema (jsonschema checks it) and the one the
    input is refused by: a stage name repeated, a verification result without a status."""
    import jsonschema

    schema = json.loads(fleet_report.SCHEMA_FILE.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    assert fleet_report.SCHEMA_FILE.name in (REPO_ROOT / "docs" / "fleet-report.md").read_text()

    doc = green_fleet()
    doc["stages"] = ["models", "models"]
    result = run(tmp_path, doc, capsys=capsys)
    assert result.rc == 2 and "stages: expected a list of distinct stage names" in result.err

    doc = green_fleet()
    doc["hosts"]["a2-node1"]["verification"] = {"train": {"problem": "x"}}
    result = run(tmp_path, doc, capsys=capsys)
    assert result.rc == 2
    assert "hosts[\"a2-node1\"].verification.train: missing key 'status'" in result.err


def test_a_run_that_ended_before_its_report_is_never_green(tmp_path, capsys):
    """The specfleet_report_net callback's report: even hosts whose stages all passed do not
    make it green, and fleet.md says where the run ended."""
    where = "at play 'Run the DFlash pipeline', task 'session : Take the host lock'"
    rc, line, out, _ = run(tmp_path, {**green_fleet(), "ended_early": where}, capsys=capsys)
    assert rc == 0 and line["green"] is False, line
    report = fleet_json(out)
    assert report["ended_early"] == where and not report["green"], report["ended_early"]
    assert all(h["green"] for h in report["hosts"]), "the hosts' own verdicts are kept"
    md = (out / "fleet.md").read_text()
    assert "**NOT GREEN**: the run ended before its report\n" in md, md
    assert f"**The run ended before its report**: {fleet_report.md_text(where)}" in md, md


def test_a_full_run_has_no_ended_early(tmp_path):
    report = fleet_json(run(tmp_path, green_fleet()).out)
    assert report["ended_early"] is None and report["green"], report["ended_early"]
    assert "ended before its report" not in (tmp_path / "report" / "fleet.md").read_text()


def test_input_from_stdin_is_kept_beside_the_report_and_latest_moves_in_one_rename(
    tmp_path, capsys, monkeypatch
):
    reports = tmp_path / "reports"
    (reports / "old").mkdir(parents=True)
    (reports / "latest").symlink_to("old")
    raw = json.dumps(green_fleet())
    monkeypatch.setattr("sys.stdin", io.StringIO(raw))
    out = reports / "20261203T000000Z-abcdef"
    rc = fleet_report.main(["--input=-", f"--out-dir={out}", f"--latest={reports / 'latest'}"])
    assert rc == 0, capsys.readouterr().err
    assert (out / "hosts.json").read_text() == raw
    assert os.readlink(reports / "latest") == out.name
    assert fleet_json(reports / "latest")["green"] is True
    assert sorted(p.name for p in reports.iterdir()) == ["20261203T000000Z-abcdef", "latest", "old"]


def test_refused_stdin_input_is_kept_and_latest_stays(tmp_path, capsys, monkeypatch):
    reports = tmp_path / "reports"
    (reports / "old").mkdir(parents=True)
    (reports / "latest").symlink_to("old")
    monkeypatch.setattr("sys.stdin", io.StringIO("{not json"))
    out = reports / "new"
    rc = fleet_report.main(["--input=-", f"--out-dir={out}", f"--latest={reports / 'latest'}"])
    assert rc == 2
    assert f"{out / 'hosts.json'}: not JSON" in capsys.readouterr().err
    assert (out / "hosts.json").read_text() == "{not json"
    assert not (out / "fleet.json").exists()
    assert os.readlink(reports / "latest") == "old"


def measured_bench(tmp_path: Path) -> dict:
    """A measurement as serve_bench.summarize makes it from the serve script's round files: 3
    rounds, plain ~315 tok/s, the trained draft ~648, the yardstick ~950."""
    from specfleet_helpers.stages import serve_bench

    rounds = tmp_path / "bench"
    rounds.mkdir()
    speeds = {
        "plain": (315.6, 300.0, 330.0),
        "trained": (647.9, 640.0, 700.0),
        "yardstick": (950.0, 900.0, 1000.0),
    }
    for arm, figures in speeds.items():
        for n, speed in enumerate(figures, 1):
            spec = (
                {}
                if arm == "plain"
                else {
                    "spec_decode_num_drafts": 100,
                    "spec_decode_draft_tokens": 500,
                    "spec_decode_accepted_tokens": 450 if arm == "trained" else 480,
                    "spec_decode_per_position_acceptance_rates": [0.93, 0.9, 0.9, 0.89, 0.88],
                }
            )
            serve_bench.result_path(rounds, arm, n).write_text(
                json.dumps(
                    {
                        "date": f"20261204-21530{n}",
                        "completed": 32,
                        "failed": 0,
                        "duration": 3.0,
                        "output_throughput": speed,
                        "mean_tpot_ms": 1000 / speed,
                        **spec,
                    }
                )
            )
    return serve_bench.summarize(
        rounds, 3, {"trained": "/srv/drafts/run1", "yardstick": "/srv/converted"}, "together"
    )


def test_the_measured_speedup_per_host(tmp_path):
    """A host whose serve stage ran the benchmark shows the trained draft's and the yardstick's
    figures side by side in the fleet table and in its own section, the speedup with its spread
    over the rounds; one without (serve_bench off, or an older stamp) is left out of the table."""
    doc = green_fleet()
    serve = doc["hosts"]["a2-node1"]["state"]["stamps"]["serve"]
    serve["metrics"] = {
        **METRICS["serve"],
        "acceptance_rate": 0.9,
        "mean_acceptance_length": 5.5,
        "acceptance_measured_on": "bench",
        "bench": measured_bench(tmp_path),
    }
    out = run(tmp_path, doc).out
    summary = {
        h["name"]: h["summary"] for h in json.loads((out / "fleet.json").read_text())["hosts"]
    }
    bench = summary["a2-node1"]["bench"]
    assert bench["rounds"] == 3 and bench["servers"] == "together"
    # the median of each round's ratio to the plain verifier of the same round
    assert bench["trained"]["speedup"] == pytest.approx(700 / 330)
    assert bench["trained"]["speedup_min"] == pytest.approx(647.9 / 315.6)
    assert bench["trained"]["speedup_max"] == pytest.approx(640 / 300)
    assert bench["yardstick"]["mean_acceptance_length"] == pytest.approx(5.8)
    assert summary["a3-node1"]["bench"] is None
    md = (out / "fleet.md").read_text()
    table = md.split("Speculative decoding, measured", 1)[1].split("\n\n", 2)[1]
    rows = [line for line in table.splitlines() if line.startswith("| a")]
    assert rows == [
        "| a2-node1 | atlas-a2 | trained | 90.0% | 5.50 | 93% / 90% / 90% / 89% / 88% "
        "| 647.9 / 315.6 | 2.12x (2.05x-2.13x) | 3, together |",
        "| a2-node1 | atlas-a2 | yardstick | 96.0% | 5.80 | 93% / 90% / 90% / 89% / 88% "
        "| 950.0 / 315.6 | 3.01x (3.00x-3.03x) | 3, together |",
    ], rows
    section = md.split("## a2-node1 (atlas-a2)", 1)[1].split("\n## ", 1)[0]
    assert "- Acceptance rate: 90.0% (on the benchmark prompts)" in section
    assert "- Measured, yardstick: speedup 3.01x output tokens/s (rounds 3.00x-3.03x;" in section
    # Without a benchmark on any host, no table.
    (tmp_path / "g").mkdir()
    plain = run(tmp_path / "g", green_fleet()).out
    assert "Speculative decoding, measured" not in (plain / "fleet.md").read_text()


def test_cached_templates_render_the_same_report(tmp_path, monkeypatch):
    # The module-wide environments get the cache: restored after the test.
    monkeypatch.setattr(fleet_report.MARKDOWN, "bytecode_cache", None)
    monkeypatch.setattr(fleet_report.fleet_html.HTML, "bytecode_cache", None)
    # As in a new process: no template loaded yet.
    monkeypatch.setattr(fleet_report.MARKDOWN, "cache", {})
    monkeypatch.setattr(fleet_report.fleet_html.HTML, "cache", {})
    src = tmp_path / "hosts.json"
    src.write_text(json.dumps(green_fleet()))
    cache = tmp_path / "cache"
    outputs = []
    for name in ("first", "second"):
        out = tmp_path / name
        argv = ["--input", str(src), "--out-dir", str(out), f"--index={tmp_path}"]
        assert fleet_report.main([*argv, f"--cache-dir={cache}"]) == 0
        outputs.append({f: (out / f).read_text() for f in ("fleet.md", "fleet.html")})
    # Compiled once, on the first report: fleet.md's, fleet.html's and the index's templates.
    assert len(list(cache.glob("__jinja2_*.cache"))) == 3
    assert outputs[0]["fleet.md"] == outputs[1]["fleet.md"]
    assert all("a950-node1" in output["fleet.html"] for output in outputs)


def job_host(rank: int, first: int, files: int, sha: str, **extra: Any) -> dict[str, Any]:
    data = host("ascend-950", **extra)
    data["settings"]["job"] = {
        "name": "ascend-950",
        "hosts": ["a950-node1", "a950-node2"],
        "node_rank": rank,
        "address": f"10.213.9.{11 + rank}",
    }
    if data["state"]:
        stamps = data["state"]["stamps"]
        stamps["hidden_states"]["metrics"] = {"first": first, "files": files}
        stamps["train"] = {
            **stamps["train"],
            "inputs": {"nproc_per_node": 2},
            "duration_s": 84.7,
            "metrics": {
                "metrics": {"val_loss": 1.5},
                "files": [{"name": "model.safetensors", "sha256": sha, "size": 1}],
            },
        }
        stamps["data"]["metrics"] = {"rows": 913}
    return data


def test_a_job_of_two_hosts_has_its_section(tmp_path):
    doc = document(
        {
            "a950-node2": job_host(1, 457, 456, "ab" * 32),
            "a950-node1": job_host(0, 0, 457, "ab" * 32),
            "a2-node1": host("atlas-a2"),
        }
    )
    result = run(tmp_path, doc)
    assert result.rc == 0
    (job,) = fleet_json(result.out)["jobs"]
    assert job["name"] == "ascend-950" and job["hosts"] == ["a950-node1", "a950-node2"]
    assert (job["nodes"], job["nproc_per_node"], job["ranks"], job["rows"]) == (2, 2, 4, 913)
    assert [(p["rows_first"], p["hidden_state_files"]) for p in job["per_host"]] == [
        (0, 457),
        (457, 456),
    ]
    assert job["same_draft"] is True and job["draft_sha256"] == "ab" * 32
    assert job["val_loss"] == 1.5 and job["lost"] == [] and job["green"] is True
    md = (result.out / "fleet.md").read_text()
    assert "Job `ascend-950`: 2 hosts x 2 ranks, one torchrun world of 4 ranks over 913 rows" in md
    assert "| a950-node2 | 1 | 10.213.9.12 | 457 | 456 | passed | 1m 25s |" in md


def test_a_job_names_the_host_it_lost_and_a_draft_that_differs(tmp_path):
    survivor = job_host(0, 0, 457, "ab" * 32)
    survivor["run"]["train"] = {
        "status": "failed",
        "reason": "inputs changed: epochs",
        "duration_s": 3.5,
        "error": "stage train failed on a950-node1: exit code 1",
        "log_tail": ["RuntimeError: ... Read error [10.213.9.12]:28373: Connection reset by peer."],
        "log": "/srv/specfleet/logs/train.log",
        "rerun": "bash /srv/specfleet/run/train.sh",
    }
    other = job_host(1, 457, 456, "cd" * 32)
    result = run(tmp_path, document({"a950-node1": survivor, "a950-node2": other}))
    (job,) = fleet_json(result.out)["jobs"]
    assert job["lost"] == ["a950-node2"] and job["green"] is False
    assert job["same_draft"] is False and job["draft_sha256"] is None
    md = (result.out / "fleet.md").read_text()
    assert "**not the same draft on every host**; **lost: a950-node2**" in md
    # an unreachable host of the job is lost too: it has no report of its own (its settings are
    # not collected), the others name it
    down = host("ascend-950", reachable=False, state=None, run={}, wall_time_s=None, settings={})
    (tmp_path / "down").mkdir()
    result = run(
        tmp_path / "down", document({"a950-node1": job_host(0, 0, 913, "ab"), "a950-node2": down})
    )
    assert fleet_json(result.out)["jobs"][0]["lost"] == ["a950-node2"]


def test_hosts_alone_have_no_job_section(tmp_path):
    result = run(tmp_path, green_fleet())
    assert fleet_json(result.out)["jobs"] == []
    assert "Job `" not in (result.out / "fleet.md").read_text()


def test_a_refused_host_says_what_was_refused_and_that_nothing_ran(tmp_path, capsys):
    """Settings refused before any host work: the refusing role's stage failed with the
    message, every other stage not run, the verdict says refused, the summary says why
    nothing was redone, whatever the host's work root held from earlier runs."""
    error = "unknown setting: train_epoch (from extra vars): did you mean train_epochs?"
    refused = host("atlas-a2", state=None, run={}, refused={"stage": "train", "error": error})
    rc, line, out, _ = run(tmp_path, document({"a2-node1": refused}), capsys=capsys)
    assert rc == 0 and line["green"] is False
    report = fleet_json(out)
    entry = report["hosts"][0]
    assert entry["refused"] == {"stage": "train", "error": error} and entry["error"] == error
    assert entry["stages"]["train"]["detail"] == f"settings refused: {error}"
    assert entry["stages"]["models"]["detail"] == "not run: train's settings were refused"
    assert report["outcome"] == "the settings were refused before any host work"
    lines = fleet_report.summary_lines(report, "/r/x")
    assert lines[0] == "NOT GREEN: 1 of 1 hosts refused (a2-node1: train settings)", lines
    assert lines[2] == "redone: nothing (the settings were refused before any host work)"
    assert "every stage was up to date" not in (out / "fleet.html").read_text()
    md = (out / "fleet.md").read_text()
    assert "| a2-node1 | atlas-a2 | not reached" in md and "| REFUSED |" in md, md
    assert "- **Settings refused** (train): `unknown setting: train_epoch" in md, md
    assert 'data-refused="train"' in (out / "fleet.html").read_text()


def test_an_all_unreachable_run_and_an_interrupted_one_say_why_nothing_was_redone():
    down = host("atlas-a3", reachable=False, state=None, run={}, unreachable_error="timed out")
    report = fleet_report.build_report(fleet_report.validate(document({"a3-node1": down})), {})
    assert (
        fleet_report.summary_lines(report, "/r")[2] == "redone: nothing (no host could be reached)"
    )
    doc = document({"a2-node1": host("atlas-a2", run={})}, ended_early="interrupted at play 'x'")
    report = fleet_report.build_report(fleet_report.validate(doc), {})
    assert report["green"] is False
    assert fleet_report.verdict(report, str, str) == "NOT GREEN: the run was interrupted"
    assert (
        fleet_report.summary_lines(report, "/r")[2] == "redone: nothing (interrupted at play 'x')"
    )


def test_check_mode_redoes_nothing_and_says_what_would_run():
    """A --check run on a fresh root: npu_env's checks ran, nothing was redone."""
    doc = green_fleet()
    doc["check_mode"] = True
    for h in doc["hosts"].values():
        h["run"] = {s: {"status": "would_run", "reason": "no stamp"} for s in STAGES}
        h["run"]["npu_env"] = {"status": "ran", "reason": "checks"}
    lines = fleet_report.summary_lines(
        fleet_report.build_report(fleet_report.validate(doc), {}), "/r"
    )
    assert lines[2] == "would run: " + ", ".join(STAGES[1:]), lines


def test_a_failed_artifact_test_reads_as_its_own_message():
    raw = (
        "AssertionError: the draft is not published\n"
        "assert False\n"
        " +  where False = <built-in method startswith of str object at 0x7f0b89e2ee50>('x')"
    )
    assert fleet_report.readable_failure(raw) == "the draft is not published"
    assert fleet_report.readable_failure("assert 1 == 2") == "assert 1 == 2"


def test_npu_env_warnings_are_shown_in_the_hosts_section(tmp_path):
    """What npu_env warned of although nothing failed (a 950PR host; an image whose vllm-ascend
    replaces a reduced-vocabulary draft's lm_head) is in the report, not only in the run."""
    warned = "Ascend 950PR: the -a5 image is built for 950DT (SOC_VERSION ascend950dt_9582)"
    env = {
        **NPU_ENV,
        "warnings": [warned],
        "stack": {**NPU_ENV.get("stack", {}), "dflash_lm_head": {"gate": "absent"}},
    }
    doc = document({"a950-node1": host("ascend-950", env=env), "a2-node1": host("atlas-a2")})
    out = run(tmp_path, doc).out
    summary = {
        h["name"]: h["summary"] for h in json.loads((out / "fleet.json").read_text())["hosts"]
    }
    assert summary["a950-node1"]["warnings"] == [warned]
    assert summary["a950-node1"]["dflash_lm_head_gate"] == "absent"
    assert summary["a2-node1"]["warnings"] == []
    section = (out / "fleet.md").read_text().split("## a950-node1 (ascend-950)", 1)[1]
    assert f"- Warning: {warned}" in section.split("\n## ", 1)[0]


def test_the_gate_verdicts_name_why_a_host_fails() -> None:
    """What the validate role's gate does with each host (specfleet_verdict): unreachable ends
    it as unreachable, a refusal is shown whole, a failed stage with its error, damaged stages
    with their detail, failed artifact tests by name; stale or skipped stages pass."""
    base = {
        "name": "h1",
        "reachable": True,
        "failed_stage": None,
        "error": None,
        "refused": None,
        "stages": {"models": {"status": "passed", "detail": ""}},
        "artifact_tests": {},
    }
    where = "\nreport: /r/fleet.md"
    verdict = fleet_report.gate_verdict
    assert verdict(base, "/r") == {}
    assert verdict({**base, "reachable": False, "error": "ssh: timed out"}, "/r") == {
        "unreachable": True,
        "msg": f"h1 is not green: unreachable: ssh: timed out;{where}",
    }
    refused = {**base, "refused": {"stage": "train", "error": "x" * 400}}
    assert verdict(refused, "/r") == {
        "fail": f"h1 is not green: settings refused (train): {'x' * 400};{where}"
    }
    failed = {**base, "failed_stage": "data", "error": "boom"}
    assert verdict(failed, "/r")["fail"] == f"h1 is not green: stage data failed: boom;{where}"
    damaged = {**base, "stages": {"models": {"status": "damaged", "detail": "config.json changed"}}}
    assert "models config.json changed" in verdict(damaged, "/r")["fail"]
    tests = {**base, "artifact_tests": {"failed": 1, "failures": [{"test": "t1", "message": "m"}]}}
    assert verdict(tests, "/r")["fail"] == (
        f"h1 is not green: 1 artifact test(s) failed: t1 (m);{where}"
    )
    stale = {**base, "stages": {"models": {"status": "would_run", "detail": "would run: x"}}}
    assert verdict(stale, "/r") == {}


def test_modes_the_close_set_again_are_among_the_hosts_warnings(tmp_path):
    """What the run's close found writable by others under the work root and set again is in
    the report (the run said it as a warning too), not only in the run's output."""
    restored = "/srv/specfleet/hidden_states (0757 -> 0755)"
    doc = document({"a2-node1": {**host("atlas-a2"), "restored_modes": [restored]}})
    out = run(tmp_path, doc).out
    summary = json.loads((out / "fleet.json").read_text())["hosts"][0]["summary"]
    assert len(summary["warnings"]) == 1 and restored in summary["warnings"][0]
    assert restored.replace(">", "\\>") in (out / "fleet.md").read_text()
