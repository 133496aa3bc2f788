"""Tests for specfleet_helpers.host.session: a play's start and end on a host in one process,
run as Ansible runs it (``python -m``), on real files, with real checker processes."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from specfleet_helpers.checks import stage_verify
from specfleet_helpers.host import stamps

HELPERS = Path(__file__).resolve().parents[2] / "python_helpers"
OWNER = {"controller": "ctl1", "pid": 1234, "user": "root", "playbook": "site.yml"}


def session(*args: object) -> tuple[int, dict[str, Any], str]:
    done = subprocess.run(
        [sys.executable, "-m", "specfleet_helpers.host.session", *(str(a) for a in args)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(HELPERS)},
    )
    lines = done.stdout.splitlines()
    assert len(lines) == 1, f"expected one JSON line, got {done.stdout!r} ({done.stderr!r})"
    return done.returncode, json.loads(lines[0]), done.stderr


def open_(root: Path, token: str, *extra: object) -> tuple[int, dict[str, Any], str]:
    return session(
        "open",
        f"--lock={root / 'run' / 'lock.json'}",
        f"--token={token}",
        f"--owner={json.dumps(OWNER)}",
        f"--state-dir={root / 'state'}",
        *(f"--layout={root / d}" for d in ("", "state", "run", "logs", "lib")),
        *extra,
    )


def stamped(root: Path, stage: str, checker_prints: dict[str, Any]) -> list[str]:
    """A stage with one artifact file, stamped by a checker that counts its runs."""
    out = root / "out" / stage
    out.mkdir(parents=True)
    (out / "weights.bin").write_bytes(b"w" * 64)
    runs = root / f"{stage}.runs"
    code = (
        f"import pathlib, sys; p = pathlib.Path({str(runs)!r}); "
        "p.write_text(str(int(p.read_text() or 0) + 1) if p.exists() else '1'); "
        f"print({json.dumps(json.dumps(checker_prints))})"
    )
    argv = [sys.executable, "-c", code]
    stamps.write(
        root / "state",
        {
            "stage": stage,
            "run_id": f"{stage}-r1",
            "metrics": checker_prints,
            "artifacts": {"out": str(out)},
            "manifest": stage_verify.manifest([out]),
            "verify_argv": argv,
        },
    )
    return argv


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "specfleet root"


def test_open_lays_out_the_root_takes_the_lock_and_verifies_the_named_stages(root: Path):
    rc, result, err = open_(root, "run-a")
    assert rc == 0, err
    assert result["acquired"] and result["state"]["stamps"] == {} and result["verification"] == {}
    for name in ("state", "run", "logs", "lib"):
        assert stat.S_IMODE((root / name).stat().st_mode) == 0o750
    stamped(root, "data", {"rows": 4})
    stamped(root, "train", {"val_loss_finite": True})

    rc, result, err = open_(root, "run-a", "--verify=data,serve")
    assert rc == 0, err
    # Only the named stages that have a stamp: serve has none, train was not named.
    assert set(result["verification"]) == {"data"}
    assert result["verification"]["data"]["status"] == "ok"
    assert set(result["state"]["stamps"]) == {"data", "train"}
    assert (root / "data.runs").read_text() == "1" and not (root / "train.runs").exists()
    # The plays get each stamp's file list as its counts; the stamp on the host keeps it.
    assert result["state"]["stamps"]["data"]["manifest"]["files"] == 1
    on_host = json.loads((root / "state" / "data.json").read_text())
    assert list(on_host["manifest"]["files"]) == [str(root / "out" / "data" / "weights.bin")]


def test_open_recreates_a_removed_directory_of_the_layout(root: Path):
    assert open_(root, "run-a")[0] == 0
    (root / "logs").rmdir()
    assert open_(root, "run-a")[0] == 0
    assert (root / "logs").is_dir()


def test_open_sets_the_mode_of_the_layout_again_and_says_so(root: Path):
    """A re-run sets again the mode the project gave its directories; a no-op says nothing."""
    assert open_(root, "run-a")[1]["restored_modes"] == []
    os.chmod(root / "state", 0o777)
    rc, result, err = open_(root, "run-a")
    assert rc == 0, err
    assert result["restored_modes"] == [f"{root / 'state'} (0777 -> 0750)"]
    assert stat.S_IMODE((root / "state").stat().st_mode) == 0o750
    assert open_(root, "run-a")[1]["restored_modes"] == []


def test_open_refused_by_another_run_prints_neither_state_nor_verification(root: Path):
    assert open_(root, "run-a")[0] == 0
    stamped(root, "data", {"rows": 4})
    rc, result, err = open_(root, "run-b", "--verify=data")
    assert rc == 4 and not result["acquired"], result
    assert "state" not in result and "verification" not in result
    assert "held by" in err or "host_lock" in err
    assert not (root / "data.runs").exists()


def test_open_reports_damage_in_the_words_begin_records(root: Path):
    assert open_(root, "run-a")[0] == 0
    stamped(root, "data", {"rows": 4})
    (root / "out" / "data" / "weights.bin").write_bytes(b"short")
    rc, result, _ = open_(root, "run-a", "--verify=data")
    assert rc == 0
    found = result["verification"]["data"]
    assert found["status"] == "damaged" and "weights.bin" in found["problem"], found


def test_close_verifies_what_the_run_did_not_check_then_releases(root: Path):
    assert open_(root, "run-a")[0] == 0
    stamped(root, "data", {"rows": 4})
    stamped(root, "train", {"val_loss_finite": True})
    lock = root / "run" / "lock.json"
    rc, result, err = session(
        "close", f"--state-dir={root / 'state'}", "--skip=data", f"--lock={lock}", "--token=run-a"
    )
    assert rc == 0, err
    assert set(result["verification"]) == {"train"} and result["released"] is True
    assert set(result["state"]["stamps"]) == {"data", "train"}
    assert not lock.exists()


def test_close_on_its_own_holds_no_lock_and_reports_the_versions(root: Path):
    assert open_(root, "run-a")[0] == 0
    stamps.write(
        root / "state",
        {"stage": "speculators_install", "run_id": "s1", "artifacts": {"python": sys.executable}},
    )
    rc, result, err = session("close", f"--state-dir={root / 'state'}", "--versions")
    assert rc == 0, err
    assert "released" not in result
    assert result["versions"]["executable"] == sys.executable
    assert (root / "run" / "lock.json").exists()


def test_close_keeps_a_venvs_versions_while_its_packages_are_unchanged(root: Path):
    """stack_report is asked once, then again only when a package is installed or removed."""
    assert open_(root, "run-a")[0] == 0
    venv = root / "venv"
    site = venv / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (venv / "bin").mkdir()
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    # The venv's python: a script that counts how often it is asked, then is this Python.
    asked = root / "asked"
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/sh\necho x >> "{asked}"\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    stamps.write(
        root / "state",
        {
            "stage": "speculators_install",
            "run_id": "s1",
            "artifacts": {"python": str(python), "venv": str(venv)},
        },
    )

    def versions() -> dict[str, Any]:
        rc, result, err = session("close", f"--state-dir={root / 'state'}", "--versions")
        assert rc == 0, err
        return result["versions"]

    first = versions()
    assert first["executable"] and versions() == first
    assert asked.read_text().count("x") == 1
    (site / "newpkg-1.0.dist-info").mkdir()
    assert versions() == first and asked.read_text().count("x") == 2


def test_close_wants_the_lock_and_its_token_together(root: Path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "specfleet_helpers.host.session",
            "close",
            "--state-dir=x",
            "--lock=y",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(HELPERS)},
    )
    assert done.returncode == 2 and "--lock and --token go together" in done.stderr


def test_open_prints_the_sha1_and_mode_of_the_files_the_play_writes(root: Path):
    wrapper = root / "run" / "specfleet-env"
    assert open_(root, "run-a")[0] == 0
    wrapper.write_text('#!/bin/sh\nexec "$@"\n')
    wrapper.chmod(0o750)
    rc, result, err = open_(
        root, "run-a", f"--file={wrapper}", f"--file={root / 'state' / 'x.json'}"
    )
    assert rc == 0, err
    assert result["files"] == {
        str(wrapper): {"sha1": hashlib.sha1(wrapper.read_bytes()).hexdigest(), "mode": "0750"},
        str(root / "state" / "x.json"): None,
    }


def test_close_signs_the_work_root_by_what_stat_tells(root: Path):
    """The signature the artifact suite's verdict is reused on: the same while nothing under
    the work root changed (the lock every run takes aside), another when a file's content or
    any entry's mode changed, a file came or went, or the venv's packages changed."""
    assert open_(root, "run-a")[0] == 0
    stamped(root, "data", {"rows": 4})
    (root / "venv" / "lib" / "python3.11" / "site-packages" / "pkg").mkdir(parents=True)
    (root / "venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")

    def signature() -> str:
        # --skip: the test's checker counts its runs in a file under the work root.
        rc, result, err = session(
            "close", f"--state-dir={root / 'state'}", "--skip=data", f"--signature-root={root}"
        )
        assert rc == 0, err
        return result["signature"]

    first = signature()
    assert len(first) == 64 and signature() == first
    # Every run takes and drops the lock; a service appends to its log; a verification updates
    # its caches; files deep in the venv count by its markers only.
    (root / "run" / "lock.json").write_text("{}")
    (root / "logs" / "serve.log").write_text("GET /health 200\n")
    (root / "cache").mkdir(exist_ok=True)
    (root / "cache" / "sha256-index.json").write_text("{}")  # a verification's own cache
    (root / "venv" / "lib" / "python3.11" / "site-packages" / "pkg" / "mod.py").write_text("x")
    os.utime(root / "venv" / "lib" / "python3.11" / "site-packages", ns=(1, 1))
    settled = signature()
    weights = root / "out" / "data" / "weights.bin"
    before = weights.stat()
    weights.write_bytes(b"v" * 64)  # same size
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns + 1))
    edited = signature()
    assert edited != settled
    root.chmod(0o757)
    assert signature() != edited
    root.chmod(0o750)
    assert signature() == edited
    (root / "out" / "data" / "extra.bin").write_bytes(b"")
    assert signature() != edited
    (root / "out" / "data" / "extra.bin").unlink()
    assert signature() == edited
    (root / "venv" / "lib" / "python3.11" / "site-packages" / "pkg2").mkdir()
    assert signature() != edited


def test_close_signs_no_missing_work_root(root: Path):
    rc, result, err = session(
        "close", f"--state-dir={root / 'state'}", f"--signature-root={root / 'gone'}"
    )
    assert rc == 0, err
    assert result["signature"] is None


def test_close_restores_what_others_may_write_and_says_so(root: Path):
    """--restore-modes: the write bit for others comes off every directory and file under the
    work root that has it (what the artifact suite's test_work_root_not_world_writable holds
    the work root to), in the signature's own walk, listed and said; the venv and links are
    not the project's to set; a second close finds nothing, and signs the repaired tree."""
    assert open_(root, "run-a")[0] == 0
    stamped(root, "data", {"rows": 4})
    (root / "hidden_states").mkdir()
    (root / "hidden_states" / "hs_0.safetensors").write_bytes(b"h")
    (root / "logs" / "data.log").write_text("log\n")
    (root / "venv" / "bin").mkdir(parents=True)
    (root / "link").symlink_to(root / "hidden_states")
    for path, mode in (
        (root / "hidden_states", 0o757),
        (root / "hidden_states" / "hs_0.safetensors", 0o646),
        (root / "logs" / "data.log", 0o666),
        (root / "venv" / "bin", 0o777),
    ):
        path.chmod(mode)

    def close() -> dict[str, Any]:
        rc, result, err = session(
            "close", f"--state-dir={root / 'state'}", "--skip=data",
            f"--signature-root={root}", "--restore-modes",
        )  # fmt: skip
        assert rc == 0, err
        return result

    first = close()
    assert sorted(first["restored_modes"]) == sorted(
        [
            f"{root / 'hidden_states'} (0757 -> 0755)",
            f"{root / 'hidden_states' / 'hs_0.safetensors'} (0646 -> 0644)",
            f"{root / 'logs' / 'data.log'} (0666 -> 0664)",
        ]
    )
    assert len(first["warnings"]) == 1 and str(root / "hidden_states") in first["warnings"][0]
    assert stat.S_IMODE((root / "hidden_states").stat().st_mode) == 0o755
    assert stat.S_IMODE((root / "venv" / "bin").stat().st_mode) == 0o777
    second = close()
    assert second["restored_modes"] == [] and "warnings" not in second
    assert second["signature"] == first["signature"]
    # Without the option nothing is set again.
    (root / "hidden_states").chmod(0o757)
    rc, plain, _ = session(
        "close", f"--state-dir={root / 'state'}", "--skip=data", f"--signature-root={root}"
    )
    assert rc == 0 and "restored_modes" not in plain
    assert stat.S_IMODE((root / "hidden_states").stat().st_mode) == 0o757
