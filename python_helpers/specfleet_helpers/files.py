"""The file primitives every helper shares: atomic writes, terminal-escape stripping (and a
log's last lines), and the safetensors header reader.

A leaf module (standard library only, no imports of the package), so any helper can use it
whichever interpreter runs it: the host's python3 from the shipped zip, the CPU venv, or the
image's Python.

Atomic write: the content goes to a temporary sibling (same directory, so the same file
system) named ``.<name>.<pid>.<random>.tmp`` and is renamed over the target only once it is
complete; a reader never sees half a file, and an interrupted writer leaves at most that
dot-file (removed here when the write raised). A directory built complete beside its target
takes the target's place the same way (replace_dir: one atomic swap where Linux can, else two
renames that put the old one back on failure).

Safetensors header: 8 bytes little-endian header length, then a JSON object of tensor entries
(``dtype``, ``shape``, ``data_offsets``) plus an optional ``__metadata__``; the file must be
exactly as long as the header says (header end plus the largest tensor end offset), so a
truncated or padded file is refused. Only the header is read: checking a 16 GB model takes
milliseconds.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import secrets
import shutil
import struct
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Union

# --------------------------------------------------------------------------------------
# Atomic writes
# --------------------------------------------------------------------------------------


def tmp_sibling(path: Path, suffix: str = ".tmp") -> Path:
    """A fresh temporary name next to `path`: unique per process and per call."""
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}{suffix}")


@contextlib.contextmanager
def atomic_path(path: Union[str, os.PathLike]) -> Iterator[Path]:
    """Yield a temporary sibling of `path` to write; rename it over `path` when the block
    ends normally, remove it when the block raised."""
    path = Path(path)
    tmp = tmp_sibling(path)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def write_atomic(path: Union[str, os.PathLike], data: Union[str, bytes]) -> None:
    """Write `data` (text as UTF-8) to `path` atomically."""
    with atomic_path(path) as tmp:
        if isinstance(data, str):
            tmp.write_text(data, encoding="utf-8")
        else:
            tmp.write_bytes(data)


def write_json_atomic(
    path: Union[str, os.PathLike], data: Any, indent: Union[int, None] = None
) -> None:
    """Write `data` as JSON (sorted keys, one trailing newline) to `path` atomically."""
    write_atomic(path, json.dumps(data, sort_keys=True, indent=indent) + "\n")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def exchange_paths(first: Path, second: Path) -> bool:
    """Atomically swap two paths (Linux renameat2 RENAME_EXCHANGE).

    Returns False when the platform or file system cannot do it (the caller falls back to
    two renames); raises OSError for other failures.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_uint,
    ]
    renameat2.restype = ctypes.c_int
    status = renameat2(
        _AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE
    )
    if status != 0:
        code = ctypes.get_errno()
        if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EXDEV):
            return False
        raise OSError(code, os.strerror(code), str(second))
    return True


def replace_dir(new: Path, out: Path) -> None:
    """Put the complete directory ``new`` at ``out``, replacing an existing ``out``.

    ``new`` must be a sibling of ``out``; ``out`` may be a directory, a file or a symlink.
    An existing ``out`` is swapped atomically where possible; otherwise it is renamed aside,
    ``new`` renamed in, and the old one restored if that fails. The old one is deleted only
    after ``new`` is in place.
    """
    if not out.exists() and not out.is_symlink():
        os.rename(new, out)
        return
    if exchange_paths(new, out):
        _remove(new)  # now holds the previous one
        return
    # A fresh name (random, so nobody else's): rename(2) of a symlink onto an existing
    # directory fails, and of a directory onto an empty one replaces it.
    aside = tmp_sibling(out, ".old")
    os.rename(out, aside)
    try:
        os.rename(new, out)
    except BaseException:
        os.rename(aside, out)
        raise
    _remove(aside)


# --------------------------------------------------------------------------------------
# Terminal escapes
# --------------------------------------------------------------------------------------

# CSI sequences (colours, cursor moves), OSC sequences (rich's terminal hyperlinks, ended by
# BEL or ST) and the other two-byte escapes.
ANSI = re.compile(r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")


def strip_ansi(text: str) -> str:
    """`text` without terminal escape sequences."""
    return ANSI.sub("", text)


def tail_lines(log: Path, count: int) -> list[str]:
    """The last `count` non-empty lines of a log (its last 256 KiB), without terminal escapes.
    A carriage return ends a line too, so each redraw of a progress bar is a line."""
    try:
        with Path(log).open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 256 * 1024))
            data = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    lines = [strip_ansi(line).rstrip() for line in data.splitlines()]
    lines = [line for line in lines if line]
    return lines[-count:] if count > 0 else []


# --------------------------------------------------------------------------------------
# Safetensors headers
# --------------------------------------------------------------------------------------

# A header larger than this is not a real safetensors header (upstream refuses > 100 MB).
MAX_HEADER_BYTES = 100 * 1024 * 1024

# Bytes per element of the safetensors dtypes whose size is a whole number of bytes.
DTYPE_BYTES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
    "C64": 8,
}


class SafetensorsError(ValueError):
    """A file is not a complete safetensors file. The message starts with the file's path;
    ``problem`` is the same text without it; ``kind`` is one of KINDS, ``tensor`` the entry at
    fault where one is, so callers can word the problem their own way."""

    KINDS = ("empty", "short", "header_length", "header", "entry", "size")

    def __init__(
        self, path: Path, kind: str, problem: str, tensor: Union[str, None] = None
    ) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.kind = kind
        self.problem = problem
        self.tensor = tensor


def _is_size(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _tensor_end(path: Path, name: str, entry: Any) -> int:
    """End offset of one tensor's data, after checking the entry is well formed."""
    if not isinstance(entry, dict):
        raise SafetensorsError(
            path, "entry", f"tensor {name!r}: header entry is not an object", name
        )
    offsets = entry.get("data_offsets")
    shape = entry.get("shape")
    dtype = entry.get("dtype")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(_is_size(o) for o in offsets)
        or offsets[0] > offsets[1]
    ):
        raise SafetensorsError(
            path,
            "entry",
            f"tensor {name!r}: data_offsets must be [begin, end] with 0 <= begin <= end,"
            f" got {offsets!r}",
            name,
        )
    if not isinstance(shape, list) or not all(_is_size(d) for d in shape):
        raise SafetensorsError(
            path, "entry", f"tensor {name!r}: shape must be a list of sizes", name
        )
    if not isinstance(dtype, str):
        raise SafetensorsError(path, "entry", f"tensor {name!r}: dtype must be a string", name)
    if dtype in DTYPE_BYTES:
        elements = 1
        for dim in shape:
            elements *= dim
        want = elements * DTYPE_BYTES[dtype]
        if offsets[1] - offsets[0] != want:
            raise SafetensorsError(
                path,
                "entry",
                f"tensor {name!r}: {dtype}{shape} needs {want} bytes,"
                f" data_offsets give {offsets[1] - offsets[0]}",
                name,
            )
    return int(offsets[1])


def read_safetensors_header(path: Union[str, os.PathLike]) -> dict[str, Any]:
    """Parse and check a safetensors file's header against the file's size.

    Returns the tensor entries (name -> {"dtype", "shape", "data_offsets"}), without
    ``__metadata__``. Raises SafetensorsError when the file is empty, truncated, padded or
    its header is malformed; OSError when it cannot be read at all.
    """
    path = Path(path)
    size = path.stat().st_size
    if size == 0:
        raise SafetensorsError(path, "empty", "empty file")
    if size < 8:
        raise SafetensorsError(path, "short", f"{size} bytes, too short for a safetensors header")
    with path.open("rb") as handle:
        (header_len,) = struct.unpack("<Q", handle.read(8))
        if header_len > MAX_HEADER_BYTES or 8 + header_len > size:
            raise SafetensorsError(
                path,
                "header_length",
                f"header length {header_len} does not fit in the file ({size} bytes);"
                " truncated or not a safetensors file",
            )
        raw = handle.read(header_len)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SafetensorsError(
            path, "header", f"safetensors header is not valid JSON ({exc})"
        ) from exc
    if not isinstance(header, dict):
        raise SafetensorsError(path, "header", "safetensors header is not a JSON object")

    tensors = {name: entry for name, entry in header.items() if name != "__metadata__"}
    data_end = 0
    last = None
    for name, entry in tensors.items():
        end = _tensor_end(path, name, entry)
        if end >= data_end:
            data_end, last = end, name
    expected = 8 + header_len + data_end
    if size != expected:
        state = "truncated" if size < expected else "has trailing bytes"
        raise SafetensorsError(
            path,
            "size",
            f"file is {size} bytes but its header describes {expected} bytes ({state})",
            last if size < expected else None,
        )
    return tensors
