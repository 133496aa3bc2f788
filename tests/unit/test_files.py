"""Tests for specfleet_helpers.files: the one atomic write, the one ANSI regex (and the log
tail built on it), the one safetensors header reader."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
from specfleet_helpers import files


def safetensors(tensors: dict, data: bytes) -> bytes:
    raw = json.dumps(tensors).encode()
    return struct.pack("<Q", len(raw)) + raw + data


def test_write_json_atomic_replaces_whole_and_leaves_no_temporary(tmp_path: Path):
    path = tmp_path / "state.json"
    path.write_text("old")
    files.write_json_atomic(path, {"b": 1, "a": [1, 2]})
    assert path.read_text() == '{"a": [1, 2], "b": 1}\n'
    files.write_json_atomic(path, {"x": 1}, indent=1)
    assert json.loads(path.read_text()) == {"x": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_a_failed_write_keeps_the_old_file_and_removes_its_temporary(tmp_path: Path):
    path = tmp_path / "rows.jsonl"
    path.write_text("complete\n")
    with pytest.raises(RuntimeError), files.atomic_path(path) as tmp:
        tmp.write_text("half")
        raise RuntimeError("interrupted")
    assert path.read_text() == "complete\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.jsonl"]
    with pytest.raises(TypeError):
        files.write_json_atomic(path, {"not": object()})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.jsonl"]


def test_temporary_names_are_hidden_siblings_unique_per_call(tmp_path: Path):
    a, b = files.tmp_sibling(tmp_path / "x"), files.tmp_sibling(tmp_path / "x")
    assert a != b and a.parent == tmp_path and a.name.startswith(".x.") and a.suffix == ".tmp"
    assert str(os.getpid()) in a.name


@pytest.mark.parametrize(
    ("text", "plain"),
    [
        ("\x1b[1;32mok\x1b[0m", "ok"),  # colours
        ("\x1b[2K\x1b[1Gdone", "done"),  # cursor moves
        ("\x1b]8;id=1;file:///x\x1b\\link\x1b]8;;\x1b\\", "link"),  # rich hyperlinks (OSC/ST)
        ("\x1b]0;title\x07text", "text"),  # OSC ended by BEL
        ("\x1bMup\x1b\\", "up"),  # two-byte escapes
        ("val/loss_epoch=1.5", "val/loss_epoch=1.5"),
    ],
)
def test_strip_ansi(text: str, plain: str):
    assert files.strip_ansi(text) == plain


def test_tail_lines_drops_escapes_and_blank_lines(tmp_path: Path):
    log = tmp_path / "x.log"
    log.write_text("one\n\n\x1b[31mtwo\x1b[0m\n10%\r50%\r100%\n   \nthree\n")
    assert files.tail_lines(log, 5) == ["two", "10%", "50%", "100%", "three"]
    assert files.tail_lines(log, 0) == []
    assert files.tail_lines(tmp_path / "absent.log", 5) == []


def test_safetensors_header_of_a_complete_file(tmp_path: Path):
    path = tmp_path / "w.safetensors"
    entry = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
    path.write_bytes(safetensors({"__metadata__": {"format": "pt"}, "w": entry}, bytes(8)))
    assert files.read_safetensors_header(path) == {"w": entry}


@pytest.mark.parametrize(
    ("content", "kind", "fragment", "tensor"),
    [
        (b"", "empty", "empty file", None),
        (b"abc", "short", "too short", None),
        (struct.pack("<Q", 999) + b"{}", "header_length", "does not fit", None),
        (struct.pack("<Q", 4) + b"{not", "header", "not valid JSON", None),
        (struct.pack("<Q", 2) + b"[]", "header", "not a JSON object", None),
        (
            safetensors({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, bytes(8)),
            "size",
            "(truncated)",
            "w",
        ),
        (
            safetensors({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, bytes(9)),
            "size",
            "has trailing bytes",
            None,
        ),
        (
            safetensors({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, bytes(8)),
            "entry",
            "needs 12 bytes",
            "w",
        ),
        (
            safetensors({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}, b""),
            "entry",
            "data_offsets must be",
            "w",
        ),
    ],
)
def test_safetensors_header_refuses_what_is_not_complete(
    tmp_path: Path, content: bytes, kind: str, fragment: str, tensor: str | None
):
    path = tmp_path / "w.safetensors"
    path.write_bytes(content)
    with pytest.raises(files.SafetensorsError) as info:
        files.read_safetensors_header(path)
    assert info.value.kind == kind
    assert fragment in str(info.value) and str(info.value).startswith(f"{path}: ")
    assert info.value.tensor == tensor


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2-exchange", "two-renames"])
@pytest.mark.parametrize("old", ["directory", "symlink", "absent"])
def test_replace_dir_puts_the_new_directory_in_place(tmp_path, monkeypatch, exchange, old):
    if not exchange:
        monkeypatch.setattr(files, "exchange_paths", lambda first, second: False)
    out = tmp_path / "out"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_text("not ours")
    if old == "directory":
        out.mkdir()
        (out / "old").write_text("old")
    elif old == "symlink":
        out.symlink_to(elsewhere)
    new = tmp_path / ".out.new"
    new.mkdir()
    (new / "new").write_text("new")
    files.replace_dir(new, out)
    assert sorted(p.name for p in out.iterdir()) == ["new"] and not out.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "out"]
    assert (elsewhere / "keep").read_text() == "not ours"  # a replaced link's target stays


def test_replace_dir_puts_the_old_one_back_when_the_rename_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "exchange_paths", lambda first, second: False)
    out, new = tmp_path / "out", tmp_path / ".out.new"
    out.mkdir()
    (out / "old").write_text("old")
    new.mkdir()
    real_rename = os.rename

    def rename(source, destination):
        if Path(source) == new:
            raise OSError(5, "Input/output error")
        return real_rename(source, destination)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(OSError, match="Input/output error"):
        files.replace_dir(new, out)
    assert sorted(p.name for p in out.iterdir()) == ["old"]
