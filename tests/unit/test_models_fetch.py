"""Tests for specfleet_helpers.stages.models_fetch's cache layout (the download itself runs
against a local fake ModelScope in tests/integration/test_models_sources.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from specfleet_helpers.stages.models_fetch import adopt_legacy_copy, main, runbook_path

REPO_ROOT = Path(__file__).resolve().parents[2]


def legacy_download(cache: Path, org: str, name: str) -> Path:
    """A directory as modelscope's snapshot_download(cache_dir=cache) leaves it."""
    model = cache / org / name
    model.mkdir(parents=True)
    for file, content in ((".msc", b"index"), (".mv", b"Revision:abc"), ("config.json", b"{}")):
        (model / file).write_bytes(content)
    return model


def test_runbook_path_is_under_models():
    cache = Path("/c/hub")
    assert runbook_path(cache, "Qwen/Qwen3-8B") == cache / "models" / "Qwen" / "Qwen3-8B"
    # modelscope stores a dotted name with '___' (and links the real name to it).
    assert runbook_path(cache, "Qwen/Qwen2.5-7B") == cache / "models" / "Qwen" / "Qwen2___5-7B"


def test_legacy_copy_is_moved_with_its_index(tmp_path):
    legacy = legacy_download(tmp_path, "Qwen", "Qwen3-8B")
    inode = (legacy / "config.json").stat().st_ino
    assert adopt_legacy_copy(tmp_path, "Qwen/Qwen3-8B") == legacy
    target = tmp_path / "models" / "Qwen" / "Qwen3-8B"
    assert sorted(p.name for p in target.iterdir()) == [".msc", ".mv", "config.json"]
    assert (target / "config.json").stat().st_ino == inode
    assert not legacy.exists()


def test_legacy_dotted_name_and_its_dangling_link(tmp_path):
    legacy = legacy_download(tmp_path, "Qwen", "Qwen2___5-7B")
    (tmp_path / "Qwen" / "Qwen2.5-7B").symlink_to(legacy, target_is_directory=True)
    assert adopt_legacy_copy(tmp_path, "Qwen/Qwen2.5-7B") == legacy
    assert (tmp_path / "models" / "Qwen" / "Qwen2___5-7B" / ".msc").is_file()
    assert not (tmp_path / "Qwen" / "Qwen2.5-7B").is_symlink()


def test_runbook_copy_is_never_replaced(tmp_path):
    legacy = legacy_download(tmp_path, "Qwen", "Qwen3-8B")
    runbook = legacy_download(tmp_path / "models", "Qwen", "Qwen3-8B")
    assert adopt_legacy_copy(tmp_path, "Qwen/Qwen3-8B") is None
    assert (legacy / ".msc").is_file()
    assert (runbook / ".msc").is_file()


def test_a_directory_modelscope_did_not_index_is_left_alone(tmp_path):
    stray = tmp_path / "Qwen" / "Qwen3-8B"
    stray.mkdir(parents=True)
    (stray / "config.json").write_text("{}")
    assert adopt_legacy_copy(tmp_path, "Qwen/Qwen3-8B") is None
    assert (stray / "config.json").is_file()
    assert not (tmp_path / "models").exists()


def test_nothing_to_move(tmp_path):
    assert adopt_legacy_copy(tmp_path, "Qwen/Qwen3-8B") is None
    assert list(tmp_path.iterdir()) == []


def test_help_names_the_layout():
    proc = subprocess.run(
        [sys.executable, "-m", "specfleet_helpers.stages.models_fetch", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(REPO_ROOT / "python_helpers"), "PATH": "/usr/bin:/bin"},
        check=True,
    )
    assert "<cache>/models/<org>/<name>" in proc.stdout
    assert "MODELSCOPE_CACHE" in proc.stdout


def test_a_failed_download_is_one_line(tmp_path, capsys, monkeypatch):
    # No modelscope in the controller venv, or no server on port 9: either way one line.
    # fetch() sets MODELSCOPE_CACHE for modelscope; monkeypatch restores it afterwards.
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path))
    rc = main(
        [
            "--model-id=Qwen/Qwen3-8B",
            f"--cache-dir={tmp_path}",
            "--endpoint=http://127.0.0.1:9",
        ]
    )
    assert rc == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("download of Qwen/Qwen3-8B@master failed: ")
