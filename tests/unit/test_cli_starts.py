"""Tests for specfleet_helpers.checks.cli_starts: the tools' start results are kept while the
installed tree is unchanged, and started again when a file in it changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from procutil import run_helper
from specfleet_helpers.checks import cli_starts


@pytest.fixture
def tree(tmp_path, monkeypatch) -> Path:
    """A stand-in for the interpreter's site-packages, so a test can change a file in it."""
    site = tmp_path / "site-packages"
    (site / "tool").mkdir(parents=True)
    (site / "tool" / "__init__.py").write_text("VERSION = '1'\n")
    monkeypatch.setattr(cli_starts, "installed_trees", lambda: [site])
    return site


def counting_command(tmp_path: Path, rc: int = 0) -> list[str]:
    """A command that appends a line to a file each time it really starts."""
    starts = tmp_path / "starts"
    code = f"open({str(starts)!r}, 'a').write('x\\n'); print('tool 1.0'); raise SystemExit({rc})"
    return [sys.executable, "-c", code]


def starts(tmp_path: Path) -> int:
    path = tmp_path / "starts"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_unchanged_tree_reads_the_record_back(tmp_path, tree):
    record = tmp_path / "cache" / "cli-starts.json"
    commands = {"tool": counting_command(tmp_path)}
    first = cli_starts.run(record, commands)
    second = cli_starts.run(record, commands)
    assert first["cached"] is False and second["cached"] is True
    assert second["results"] == first["results"]
    assert first["results"]["tool"]["rc"] == 0
    assert "tool 1.0" in first["results"]["tool"]["stdout"]
    assert starts(tmp_path) == 1


def test_a_changed_file_starts_the_tools_again(tmp_path, tree):
    record = tmp_path / "cli-starts.json"
    commands = {"tool": counting_command(tmp_path)}
    cli_starts.run(record, commands)
    module = tree / "tool" / "__init__.py"
    module.write_text("VERSION = '22'\n")  # a different size
    assert cli_starts.run(record, commands)["cached"] is False
    stat = module.stat()
    os.utime(module, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # same size, newer
    assert cli_starts.run(record, commands)["cached"] is False
    (tree / "tool" / "new.py").write_text("")
    assert cli_starts.run(record, commands)["cached"] is False
    assert starts(tmp_path) == 4


def test_bytecode_written_by_the_tools_does_not_change_the_key(tmp_path, tree):
    record = tmp_path / "cli-starts.json"
    commands = {"tool": counting_command(tmp_path)}
    cli_starts.run(record, commands)
    (tree / "tool" / "__pycache__").mkdir()
    (tree / "tool" / "__pycache__" / "__init__.cpython-311.pyc").write_bytes(b"\0" * 16)
    assert cli_starts.run(record, commands)["cached"] is True


def test_other_commands_are_not_read_from_the_record(tmp_path, tree):
    record = tmp_path / "cli-starts.json"
    cli_starts.run(record, {"tool": counting_command(tmp_path)})
    other = {"tool": [*counting_command(tmp_path), "--other"]}
    assert cli_starts.run(record, other)["cached"] is False


def test_an_unexpected_result_is_never_kept(tmp_path, tree):
    record = tmp_path / "cli-starts.json"
    failing = {"tool": counting_command(tmp_path, rc=3)}
    result = cli_starts.run(record, failing)
    assert result["results"]["tool"]["rc"] == 3
    assert not record.exists()
    assert cli_starts.run(record, failing)["cached"] is False
    assert starts(tmp_path) == 2


def test_an_expected_failure_is_kept(tmp_path, tree):
    """`pip show` of a build that must be absent exits 1: that is the good outcome."""
    record = tmp_path / "cli-starts.json"
    commands = {"absent": counting_command(tmp_path, rc=1)}
    cli_starts.run(record, commands, failing=frozenset({"absent"}))
    again = cli_starts.run(record, commands, failing=frozenset({"absent"}))
    assert again["cached"] is True and again["results"]["absent"]["rc"] == 1
    # The same command expected to succeed is another check: not read back.
    assert cli_starts.run(record, commands)["cached"] is False


def test_a_damaged_record_starts_the_tools_again(tmp_path, tree):
    record = tmp_path / "cli-starts.json"
    commands = {"tool": counting_command(tmp_path)}
    cli_starts.run(record, commands)
    record.write_text('{"version": 1, "key": ')
    assert cli_starts.run(record, commands)["cached"] is False
    assert json.loads(record.read_text())["version"] == cli_starts.RECORD_VERSION


def test_a_missing_tool_is_a_result_not_a_crash(tmp_path, tree):
    result = cli_starts.run(tmp_path / "r.json", {"gone": [str(tmp_path / "no-such-tool")]})
    assert result["results"]["gone"]["rc"] == 127
    assert "no-such-tool" in result["results"]["gone"]["stderr"]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return run_helper("specfleet_helpers.checks.cli_starts", *args)


def test_cli_runs_both_kinds_and_prints_one_json_object(tmp_path):
    ok = json.dumps([sys.executable, "-c", "print('speculators version: 0.9.0')"])
    absent = json.dumps([sys.executable, "-c", "raise SystemExit(1)"])
    record = tmp_path / "cli-starts.json"
    args = (f"--record={record}", f"--command=spec={ok}", f"--command-fails=absent={absent}")
    first = run_cli(*args)
    assert first.returncode == 0, first.stderr
    report = json.loads(first.stdout)
    assert report["cached"] is False
    assert report["results"]["spec"]["stdout"].strip() == "speculators version: 0.9.0"
    assert report["results"]["absent"]["rc"] == 1
    assert json.loads(run_cli(*args).stdout)["cached"] is True


@pytest.mark.parametrize("bad", ["novalue", "x=notjson", 'x={"a": 1}', "x=[]", '=["a"]'])
def test_cli_refuses_a_malformed_command(tmp_path, bad):
    done = run_cli(f"--record={tmp_path / 'r.json'}", f"--command={bad}")
    assert done.returncode == 2
    assert "expected NAME=<JSON list of strings>" in done.stderr


def test_cli_refuses_a_name_given_twice(tmp_path):
    argv = json.dumps([sys.executable, "-c", "pass"])
    done = run_cli(
        f"--record={tmp_path / 'r.json'}", f"--command=a={argv}", f"--command-fails=a={argv}"
    )
    assert done.returncode == 2
    assert "each command needs its own NAME" in done.stderr
