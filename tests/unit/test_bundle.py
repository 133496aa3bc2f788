"""Tests for specfleet_helpers.bundle: reproducible bytes, contents, and importing from it."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from specfleet_helpers import bundle

REPO_ROOT = Path(__file__).resolve().parents[2]
HELPERS = REPO_ROOT / "python_helpers"


def run_python(args: list[str], pythonpath: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env["PYTHONPATH"] = str(pythonpath)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=60, env=env, cwd=cwd
    )


def test_two_builds_are_byte_identical(tmp_path):
    first = bundle.build(tmp_path / "one" / "helpers.zip")
    time.sleep(1.1)  # a zip timestamp has 2 s resolution; make sure real times would differ
    second = bundle.build(tmp_path / "two" / "helpers.zip")
    assert first.read_bytes() == second.read_bytes()
    # No temporary file is left next to the result.
    assert sorted(p.name for p in first.parent.iterdir()) == ["helpers.zip"]


def test_bytes_depend_only_on_the_sources(tmp_path):
    copy = tmp_path / "src" / "specfleet_helpers"
    shutil.copytree(bundle.PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    for path in copy.rglob("*.py"):
        os.utime(path, (1_000_000_000, 1_000_000_000))
    # Bytecode next to the sources must not end up in the zip.
    (copy / "__pycache__").mkdir()
    (copy / "__pycache__" / "stage_run.cpython-313.pyc").write_bytes(b"\0" * 16)
    (copy / "__pycache__" / "stray.py").write_text("x = 1\n")
    (copy / "npu_smi.pyc").write_bytes(b"\0" * 16)
    from_copy = bundle.build(tmp_path / "copy.zip", package_dir=copy)
    original = bundle.build(tmp_path / "original.zip")
    assert from_copy.read_bytes() == original.read_bytes()


def test_zip_contents(tmp_path):
    out = bundle.build(tmp_path / "helpers.zip")
    with zipfile.ZipFile(out) as zf:
        infos = zf.infolist()
        names = [info.filename for info in infos]
        assert "specfleet_helpers/__init__.py" in names
        assert "specfleet_helpers/host/stage_run.py" in names
        assert names == sorted(names)
        assert all(name.startswith("specfleet_helpers/") for name in names)
        assert all(name.endswith(".py") for name in names)
        assert not [name for name in names if "__pycache__" in name or name.endswith(".pyc")]
        assert {info.date_time for info in infos} == {bundle.FIXED_TIME}
        assert (
            zf.read("specfleet_helpers/host/stage_run.py")
            == (bundle.PACKAGE_DIR / "host" / "stage_run.py").read_bytes()
        )
    expected = sorted(
        p.relative_to(bundle.PACKAGE_DIR).as_posix()
        for p in bundle.PACKAGE_DIR.rglob("*.py")
        if "__pycache__" not in p.parts
    )
    assert [name.split("/", 1)[1] for name in names] == expected


def test_a_module_runs_from_the_zip(tmp_path):
    out = bundle.build(tmp_path / "helpers.zip")
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    proc = run_python(["-m", "specfleet_helpers.host.stage_run", "--help"], out, elsewhere)
    assert proc.returncode == 0, proc.stderr
    assert "python -m specfleet_helpers.host.stage_run" in proc.stdout
    where = run_python(
        ["-c", "import specfleet_helpers.host.stage_run as m; print(m.__file__)"], out, elsewhere
    )
    assert where.returncode == 0, where.stderr
    assert where.stdout.strip().startswith(str(out))


def test_cli_writes_the_zip(tmp_path):
    out = tmp_path / "deep" / "helpers.zip"
    proc = run_python(["-m", "specfleet_helpers.bundle", f"--out={out}"], HELPERS, tmp_path)
    assert proc.returncode == 0, proc.stderr
    printed = json.loads(proc.stdout)
    assert printed == {"path": str(out), "sha1": hashlib.sha1(out.read_bytes()).hexdigest()}
    assert out.read_bytes() == bundle.build(tmp_path / "again.zip").read_bytes()
