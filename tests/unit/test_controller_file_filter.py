"""plugins/filter/controller_file.py: the sha256 of a controller file a stage declares among its
inputs (data's input_sha256), its bytes as they are, read again when the file changes."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError
from plugin_loader import load_plugin

filters = load_plugin("plugins/filter/controller_file.py")


def test_the_files_bytes_are_hashed_and_a_change_read_again(tmp_path: Path) -> None:
    chats = tmp_path / "chats.jsonl"
    chats.write_bytes(b'{"conversations": []}\n')
    assert filters.file_sha256(str(chats)) == hashlib.sha256(chats.read_bytes()).hexdigest()
    chats.write_bytes(b'{"conversations": [1]}\n')
    os.utime(chats, ns=(1, 10**9))
    assert filters.file_sha256(str(chats)) == hashlib.sha256(chats.read_bytes()).hexdigest()


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(AnsibleFilterError, match=r"cannot read .*gone\.jsonl on the controller"):
        filters.file_sha256(str(tmp_path / "gone.jsonl"))
