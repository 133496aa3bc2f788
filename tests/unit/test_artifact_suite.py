"""Tests for specfleet_helpers.report.artifact_suite: which hosts the artifact suite runs on,
which keep the verdict of their last full pass, and the junit XML the report reads.

pytest itself is stood in for by a function that writes the junit XML pytest would (the real
suite against real hosts runs in the integration tests: test_report_flow.py)."""

from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Optional

import pytest
from specfleet_helpers.report import artifact_suite, fleet_report, formats

TESTS = ("test_models_verified", "test_converted_draft")


@pytest.fixture
def suite(tmp_path: Path) -> Path:
    directory = tmp_path / "artifacts"
    directory.mkdir()
    (directory / "test_pipeline.py").write_text("def test_models_verified(host): pass\n")
    return directory


class FakePytest:
    """Writes the junit XML pytest would for the hosts asked, failing the tests named in
    `failing` ({host: test}); records the calls."""

    def __init__(self, failing: Optional[dict[str, str]] = None, rc: Optional[int] = None):
        self.calls: list[list[str]] = []
        self.failing = failing or {}
        self.rc = rc

    def __call__(self, suite: Path, hosts: list[str], junit: Path, extra: list[str]) -> int:
        self.calls.append(list(hosts))
        root = ET.Element("testsuites")
        cases = ET.SubElement(root, "testsuite", name="pytest")
        for host in hosts:
            for test in TESTS:
                case = ET.SubElement(
                    cases, "testcase", classname="test_pipeline", name=f"{test}[ansible://{host}]"
                )
                case.set("time", "0.010")
                if self.failing.get(host) == test:
                    ET.SubElement(case, "failure", message="assert False").text = "boom"
        ET.ElementTree(root).write(junit)
        if self.rc is not None:
            return self.rc
        return 1 if self.failing else 0


def inputs(signature: str = "sig-1", **extra: Any) -> dict[str, Any]:
    return {"signature": signature, "state": {"stamps": {"data": {"run_id": "r1"}}}, **extra}


def run(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    suite: Path,
    hosts: dict[str, Any],
    fake: FakePytest,
    report_id: str,
    *extra: str,
) -> tuple[int, dict[str, Any], Path]:
    monkeypatch.setattr(artifact_suite, "run_pytest", fake)
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(hosts)))
    junit = tmp_path / "reports" / report_id / "artifacts-junit.xml"
    out = io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    rc = artifact_suite.main(
        [
            f"--suite={suite}",
            f"--junit={junit}",
            f"--cache-dir={tmp_path / 'cache'}",
            f"--report-id={report_id}",
            *extra,
        ]
    )
    return rc, json.loads(out.getvalue().splitlines()[-1]), junit


def test_a_host_keeps_its_pass_until_something_it_reads_changes(monkeypatch, tmp_path, suite):
    fake = FakePytest()
    hosts = {"a2-node1": inputs(), "a3-node1": inputs()}
    rc, said, junit = run(monkeypatch, tmp_path, suite, hosts, fake, "r1")
    assert rc == 0 and said == {"tested": ["a2-node1", "a3-node1"], "reused": {}, "pytest_rc": 0}

    hosts["a3-node1"] = inputs("sig-2")  # a file under a3-node1's work root changed
    rc, said, junit = run(monkeypatch, tmp_path, suite, hosts, fake, "r2")
    assert rc == 0 and fake.calls == [["a2-node1", "a3-node1"], ["a3-node1"]]
    assert said == {"tested": ["a3-node1"], "reused": {"a2-node1": "r1"}, "pytest_rc": 0}

    # What the report reads: every host's cases, the kept ones naming the run they come from.
    found = fleet_report.read_artifact_junit(junit, list(hosts))
    assert [c["test"] for c in found["a2-node1"]] == list(TESTS)
    assert {c["reused_from"] for c in found["a2-node1"]} == {"r1"}
    assert {c["reused_from"] for c in found["a3-node1"]} == {None}
    kept = fleet_report.artifact_summary(found["a2-node1"])
    assert kept["reused_from"] == "r1" and kept["passed"] == 2
    assert formats.artifact_cell(kept) == "2/2 (as in r1)"
    assert fleet_report.artifact_summary(found["a3-node1"])["reused_from"] is None

    rc, said, _ = run(monkeypatch, tmp_path, suite, hosts, fake, "r3")
    assert said["tested"] == [] and said["reused"] == {"a2-node1": "r1", "a3-node1": "r2"}
    assert said["pytest_rc"] is None and rc == 0 and len(fake.calls) == 2


def test_a_changed_suite_or_runner_tests_every_host_again(monkeypatch, tmp_path, suite):
    fake = FakePytest()
    hosts = {"a2-node1": inputs()}
    run(monkeypatch, tmp_path, suite, hosts, fake, "r1")
    (suite / "test_pipeline.py").write_text("def test_models_verified(host): assert host\n")
    _, said, _ = run(monkeypatch, tmp_path, suite, hosts, fake, "r2")
    assert said["tested"] == ["a2-node1"]
    monkeypatch.setattr(artifact_suite.metadata, "version", lambda package: "99.0")
    _, said, _ = run(monkeypatch, tmp_path, suite, hosts, fake, "r3")
    assert said["tested"] == ["a2-node1"]


def test_only_a_full_pass_is_kept(monkeypatch, tmp_path, suite):
    """A host with a failed test is tested again next run (and its old record dropped); a
    host that passed beside it keeps its pass."""
    hosts = {"a2-node1": inputs(), "a3-node1": inputs()}
    failing = FakePytest(failing={"a3-node1": "test_converted_draft"})
    rc, said, junit = run(monkeypatch, tmp_path, suite, hosts, failing, "r1")
    assert rc == 1 and said["pytest_rc"] == 1
    found = fleet_report.read_artifact_junit(junit, list(hosts))
    assert fleet_report.artifact_summary(found["a3-node1"])["failed"] == 1
    assert not (tmp_path / "cache" / "a3-node1.json").exists()

    fake = FakePytest()
    _, said, _ = run(monkeypatch, tmp_path, suite, hosts, fake, "r2")
    assert said["tested"] == ["a3-node1"] and said["reused"] == {"a2-node1": "r1"}

    # A pass recorded earlier is dropped when the host fails.
    hosts["a2-node1"] = inputs("sig-2")
    run(
        monkeypatch,
        tmp_path,
        suite,
        hosts,
        FakePytest(failing={"a2-node1": "test_models_verified"}),
        "r3",
    )
    assert not (tmp_path / "cache" / "a2-node1.json").exists()


def test_a_suite_that_could_not_run_records_nothing(monkeypatch, tmp_path, suite):
    rc, said, _ = run(monkeypatch, tmp_path, suite, {"a2-node1": inputs()}, FakePytest(rc=4), "r1")
    assert rc == 4 and said["pytest_rc"] == 4
    assert not (tmp_path / "cache" / "a2-node1.json").exists()


def test_no_signature_or_no_reuse_always_tests(monkeypatch, tmp_path, suite):
    fake = FakePytest()
    unsigned = {"a2-node1": inputs(None)}
    run(monkeypatch, tmp_path, suite, unsigned, fake, "r1")
    run(monkeypatch, tmp_path, suite, unsigned, fake, "r2")
    assert fake.calls == [["a2-node1"], ["a2-node1"]]
    signed = {"a2-node1": inputs()}
    run(monkeypatch, tmp_path, suite, signed, fake, "r3")
    _, said, _ = run(monkeypatch, tmp_path, suite, signed, fake, "r4", "--no-reuse")
    assert said["tested"] == ["a2-node1"] and said["reused"] == {}


def test_a_damaged_record_is_not_reused(monkeypatch, tmp_path, suite):
    fake = FakePytest()
    hosts = {"a2-node1": inputs()}
    run(monkeypatch, tmp_path, suite, hosts, fake, "r1")
    record = tmp_path / "cache" / "a2-node1.json"
    kept = json.loads(record.read_text())
    for damage in (
        "{not json",
        json.dumps({**kept, "testcases": []}),
        json.dumps({**kept, "testcases": ["<testcase name='x'><failure/></testcase>"]}),
        json.dumps({**kept, "testcases": ["<broken"]}),
    ):
        record.write_text(damage)
        _, said, _ = run(monkeypatch, tmp_path, suite, hosts, fake, "r2")
        assert said["tested"] == ["a2-node1"], damage


def test_bad_stdin_is_refused_naming_what_was_expected(monkeypatch, tmp_path, suite, capsys):
    for given in ("not json", "{}", "[1]"):
        monkeypatch.setattr("sys.stdin", io.StringIO(given))
        with pytest.raises(SystemExit) as ended:
            artifact_suite.main(
                [
                    f"--suite={suite}",
                    f"--junit={tmp_path / 'j.xml'}",
                    f"--cache-dir={tmp_path / 'c'}",
                    "--report-id=r1",
                ]
            )
        assert ended.value.code == 2
        assert "expected" in capsys.readouterr().err


def test_help_names_the_entry_point(capsys):
    with pytest.raises(SystemExit) as ended:
        artifact_suite.main(["--help"])
    assert ended.value.code == 0
    assert "artifact_suite" in capsys.readouterr().out
