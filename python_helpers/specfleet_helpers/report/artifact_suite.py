"""Run the testinfra artifact suite (tests/artifacts) against the hosts that need it, and reuse
its verdict for the hosts where nothing it reads has changed since it last passed there.

The validate role runs this on the controller, once per run, for the hosts whose stages all
passed. On stdin it takes, per host, what the suite's verdict depends on, as the host's close
helper reported it (specfleet_helpers.host.session close): the work root's signature (the stat
facts of every file under it), the stamps and records (state), the installed versions, the
stages' verification of this run, where the work root is and how the host is reached. The
host's key is the sha256 of that and of the suite itself (its files, pytest's and testinfra's
versions). A host whose key is the one recorded when the suite last passed there in full
(<cache-dir>/<host>.json) is not tested again: its test cases are taken from that record,
each marked with the report it came from (property specfleet_reused_from). The others are
tested in one pytest run, and each of them that passes in full is recorded.

Writes one junit XML (--junit) with every host's test cases, fresh and reused, and prints one
JSON line last: {"tested": [hosts], "reused": {host: report id}, "pytest_rc": rc or null}.
Exit status: pytest's (0 passed, 1 some test failed, other: the suite could not run), 0 when
every host was reused; 2 on bad usage.

    python -m specfleet_helpers.report.artifact_suite --suite tests/artifacts \\
        --junit reports/<id>/artifacts-junit.xml --cache-dir .cache/artifact-suite \\
        --report-id <id> -- -q --ansible-inventory=inventory/fleet.yml < hosts.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any, Optional

from specfleet_helpers.files import write_atomic
from specfleet_helpers.report.testcases import REUSED_FROM, testcase_host

PROG = "python -m specfleet_helpers.report.artifact_suite"


def suite_digest(suite: Path) -> str:
    """sha256 of the suite's files (path and content) and of pytest's and testinfra's
    versions: a changed test or a changed test runner tests every host again."""
    digest = hashlib.sha256()
    for path in sorted(p for p in suite.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(f"{path.relative_to(suite)}\0".encode())
        digest.update(path.read_bytes())
    for package in ("pytest", "pytest-testinfra"):
        try:
            digest.update(f"{package}=={metadata.version(package)}\0".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{package} missing\0".encode())
    return digest.hexdigest()


def host_key(suite: str, inputs: Any) -> Optional[str]:
    """The key of one host: None when what its verdict depends on is unknown (no signature:
    the work root could not be read), so it is tested."""
    if not isinstance(inputs, Mapping) or not inputs.get("signature"):
        return None
    text = json.dumps({"suite": suite, "host": inputs}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def record_path(cache_dir: Path, host: str) -> Path:
    return cache_dir / (re.sub(r"[^A-Za-z0-9._-]", "_", host) + ".json")


def load_record(cache_dir: Path, host: str) -> Optional[dict[str, Any]]:
    try:
        record = json.loads(record_path(cache_dir, host).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def reusable_cases(
    record: Optional[Mapping[str, Any]], key: Optional[str]
) -> Optional[list[ET.Element]]:
    """The record's test cases when it stands for this run: its key is this one and it holds
    test cases, none of them failed (only a full pass is recorded; this guards a record
    written otherwise). None when it does not."""
    if key is None or not record or record.get("key") != key:
        return None
    recorded = record.get("testcases")
    if not isinstance(recorded, list) or not recorded:
        return None
    try:
        cases = [ET.fromstring(case) for case in recorded]
    except (ET.ParseError, TypeError):
        return None
    return None if any(_failed(case) for case in cases) else cases


def _failed(case: ET.Element) -> bool:
    return case.find("failure") is not None or case.find("error") is not None


def cases_by_host(junit: Path, hosts: list[str]) -> dict[str, list[ET.Element]]:
    """{host: [testcase]} of a pytest junit XML; {} when it cannot be read."""
    try:
        root = ET.parse(junit).getroot()
    except (OSError, ET.ParseError):
        return {}
    found: dict[str, list[ET.Element]] = {}
    for case in root.iter("testcase"):
        named = testcase_host(case.get("name", ""), hosts)
        if named is not None:
            found.setdefault(named[1], []).append(case)
    return found


def mark_reused(case: ET.Element, report_id: str) -> ET.Element:
    properties = case.find("properties")
    if properties is None:
        properties = ET.Element("properties")
        case.insert(0, properties)
    if not any(p.get("name") == REUSED_FROM for p in properties):
        ET.SubElement(properties, "property", name=REUSED_FROM, value=report_id)
    return case


def merged_junit(cases: list[ET.Element]) -> bytes:
    counts = {
        "tests": len(cases),
        "failures": sum(c.find("failure") is not None for c in cases),
        "errors": sum(c.find("error") is not None for c in cases),
        "skipped": sum(c.find("skipped") is not None for c in cases),
    }
    root = ET.Element("testsuites")
    suite = ET.SubElement(
        root, "testsuite", name="artifacts", **{k: str(v) for k, v in counts.items()}
    )
    suite.extend(cases)
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)


def run_pytest(suite: Path, hosts: list[str], junit: Path, extra: list[str]) -> int:
    argv = [
        sys.executable,
        "-m",
        "pytest",
        str(suite),
        *extra,
        "--junitxml=" + str(junit),
        "--hosts=" + ",".join(f"ansible://{host}" for host in hosts),
    ]
    return subprocess.run(argv, check=False).returncode


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=__doc__.split("\n\n")[0],
        epilog="stdin: a JSON object {host: {signature, state, versions, ...}}; the hosts to test",
    )
    parser.add_argument("--suite", type=Path, required=True, help="the suite's directory")
    parser.add_argument("--junit", type=Path, required=True, help="the junit XML to write")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        required=True,
        help="where each host's last full pass is recorded (<host>.json)",
    )
    parser.add_argument(
        "--report-id", required=True, help="this run's report, named in the records it writes"
    )
    parser.add_argument(
        "--no-reuse", action="store_true", help="test every host (records are still written)"
    )
    parser.add_argument(
        "pytest_args", nargs="*", metavar="PYTEST_ARG", help="passed to pytest (after --)"
    )
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        given = json.loads(sys.stdin.read())
    except ValueError as exc:
        parser.error(f"stdin is not JSON ({exc}); expected {{host: {{signature, ...}}}}")
    if not isinstance(given, dict) or not given:
        parser.error("stdin: expected a non-empty JSON object {host: {signature, ...}}")
    if not args.suite.is_dir():
        parser.error(f"--suite {args.suite}: not a directory")
    hosts = list(given)
    digest = suite_digest(args.suite)
    keys = {host: host_key(digest, given[host]) for host in hosts}
    cases: dict[str, list[ET.Element]] = {}
    reused: dict[str, str] = {}
    for host in hosts:
        record = None if args.no_reuse else load_record(args.cache_dir, host)
        kept = reusable_cases(record, keys[host])
        if record is not None and kept is not None:
            since = str(record.get("report_id") or "?")
            cases[host] = [mark_reused(case, since) for case in kept]
            reused[host] = since
    tested = [host for host in hosts if host not in reused]
    rc: Optional[int] = None
    args.junit.parent.mkdir(parents=True, exist_ok=True)
    if tested:
        fresh_junit = args.junit.with_name(args.junit.name + ".pytest.xml")
        rc = run_pytest(args.suite, tested, fresh_junit, args.pytest_args)
        fresh = cases_by_host(fresh_junit, tested)
        fresh_junit.unlink(missing_ok=True)
        args.cache_dir.mkdir(parents=True, exist_ok=True)
        for host in tested:
            cases[host] = fresh.get(host, [])
            # The suite ran (another host's failure is 1): each host that passed in full counts.
            passed = rc in (0, 1) and cases[host] and not any(_failed(c) for c in cases[host])
            if passed and keys[host] is not None:
                record = {
                    "key": keys[host],
                    "report_id": args.report_id,
                    "testcases": [ET.tostring(c, encoding="unicode") for c in cases[host]],
                }
                write_atomic(record_path(args.cache_dir, host), json.dumps(record))
            else:
                record_path(args.cache_dir, host).unlink(missing_ok=True)
    write_atomic(args.junit, merged_junit([c for host in hosts for c in cases.get(host, [])]))
    print(json.dumps({"tested": tested, "reused": reused, "pytest_rc": rc}, sort_keys=True))
    return rc if rc is not None else 0


if __name__ == "__main__":
    sys.exit(main())
