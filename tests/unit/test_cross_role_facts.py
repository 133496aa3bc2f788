"""The facts that cross roles: what one part of the project sets on a host at run time and another
reads. They are the contract between the roles, so they are few, and each is named in the table
of docs/architecture.md ("Facts that cross roles"); a fact that starts crossing, or one that
stops, fails here until the table says so.

A fact is what a task sets on a host: a set_fact key, a `register:` name, a fact of the
specfleet_rules action (`facts:`), or a key an action plugin hands to
plugins/plugin_utils/facts.py's set_facts. Names starting with `_` are a file's own. A part is a
role (roles/<name>), the playbooks (playbooks/, site.yml) or the plugins; a fact crosses when
the code of two parts names it (comments and docstrings do not count)."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "architecture.md"
LIMIT = 10  # issue 41: 38 before the redesign
NESTED = ("block", "rescue", "always", "tasks", "pre_tasks", "post_tasks", "handlers")


def tasks(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, list):
        for item in node:
            if isinstance(item, dict):
                yield item
                for key in NESTED:
                    yield from tasks(item.get(key))


def yaml_files() -> list[Path]:
    return sorted([*REPO.glob("roles/*/tasks/*.yml"), *REPO.glob("roles/*/handlers/*.yml"),
                   *REPO.glob("playbooks/*.yml"), REPO / "site.yml"])  # fmt: skip


def set_in_yaml() -> set[str]:
    names: set[str] = set()
    for path in yaml_files():
        for task in tasks(yaml.safe_load(path.read_text())):
            for module in ("ansible.builtin.set_fact", "set_fact"):
                if isinstance(task.get(module), dict):
                    names |= set(task[module]) - {"cacheable"}
            rules = task.get("specfleet.ascend.specfleet_rules")
            if isinstance(rules, dict) and isinstance(rules.get("facts"), dict):
                names |= set(rules["facts"])
            if isinstance(task.get("register"), str):
                names.add(task["register"])
    return names


def dict_keys(node: ast.AST | None) -> set[str]:
    if isinstance(node, ast.Dict):
        return {
            k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)
        }
    return set()


def set_in_plugins() -> set[str]:
    """The keys of the dicts handed to set_facts: a literal at the call, a name assigned a
    literal in the same function, or a function's returned (result, facts) pair whose caller
    hands `facts` on (specfleet_stage_decide's decide())."""
    names: set[str] = set()
    for path in sorted(REPO.glob("plugins/action/*.py")):
        tree = ast.parse(path.read_text())
        if "set_facts" not in path.read_text():
            continue
        for function in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
            assigned: dict[str, set[str]] = {}
            for node in ast.walk(function):
                if isinstance(node, ast.Assign) and len(node.targets) == 1:
                    target = node.targets[0]
                    if isinstance(target, ast.Name):
                        assigned.setdefault(target.id, set()).update(dict_keys(node.value))
            for node in ast.walk(function):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "set_facts":
                    handed = node.args[1]
                    names |= dict_keys(handed)
                    if isinstance(handed, ast.Name):
                        names |= assigned.get(handed.id, set())
                    if isinstance(handed, ast.Call):  # set_facts(self, dict(a=..., b=...))
                        names |= {k.arg for k in handed.keywords if k.arg}
                if isinstance(node, ast.Return) and isinstance(node.value, ast.Tuple):
                    for element in node.value.elts[1:]:
                        names |= dict_keys(element)
    return names


def code_of_python(text: str) -> str:
    """The source without comments and docstrings."""
    tree = ast.parse(text)
    docstrings = {
        body[0].value.lineno
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and (body := node.body)
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    }
    kept = []
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            continue
        if token.type == tokenize.STRING and token.start[0] in docstrings:
            continue
        kept.append(token.string)
    return " ".join(kept)


def code_of_text(text: str) -> str:
    """A YAML file, template or script without its comment lines (YAML's and the shell's `#`
    lines, Jinja's {# #})."""
    text = re.sub(r"\{#.*?#\}", " ", text, flags=re.S)
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def part_of(path: Path) -> str:
    relative = path.relative_to(REPO).parts
    if relative[0] == "roles":
        return f"role {relative[1]}"
    return "plugins" if relative[0] == "plugins" else "playbooks"


def code_by_part() -> dict[str, str]:
    parts: dict[str, list[str]] = {}
    files = [*REPO.glob("roles/*/*/**/*"), *REPO.glob("playbooks/*.yml"), REPO / "site.yml",
             *REPO.glob("plugins/**/*.py")]  # fmt: skip
    for path in files:
        if not path.is_file() or path.suffix == ".md":
            continue
        text = path.read_text(errors="replace")
        code = code_of_python(text) if path.suffix == ".py" else code_of_text(text)
        parts.setdefault(part_of(path), []).append(code)
    return {part: "\n".join(texts) for part, texts in parts.items()}


def crossing() -> dict[str, list[str]]:
    code = code_by_part()
    found = {}
    for name in sorted(set_in_yaml() | set_in_plugins()):
        if name.startswith("_"):
            continue
        word = re.compile(rf"(?<![\w.]){re.escape(name)}(?!\w)")
        parts = sorted(part for part, text in code.items() if word.search(text))
        if len(parts) > 1:
            found[name] = parts
    return found


def documented() -> set[str]:
    section = DOC.read_text().split("### Facts that cross roles", 1)[1].split("\n#", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`([a-z_]+)`", row.split("|")[1])}


def test_the_facts_that_cross_roles_are_the_documented_ones() -> None:
    found = crossing()
    said = "\n".join(f"  {name}: {', '.join(parts)}" for name, parts in found.items())
    assert set(found) == documented(), (
        f"the facts that cross roles (set in one part, read in another):\n{said}\n"
        f"are not the ones docs/architecture.md's table names: {sorted(documented())}"
    )


def test_few_facts_cross_roles() -> None:
    found = crossing()
    assert len(found) <= LIMIT, f"{len(found)} facts cross roles (at most {LIMIT}): {sorted(found)}"


def test_the_finder_sees_each_kind_of_writer() -> None:
    """Guards the test itself: a set_fact key, a register, a specfleet_rules fact and an
    action's set_facts key are each found."""
    assert "specfleet_failed_stage" in set_in_yaml()  # stage/failed.yml's set_fact
    assert "stage_decision" in set_in_yaml()  # stage/begin.yml's register
    assert "specfleet_host_stopped" in set_in_plugins()  # specfleet_settings' set_facts
    assert "specfleet_stage_plan" in set_in_plugins()  # specfleet_stage_plan's set_facts
