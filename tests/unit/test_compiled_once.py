"""plugins/plugin_utils/compiled_once.py: inside the context a template source is compiled once
per Jinja environment, what it renders is unchanged, and outside it Ansible compiles as before.
With Ansible's real Templar, in this process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import jinja2
import pytest
from ansible.errors import AnsibleError
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from plugin_loader import load_plugin

compiled = load_plugin("plugins/plugin_utils/compiled_once.py")


@pytest.fixture
def compilations(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[list[str]]:
    """Every source Jinja compiles while the test runs (with a cache directory of its own)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    seen: list[str] = []
    original = jinja2.Environment.compile

    def counted(self, source, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(source if isinstance(source, str) else "<nodes>")
        return original(self, source, *args, **kwargs)

    monkeypatch.setattr(jinja2.Environment, "compile", counted)
    compiled._CODE.clear()  # kept for the process: each test starts without
    yield seen


def templar() -> Templar:
    """Variables as a play's are: templates that name each other."""
    variables = {"a": 2, "root": "/srv/{{ a }}", "b": "{{ root }}/x"}
    return Templar(
        loader=DataLoader(),
        variables={
            k: trust_as_template(v) if isinstance(v, str) else v for k, v in variables.items()
        },
    )


def test_the_same_source_is_compiled_once_and_renders_as_before(compilations: list[str]) -> None:
    outside = [templar().template(trust_as_template("{{ b }}-{{ a + 1 }}")) for _ in range(3)]
    compiled_outside = len(compilations)
    compilations.clear()
    with compiled.compiled_once():
        # a Templar (and its Jinja environment) of its own each time, as Ansible's lazy
        # templating and the stage script's renders make them
        inside = [templar().template(trust_as_template("{{ b }}-{{ a + 1 }}")) for _ in range(3)]
        t = templar()
        # a conditional is an expression: compiled once too
        assert all(t.evaluate_conditional(trust_as_template("a > 1")) for _ in range(3))
    assert inside == outside == ["/srv/2/x-3"] * 3
    # each of the three templates (the task's, b's, root's) once, the condition once
    assert compiled_outside == 9
    assert sorted(set(compilations)) == sorted(compilations), compilations
    assert len([s for s in compilations if s != "<nodes>"]) == 3


def test_outside_the_context_ansible_compiles_as_before(compilations: list[str]) -> None:
    from ansible._internal._templating._jinja_bits import AnsibleEnvironment

    before = (AnsibleEnvironment.compile, AnsibleEnvironment.compile_expression)
    with compiled.compiled_once():
        assert AnsibleEnvironment.compile is not before[0]
    assert (AnsibleEnvironment.compile, AnsibleEnvironment.compile_expression) == before
    t = templar()
    for _ in range(2):
        t.template(trust_as_template("{{ a }}"))
    assert compilations.count("{{ a }}") == 2


def test_a_source_that_does_not_compile_fails_each_time(compilations: list[str]) -> None:
    with compiled.compiled_once():
        t = templar()
        for _ in range(2):
            with pytest.raises(AnsibleError, match="unexpected"):
                t.template(trust_as_template("{{ a + }}"))
    assert compilations.count("{{ a + }}") == 2


def test_another_process_takes_the_compiled_code_from_the_cache(compilations: list[str]) -> None:
    """What one host's worker compiled, the next one's reads (a process of its own starts with
    nothing kept in memory); a cache file that is not code is compiled past and replaced."""
    with compiled.compiled_once():
        assert templar().template(trust_as_template("{{ a * 3 }}")) == 6
    assert compilations.count("{{ a * 3 }}") == 1
    kept = list(compiled.cache_dir().iterdir())
    assert len(kept) == 1, kept
    compiled._CODE.clear()
    with compiled.compiled_once():
        assert templar().template(trust_as_template("{{ a * 3 }}")) == 6
    assert compilations.count("{{ a * 3 }}") == 1
    kept[0].write_bytes(b"not marshal data")
    compiled._CODE.clear()
    with compiled.compiled_once():
        assert templar().template(trust_as_template("{{ a * 3 }}")) == 6
    assert compilations.count("{{ a * 3 }}") == 2
    compiled._CODE.clear()
    with compiled.compiled_once():
        assert templar().template(trust_as_template("{{ a * 3 }}")) == 6
    assert compilations.count("{{ a * 3 }}") == 2
