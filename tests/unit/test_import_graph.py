"""The import graph of specfleet_helpers, built from the sources with ast: no cycles, and the
leaf modules stay leaves.

Every import counts, those inside functions too: a cycle hidden in a function (host_lock
once imported stage_run and vllm_server there, which import host_lock) is still a cycle.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "python_helpers" / "specfleet_helpers"
ROOT = PACKAGE.name


def module_name(path: Path) -> str:
    parts = [ROOT, *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The package's modules that `path` imports (packages count as their __init__)."""
    this = module_name(path)
    package = this if path.name == "__init__.py" else this.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            found.add(base)
            # `from pkg import mod` imports the module pkg.mod
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in found if name in known and name != this}


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports_of(path, set(mods)) for name, path in mods.items()}


def test_the_graph_is_read_from_the_sources():
    edges = graph()
    assert "specfleet_helpers.host.procs" in edges["specfleet_helpers.host.stage_run"]
    assert "specfleet_helpers.host.host_lock" in edges["specfleet_helpers.host.stage_run"]
    assert "specfleet_helpers.files" in edges["specfleet_helpers.checks.model_check"]


def test_no_import_cycles():
    edges = graph()
    try:
        order = list(graphlib.TopologicalSorter(edges).static_order())
    except graphlib.CycleError as exc:
        pytest.fail(f"import cycle in specfleet_helpers: {' -> '.join(exc.args[1])}")
    assert set(order) == set(edges)


@pytest.mark.parametrize(
    ("module", "allowed"),
    [
        # Leaves of the whole package: usable from any interpreter, importing nothing of ours.
        ("specfleet_helpers.files", set()),
        # The host lock must not know the runners: it ends stages through procs' records. The
        # stamps and the verification a play's start prints with the lock are session's.
        (
            "specfleet_helpers.host.host_lock",
            {"specfleet_helpers.files", "specfleet_helpers.host", "specfleet_helpers.host.procs"},
        ),
        ("specfleet_helpers.host.procs", set()),
        ("specfleet_helpers.host.stamps", set()),
    ],
)
def test_leaf_modules_stay_leaves(module: str, allowed: set[str]):
    assert graph()[module] <= allowed, f"{module} imports {sorted(graph()[module] - allowed)}"
