"""Each template compiled once per task: the specfleet_settings and specfleet_stage_plan actions
template every stage role's defaults, rules and inputs for their host, and the same few hundred
template strings come back many times (a role default such as specfleet_root's is templated
anew each time another value names it): 865 compilations of 213 distinct templates in one
plan, 537 of 258 in one settings check. Jinja's compilation (parse, code generation, Python's
compile) was most of those tasks' controller CPU, paid again for every host, since Ansible runs
each task for each host in a worker process of its own.

Within `compiled_once()`, Ansible's Jinja environment keeps what it compiled, per environment
and per source, and hands the same compiled template back for the same source: what Jinja's own
loader cache does for template files. Compiling depends on the source, the environment and
Ansible's escape_backslashes setting of the compilation, which are the key; rendering, where
the variables come in, is unchanged. A compilation that fails is not kept (its error is raised
as before). Outside the context nothing changes; where Ansible's internals are not what this
expects (another ansible-core), it does nothing and the task compiles as before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

try:
    from ansible._internal._templating._jinja_bits import (
        AnsibleEnvironment,
        _TemplateCompileContext,
    )
except ImportError:  # another ansible-core: compile as it does
    AnsibleEnvironment = None  # type: ignore[assignment,misc]
    _TemplateCompileContext = None  # type: ignore[assignment,misc]

KEPT = "_specfleet_compiled"


def _escape_backslashes() -> object:
    context = _TemplateCompileContext.current(optional=True)
    return None if context is None else context.escape_backslashes


def _kept(environment: Any) -> dict[tuple[Any, ...], Any]:
    found = environment.__dict__.get(KEPT)
    if found is None:
        found = environment.__dict__[KEPT] = {}
    return found


@contextlib.contextmanager
def compiled_once() -> Iterator[None]:
    """Within it, a template or expression source compiled a second time by the same Jinja
    environment is the first compilation's result."""
    if AnsibleEnvironment is None or _TemplateCompileContext is None:
        yield
        return
    from_string = AnsibleEnvironment.from_string
    compile_expression = AnsibleEnvironment.compile_expression

    def kept_from_string(self: Any, source: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(source, str) or args or kwargs or self._debuggable_template_source:
            return from_string(self, source, *args, **kwargs)
        key = ("template", source, _escape_backslashes())
        kept = _kept(self)
        if key not in kept:
            kept[key] = from_string(self, source)
        return kept[key]

    def kept_expression(self: Any, source: str, *args: Any, **kwargs: Any) -> Any:
        if self._debuggable_template_source:
            return compile_expression(self, source, *args, **kwargs)
        key = ("expression", source, args, tuple(sorted(kwargs.items())), _escape_backslashes())
        kept = _kept(self)
        if key not in kept:
            kept[key] = compile_expression(self, source, *args, **kwargs)
        return kept[key]

    AnsibleEnvironment.from_string = kept_from_string  # type: ignore[method-assign]
    AnsibleEnvironment.compile_expression = kept_expression  # type: ignore[method-assign]
    try:
        yield
    finally:
        AnsibleEnvironment.from_string = from_string  # type: ignore[method-assign]
        AnsibleEnvironment.compile_expression = compile_expression  # type: ignore[method-assign]
