"""plugins/lookup/tree_stats.py: the controller source's file list (roles/models/vars/main.yml),
which must stay what ansible.builtin.find listed for it before, or every controller-sourced
fleet would redo its models and every stage after them once. Compared with the real find
module in one real ansible-playbook run, on a tree with what find treats specially."""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from playrun import run_cases
from plugin_loader import load_plugin

tree_stats = load_plugin("plugins/lookup/tree_stats.py")


def make_tree(top: Path) -> tuple[Path, Path]:
    verifier, draft = top / "verifier", top / "draft"
    (verifier / "sub" / "deeper").mkdir(parents=True)
    (verifier / ".cache" / "hub").mkdir(parents=True)
    draft.mkdir()
    (verifier / "config.json").write_text("{}")
    (verifier / "sub" / "model.safetensors").write_bytes(b"x" * 1000)
    (verifier / "sub" / "deeper" / "tokenizer.json").write_text("{}")
    (verifier / ".hidden").write_text("skipped: its name starts with a dot")
    # In a hidden directory, a file whose own name is not hidden: find lists it.
    (verifier / ".cache" / "hub" / "blob").write_text("listed")
    (verifier / "link.json").symlink_to(verifier / "config.json")
    (verifier / "dirlink").symlink_to(verifier / "sub", target_is_directory=True)
    (draft / "config.json").write_text('{"a": 1}')
    os.utime(draft / "config.json", (1_700_000_000.75, 1_700_000_000.75))
    return verifier, draft


def test_the_files_are_the_ones_find_lists_with_the_same_fingerprint(tmp_path: Path) -> None:
    verifier, draft = make_tree(tmp_path / "models")
    missing = tmp_path / "not-there"
    paths = [str(verifier), str(draft), str(missing)]
    digest = "| sort | to_json | hash('sha256')"
    listed = "query('specfleet.ascend.tree_stats', p0, p1, p2)"
    found = "r_0.files | map(attribute='path') | zip(r_0.files | map(attribute='size'), " + (
        "r_0.files | map(attribute='mtime') | map('int'))"
    )
    cases = [
        {"name": "find", "ansible.builtin.find": {"paths": paths, "recurse": True}},
        {
            "name": "both",
            "ansible.builtin.debug": {
                "msg": {
                    "find": "{{ " + found + digest + " }}",
                    "lookup": "{{ " + listed + digest + " }}",
                    "listed": "{{ " + listed + " | map('first') | sort }}",
                }
            },
        },
    ]
    results = run_cases(tmp_path, cases, {f"p{i}": path for i, path in enumerate(paths)}).results
    both = results["both"]["msg"]
    assert isinstance(both, dict), both
    assert both["lookup"] == both["find"]
    assert both["listed"] == sorted(
        str(p)
        for p in (
            verifier / "config.json",
            verifier / "sub" / "model.safetensors",
            verifier / "sub" / "deeper" / "tokenizer.json",
            verifier / ".cache" / "hub" / "blob",
            draft / "config.json",
        )
    )


def test_a_file_is_its_path_size_and_whole_second_mtime(tmp_path: Path) -> None:
    _, draft = make_tree(tmp_path)
    assert tree_stats.tree_stats(str(draft)) == [[str(draft / "config.json"), 8, 1_700_000_000]]
    assert tree_stats.tree_stats(str(tmp_path / "nothing")) == []


def test_the_documentation_is_yaml_ansible_can_load() -> None:
    assert yaml.safe_load(tree_stats.DOCUMENTATION)["name"] == "tree_stats"
    assert yaml.safe_load(tree_stats.EXAMPLES)
