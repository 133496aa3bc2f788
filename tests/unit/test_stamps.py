"""The state reader every play starts with: stamps, failure records and the environment."""

from __future__ import annotations

import json
from pathlib import Path

from specfleet_helpers.host import stamps


def write(path: Path, data) -> None:
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)


def test_reads_stamps_failures_and_environment(tmp_path: Path, capsys) -> None:
    write(tmp_path / "train.json", {"stage": "train", "run_id": "a"})
    write(tmp_path / "serve.failed.json", {"stage": "serve", "error": "exit code 1"})
    write(tmp_path / "npu_env.json", {"profile": "cpu"})
    assert stamps.main(["--state-dir", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stamps"] == {"train": {"stage": "train", "run_id": "a"}}
    assert out["failures"] == {"serve": {"stage": "serve", "error": "exit code 1"}}
    assert out["environment"] == {"profile": "cpu"}


def test_damaged_or_foreign_files_count_as_absent(tmp_path: Path) -> None:
    write(tmp_path / "data.json", '{"stage": "data", "run_')  # cut short by a full disk
    write(tmp_path / "convert.json", {"stage": "models"})  # a stamp copied under another name
    write(tmp_path / "train.failed.json", "[]")
    write(tmp_path / "npu_env.json", "not json")
    assert stamps.load_all(tmp_path) == {"stamps": {}, "failures": {}, "environment": {}}


def test_missing_state_dir_reads_as_empty(tmp_path: Path) -> None:
    assert stamps.load_all(tmp_path / "absent") == {"stamps": {}, "failures": {}, "environment": {}}


def test_manifest_counts_stand_for_the_file_list(tmp_path: Path, capsys) -> None:
    manifest = {"version": 1, "files": {"/a": [1, "x"], "/b": [2, "y"]}, "links": {}}
    write(tmp_path / "hidden_states.json", {"stage": "hidden_states", "manifest": manifest})
    write(tmp_path / "models.json", {"stage": "models"})
    assert stamps.main(["--state-dir", str(tmp_path), "--manifest-counts"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stamps"]["hidden_states"]["manifest"] == {"version": 1, "files": 2, "links": 0}
    assert out["stamps"]["models"] == {"stage": "models"}
    # Without the flag, and on disk, the list itself.
    assert stamps.load_all(tmp_path)["stamps"]["hidden_states"]["manifest"] == manifest
