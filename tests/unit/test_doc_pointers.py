"""The docs' pointers into the tree hold: every repository path, playbook and relative link the
README, docs/ and the generated role READMEs name exists. A file moved or split (a vars file
turned into a directory, a check moved from one playbook to another) leaves pointers behind that
nothing else notices; 17 files once sent readers to the wrong playbook for the settings check."""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [
    REPO / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
    *sorted(REPO.glob("roles/*/README.md")),
]
# A path from the repository's root, as the docs write them (`playbooks/site.yml`, roles/x/...).
ROOTED = re.compile(
    r"(?<![\w./<>-])((?:playbooks|roles|python_helpers|scripts|tests|docs|plugins|molecule|"
    r"requirements|\.ci)/[\w./*<>{}-]*[\w*>}])"
)
# A path inside a role, in that role's README (meta/rules.yml, tasks/container.yml).
IN_ROLE = re.compile(
    r"(?<![\w./<>-])((?:meta|tasks|templates|defaults|vars|files|handlers)/[\w./-]*\w)"
)
# A playbook named on its own (`validate.yml`): it must exist somewhere in the tree.
BARE_YAML = re.compile(r"`([\w-]+\.ya?ml)`")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
# Paths written as a pattern or a placeholder (roles/<stage>/..., docs/*.md) name no one file.
PLACEHOLDER = re.compile(r"[*<>{}]")


@functools.cache
def _yaml_names() -> frozenset[str]:
    """The YAML file names of the source tree, walked once: the work root, caches, venvs and
    .git (dot directories, gigabytes after `make run`) are not walked."""
    names: set[str] = set()
    for _top, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        names.update(f for f in files if f.endswith((".yml", ".yaml")))
    return frozenset(names)


def _text(doc: Path) -> str:
    # The generated READMEs' header comment names the files they come from in general terms.
    return re.sub(r"<!--.*?-->", "", doc.read_text(), flags=re.S)


def _broken(doc: Path) -> list[str]:
    text = _text(doc)
    broken = []
    for match in ROOTED.finditer(text):
        path = match.group(1).rstrip(".")
        if PLACEHOLDER.search(path):
            continue
        if not (REPO / path).exists():
            broken.append(path)
    if doc.parent.parent.name == "roles":
        for match in IN_ROLE.finditer(text):
            path = match.group(1).rstrip(".")
            if not (doc.parent / path).exists():
                broken.append(f"{doc.parent.name}/{path}")
    for match in LINK.finditer(text):
        target = match.group(1)
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        if not (doc.parent / target).exists():
            broken.append(target)
    for match in BARE_YAML.finditer(text):
        name = match.group(1)
        if name not in _yaml_names():
            broken.append(name)
    return broken


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_path_the_doc_names_exists(doc: Path) -> None:
    assert _broken(doc) == [], f"{doc.relative_to(REPO)} names paths the tree does not hold"


def test_the_pointer_check_sees_a_missing_file(tmp_path: Path) -> None:
    doc = tmp_path / "README.md"
    doc.write_text(
        "See `roles/specfleet/vars/main.yml`, playbooks/site.yml and [x](nowhere.md).\n"
        "<!-- meta/rules.yml -->\n"
    )
    assert _broken(doc) == ["roles/specfleet/vars/main.yml", "nowhere.md"]


def test_the_settings_check_is_where_the_role_docs_say() -> None:
    """The role docs say which playbook checks every setting before any host work: that playbook
    holds the task that runs the argument specs and the rules."""
    pointer = re.compile(r"with the rules of meta/rules.yml \((playbooks/[\w.]+)")
    said = {
        m.group(1)
        for doc in REPO.glob("roles/*/README.md")
        for m in pointer.finditer(doc.read_text())
    }
    assert said == {"playbooks/stages.yml"}
    stages_play = (REPO / "playbooks/stages.yml").read_text()
    assert "Check every stage's settings before any host work" in stages_play
