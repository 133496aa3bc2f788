"""Each template compiled once per task: the specfleet_settings and specfleet_stage_plan actions
template every stage role's defaults, rules and inputs for their host, and the same few hundred
template strings come back many times (a role default such as specfleet_root's is templated
anew each time another value names it): 865 compilations of 213 distinct templates in one
plan, 537 of 258 in one settings check. Jinja's compilation (parse, code generation with its
filter lookups, Python's compile) was most of those tasks' controller CPU, paid again for every
host, since Ansible runs each task for each host in a worker process of its own.

Within `compiled_once()`, what Jinja compiles a source to (a code object: Jinja's own bytecode
cache keeps the same) is kept for the task's process and used again for the same source, and
kept on the controller too, in `$XDG_CACHE_HOME/specfleet/` (else ~/.cache/specfleet/; one
directory per Python, Jinja and ansible-core version), where the next host's worker and the
next run find it: the fleet's hosts compile the same templates. The key is everything the
code depends on: the source (an expression's text for an expression),
the environment's class, the lexer's settings a template may override, the Jinja options that
change code generation, the template's name, and Ansible's escape_backslashes setting of the
compilation. Each use still makes its own template object around the code, bound to its own
environment, so rendering, where the variables come in, is unchanged. A compilation that fails
is not kept (its error is raised as before); a cache file that cannot be read or written is
compiled past. Outside the context nothing changes; where
Ansible's internals are not what this expects (another ansible-core), it does nothing and the
task compiles as before.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import marshal
import os
import sys
import tempfile
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jinja2
from ansible.release import __version__ as ansible_version

try:
    from ansible._internal._templating._jinja_bits import (
        _TEMPLATE_OVERRIDE_FIELD_NAMES,
        AnsibleEnvironment,
        _TemplateCompileContext,
    )
except ImportError:  # another ansible-core: compile as it does
    AnsibleEnvironment = None  # type: ignore[assignment,misc]

# Per process: a worker process runs one task for one host.
_CODE: dict[tuple[Any, ...], Any] = {}
# The expression compile_expression is compiling (Jinja hands compile() its parsed nodes).
_EXPRESSION: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "specfleet_expression", default=None
)


def cache_dir() -> Path:
    """Where compiled templates are kept between processes and runs."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    versions = f"py{python}-jinja{jinja2.__version__}-ansible{ansible_version}"
    return Path(base) / "specfleet" / f"compiled-{versions}"


def _read(path: Path) -> Any:
    """The code kept at path (or the Python source, for compile(raw=True)); None if none is."""
    try:
        code = marshal.loads(path.read_bytes())
    except (OSError, EOFError, ValueError, TypeError):
        return None
    return code if isinstance(code, (types.CodeType, str)) else None


def _write(path: Path, code: Any) -> None:
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as out:
            out.write(marshal.dumps(code))
        os.replace(out.name, path)
    except (OSError, ValueError):
        pass  # kept in this process only


def _key(environment: Any, text: str, kind: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
    context = _TemplateCompileContext.current(optional=True)
    return (
        kind,
        text.encode(),  # the text alone: a template's tags (its origin) do not change its code
        args,
        type(environment),
        tuple(getattr(environment, name) for name in _TEMPLATE_OVERRIDE_FIELD_NAMES),
        environment.optimized,
        environment.is_async,
        tuple(sorted(environment.extensions)),
        None if context is None else context.escape_backslashes,
    )


@contextlib.contextmanager
def compiled_once() -> Iterator[None]:
    """Within it, a source Jinja compiled once in this process is not compiled again."""
    if AnsibleEnvironment is None:
        yield
        return
    directory = cache_dir()
    compile_ = AnsibleEnvironment.compile
    compile_expression = AnsibleEnvironment.compile_expression
    # Jinja's Environment.compile, inherited: put back as it was, not as an attribute of its own
    own_compile = "compile" in vars(AnsibleEnvironment)

    def kept_compile(self: Any, source: Any, *args: Any, **kwargs: Any) -> Any:
        text = source if isinstance(source, str) else _EXPRESSION.get()
        if text is None or self._debuggable_template_source:
            return compile_(self, source, *args, **kwargs)
        kind = "template" if isinstance(source, str) else "expression"
        key = _key(self, text, kind, (*args, *sorted(kwargs.items())))
        if key in _CODE:
            return _CODE[key]
        path = directory / f"{hashlib.sha256(repr(key).encode()).hexdigest()}.marshal"
        code = _read(path)
        if code is None:
            code = compile_(self, source, *args, **kwargs)
            _write(path, code)
        _CODE[key] = code
        return code

    def kept_expression(self: Any, source: str, *args: Any, **kwargs: Any) -> Any:
        token = _EXPRESSION.set(source)
        try:
            return compile_expression(self, source, *args, **kwargs)
        finally:
            _EXPRESSION.reset(token)

    AnsibleEnvironment.compile = kept_compile  # type: ignore[method-assign,assignment]
    AnsibleEnvironment.compile_expression = kept_expression  # type: ignore[method-assign]
    try:
        yield
    finally:
        if own_compile:
            AnsibleEnvironment.compile = compile_  # type: ignore[method-assign]
        else:
            del AnsibleEnvironment.compile
        AnsibleEnvironment.compile_expression = compile_expression  # type: ignore[method-assign]
