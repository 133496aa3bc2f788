"""Parse the text output of Huawei's ``npu-smi`` tool for Ascend NPUs.

specfleet has to know what NPUs a host has before it deploys or checks a vLLM speculative
decoding service. It needs the NPU and die counts, the chip model, health, HBM in use and the
processes holding device memory. ``npu-smi`` only prints tables meant for people, and the
layout changes between hardware generations and npu-smi releases. This module turns that text
into dataclasses and a JSON summary that Ansible can use.

Formats handled:

* ``npu-smi info``: the chip table followed by the process table. Layouts seen on real hosts:

  - Atlas A2 (910B*, 910A): one ``NPU  Name`` / ``Chip`` row pair per NPU.
  - Atlas A3 (``Ascend910``): a ``Chip  Phy-ID`` header and two dies (row pairs) per NPU.
    The second die shows Power ``-``.
  - npu-smi 26.x: 116 characters wide, with an extra ``Process id in container`` column.
  - Ascend 950: separate ``NPU ID`` and ``Name`` columns, no chip label on the second row,
    ``NPU Util(%)`` instead of ``AICore(%)``. The process table has no Chip column.
  - 310P / 310B: a ``Chip  Device`` header and no HBM column (only ``Memory-Usage(MB)``).

  Usage pairs may be written ``2922 / 32768``, ``41052/ 65536`` or ``5413  / 131072``. Lines
  may have trailing spaces, or indentation if the text was pasted. If the output is cut off
  before its closing border it is still parsed, and ``NpuSmiInfo.truncated`` is set.
* ``npu-smi info -t board -i N [-c M]``: ``Key : value`` lines.
* ``npu-smi info -m``: the NPU ID / Chip ID / Chip Logic ID / Chip Name mapping.

``soc_family`` sorts a host into ``atlas-a2`` / ``atlas-a3`` / ``ascend-950`` / ``other``, the
split that vllm-ascend makes. ``soc_variant`` tells the two 950 parts apart (``950PR`` /
``950DT``), which vllm-ascend does not: both are its A5, SoC 260, but its ``-a5`` image is built
for 950DT only. Run ``python -m specfleet_helpers.host.npu_smi --help`` for the
command line. The module uses only the standard library and runs on Python 3.9 or later.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "Chip",
    "NpuProcess",
    "NpuSmiInfo",
    "NpuSmiParseError",
    "NpuSmiRunError",
    "main",
    "parse_board",
    "parse_info",
    "parse_info_m",
    "run_npu_smi",
    "soc_family",
    "soc_variant",
    "soc_version_from_board",
    "summarize",
]

FAMILY_A2 = "atlas-a2"
FAMILY_A3 = "atlas-a3"
FAMILY_950 = "ascend-950"
FAMILY_OTHER = "other"

#: The two Ascend 950 parts (soc_variant).
VARIANT_950PR = "950PR"
VARIANT_950DT = "950DT"

#: Exit codes of the command-line interface.
EXIT_OK = 0
EXIT_PARSE_ERROR = 1
EXIT_NO_INPUT = 2


class NpuSmiParseError(ValueError):
    """The text is not the npu-smi output that the parser expected."""


class NpuSmiRunError(RuntimeError):
    """npu-smi could not be run, or it failed."""


@dataclass
class Chip:
    """One chip (die) row pair from the ``npu-smi info`` chip table.

    ``chip_id`` is the id within the NPU (0 for the first die). Layouts without a chip label
    (Ascend 950) count the dies of each NPU from 0. ``phy_id`` comes from the A3 ``Chip Phy-ID``
    header. ``device_id`` comes from the 310P/310B ``Chip Device`` header. ``aicore_pct`` also
    holds the 950's ``NPU Util(%)``. Values printed as ``NA`` or ``-`` become None.
    """

    npu_id: int
    chip_id: int
    name: str
    health: str
    phy_id: int | None = None
    device_id: int | None = None
    power_w: float | None = None
    temp_c: int | None = None
    aicore_pct: int | None = None
    memory_used_mb: int | None = None
    memory_total_mb: int | None = None
    hbm_used_mb: int | None = None
    hbm_total_mb: int | None = None
    hugepages_used: int | None = None
    hugepages_total: int | None = None
    bus_id: str | None = None


@dataclass
class NpuProcess:
    """One row of the ``npu-smi info`` process table.

    ``name`` may be empty because npu-smi often prints no name for processes in containers.
    The same pid can be listed under more than one NPU. ``chip_id`` is None when the layout has
    no Chip column (Ascend 950). ``container_pid`` is None when there is no
    ``Process id in container`` column or its value is ``NA``.
    """

    npu_id: int
    chip_id: int | None
    pid: int
    name: str
    memory_mb: int | None
    container_pid: int | None = None


@dataclass
class NpuSmiInfo:
    """What ``npu-smi info`` printed.

    ``npu_smi_version`` is the version in the ``npu-smi X`` banner. ``driver_version`` is the
    banner's ``Version:`` field. ``truncated`` is True when the output ends without a closing
    ``+---+`` border.
    """

    npu_smi_version: str | None = None
    driver_version: str | None = None
    chips: list[Chip] = field(default_factory=list)
    processes: list[NpuProcess] = field(default_factory=list)
    truncated: bool = False


# --------------------------------------------------------------------------------------------
# Low-level helpers
# --------------------------------------------------------------------------------------------

_BORDER_RE = re.compile(r"^\+(?:[-=]+\+)+$")
_BANNER_RE = re.compile(r"^npu-smi\s+(?P<smi>\S+)(?:\s+Version:\s*(?P<drv>\S+))?", re.IGNORECASE)
# A header label such as "Power(W)", "NPU Util(%)" or "HBM-Usage(MB)".
_LABEL_RE = re.compile(r"[A-Za-z][A-Za-z0-9_\- ]*?\([^)]*\)")
_SLASH_RE = re.compile(r"\s*/\s*")
_MISSING = frozenset({"", "-", "--", "na", "n/a", "none", "null"})
_HEADER_HINT = "the chip header row ('| NPU ... Name ... | Health | Power(W) ...')"


def _shorten(line: str, limit: int = 80) -> str:
    """Quote ``line`` for an error message, cut to ``limit`` characters."""
    text = line if len(line) <= limit else line[: limit - 3] + "..."
    return repr(text)


def _split_cells(line: str) -> list[str]:
    """Split a ``| a | b |`` table row into its raw (unstripped) cells."""
    return line.removeprefix("|").removesuffix("|").split("|")


def _is_missing(token: str | None) -> bool:
    return token is None or token.strip().lower() in _MISSING


def _to_int(token: str | None) -> int | None:
    """Read a number and round it to an int; missing or unreadable values give None."""
    if token is None or _is_missing(token):
        return None
    text = token.strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return round(float(text))
    except (ValueError, OverflowError):
        return None


def _to_float(token: str | None) -> float | None:
    if token is None or _is_missing(token):
        return None
    try:
        return float(token.strip())
    except ValueError:
        return None


def _to_pair(token: str | None) -> tuple[int | None, int | None]:
    """Read a ``used/total`` value (the spaces around the slash are already removed)."""
    if token is None or "/" not in token:
        return None, None
    used, _, total = token.partition("/")
    return _to_int(used), _to_int(total)


def _require_int(token: str, lineno: int, what: str, line: str) -> int:
    try:
        return int(token.strip())
    except ValueError:
        raise NpuSmiParseError(
            f"line {lineno}: expected an integer {what}, got {token.strip()!r} in {_shorten(line)}"
        ) from None


def _metric_labels(header_cell: str) -> list[tuple[str, int]]:
    """Find the labels in a header cell, each with its offset inside the cell."""
    return [(m.group(0).strip(), m.start()) for m in _LABEL_RE.finditer(header_cell)]


def _value_tokens(cell: str) -> list[str]:
    """Split a value cell into tokens. ``a / b``, ``a/ b`` and ``a  / b`` become ``a/b``."""
    return _SLASH_RE.sub("/", cell.strip()).split()


def _metric_values(labels: list[tuple[str, int]], data_cell: str) -> dict[str, str]:
    """Match the values in ``data_cell`` to the header ``labels``.

    Values are normally split on whitespace and matched to the labels in order. If the number
    of values is not the number of labels (for example a blank field), the cell is cut at the
    positions of the header labels, because npu-smi prints each value under its label.
    """
    tokens = _value_tokens(data_cell)
    if len(tokens) == len(labels):
        return {label: token for (label, _), token in zip(labels, tokens)}
    values: dict[str, str] = {}
    for index, (label, start) in enumerate(labels):
        end = labels[index + 1][1] if index + 1 < len(labels) else len(data_cell)
        values[label] = " ".join(_value_tokens(data_cell[start:end]))
    return values


def _metric_key(label: str) -> str | None:
    low = label.lower()
    if low.startswith("power"):
        return "power"
    if low.startswith("temp"):
        return "temp"
    if "hugepage" in low:
        return "hugepages"
    if "aicore" in low or "util" in low:
        return "util"
    if "hbm" in low:
        return "hbm"
    if "memory" in low:
        return "memory"
    return None


def _apply_metrics(chip: Chip, values: dict[str, str]) -> None:
    for label, token in values.items():
        key = _metric_key(label)
        if key == "power":
            chip.power_w = _to_float(token)
        elif key == "temp":
            chip.temp_c = _to_int(token)
        elif key == "util":
            chip.aicore_pct = _to_int(token)
        elif key == "hugepages":
            chip.hugepages_used, chip.hugepages_total = _to_pair(token)
        elif key == "hbm":
            chip.hbm_used_mb, chip.hbm_total_mb = _to_pair(token)
        elif key == "memory":
            chip.memory_used_mb, chip.memory_total_mb = _to_pair(token)


def _find_cell(
    cells: list[str], predicate: Callable[[str], bool], exclude: Sequence[int] = ()
) -> int | None:
    for index, cell in enumerate(cells):
        if index not in exclude and predicate(cell):
            return index
    return None


def _is_chip_header(stripped: list[str]) -> bool:
    return (
        len(stripped) >= 3
        and stripped[0].upper().startswith("NPU")
        and any(cell.lower().startswith("health") for cell in stripped)
    )


def _is_process_header(stripped: list[str]) -> bool:
    return (
        len(stripped) >= 2
        and stripped[0].upper().startswith("NPU")
        and any(cell.lower().startswith("process id") for cell in stripped)
    )


_ROW2_ID_KEYS = {"chip": "chip_id", "phy-id": "phy_id", "phyid": "phy_id", "device": "device_id"}


class _ChipLayout:
    """Column positions of the chip table, read from its two header rows."""

    def __init__(self, head1: tuple[int, str], head2: tuple[int, str]) -> None:
        lineno1, line1 = head1
        lineno2, line2 = head2
        cells1 = _split_cells(line1)
        cells2 = _split_cells(line2)
        s1 = [c.strip() for c in cells1]
        s2 = [c.strip() for c in cells2]
        if len(s2) != len(s1):
            raise NpuSmiParseError(
                f"line {lineno2}: expected the second chip header row with {len(s1)} columns "
                f"like line {lineno1}, got {len(s2)} columns in {_shorten(line2)}"
            )
        self.ncols = len(s1)
        name_idx = _find_cell(s1, lambda c: "name" in c.lower().split())
        health_idx = _find_cell(s1, lambda c: c.lower().startswith("health"))
        if name_idx is None or health_idx is None:
            raise NpuSmiParseError(
                f"line {lineno1}: expected 'Name' and 'Health' columns in {_shorten(line1)}"
            )
        self.name_idx = name_idx
        self.health_idx = health_idx
        metrics1_idx = _find_cell(
            cells1, lambda c: bool(_metric_labels(c)), exclude=(0, name_idx, health_idx)
        )
        bus_idx = _find_cell(s2, lambda c: c.lower().startswith("bus"))
        metrics2_idx = _find_cell(
            cells2,
            lambda c: bool(_metric_labels(c)),
            exclude=(0, name_idx) if bus_idx is None else (0, name_idx, bus_idx),
        )
        if metrics1_idx is None or metrics2_idx is None:
            raise NpuSmiParseError(
                f"lines {lineno1}-{lineno2}: expected a column of values such as "
                f"'Power(W) Temp(C) ...' and 'AICore(%) Memory-Usage(MB) ...' in the chip header"
            )
        self.metrics1_idx = metrics1_idx
        self.metrics2_idx = metrics2_idx
        self.bus_idx = bus_idx
        self.labels1 = _metric_labels(cells1[metrics1_idx])
        self.labels2 = _metric_labels(cells2[metrics2_idx])
        # Row 2 starts with the ids: "Chip", "Chip  Phy-ID", "Chip  Device" or nothing (950).
        self.id_keys = [_ROW2_ID_KEYS.get(word.lower(), "") for word in s2[0].split()]

    def build(
        self,
        row1: tuple[int, str],
        row2: tuple[int, str] | None,
        previous: list[Chip],
    ) -> Chip:
        lineno1, line1 = row1
        s1 = [c.strip() for c in _split_cells(line1)]
        if self.name_idx == 0:
            parts = s1[0].split(None, 1)
            npu_token = parts[0] if parts else ""
            name = parts[1].strip() if len(parts) > 1 else ""
        else:
            npu_token = s1[0]
            name = s1[self.name_idx]
        if not npu_token or not name:
            raise NpuSmiParseError(
                f"line {lineno1}: expected the first row of a chip (NPU id, name and health), "
                f"got {_shorten(line1)}"
            )
        npu_id = _require_int(npu_token, lineno1, "NPU id", line1)
        chip = Chip(npu_id=npu_id, chip_id=-1, name=name, health=s1[self.health_idx])
        _apply_metrics(chip, _metric_values(self.labels1, _split_cells(line1)[self.metrics1_idx]))

        ids: dict[str, int] = {}
        if row2 is not None:
            lineno2, line2 = row2
            cells2 = _split_cells(line2)
            s2 = [c.strip() for c in cells2]
            tokens = s2[0].split()
            if len(tokens) != len(self.id_keys):
                raise NpuSmiParseError(
                    f"line {lineno2}: expected the second row of a chip with "
                    f"{len(self.id_keys)} id value(s) in the first column, got {_shorten(line2)}"
                )
            for key, token in zip(self.id_keys, tokens):
                value = _require_int(token, lineno2, key or "id", line2)
                if key:
                    ids[key] = value
            if self.bus_idx is not None and not _is_missing(s2[self.bus_idx]):
                chip.bus_id = s2[self.bus_idx]
            _apply_metrics(chip, _metric_values(self.labels2, cells2[self.metrics2_idx]))
        if "chip_id" in ids:
            chip.chip_id = ids["chip_id"]
        else:
            chip.chip_id = sum(1 for c in previous if c.npu_id == npu_id)
        chip.phy_id = ids.get("phy_id")
        chip.device_id = ids.get("device_id")
        return chip


class _ProcessLayout:
    """Column positions of the process table, read from its header row."""

    def __init__(self, head: tuple[int, str]) -> None:
        lineno, line = head
        stripped = [c.strip() for c in _split_cells(line)]
        self.ncols = len(stripped)
        first = re.sub(r"(?i)\bNPU\s+ID\b", "NPU", stripped[0])
        self.id_keys = ["chip_id" if w.lower() == "chip" else "npu_id" for w in first.split()]
        if not self.id_keys or self.id_keys[0] != "npu_id":
            raise NpuSmiParseError(
                f"line {lineno}: expected the process header to start with 'NPU', "
                f"got {_shorten(line)}"
            )
        low = [c.lower() for c in stripped]
        pid_idx = _find_cell(low, lambda c: c == "process id")
        if pid_idx is None:
            raise NpuSmiParseError(
                f"line {lineno}: expected a 'Process id' column in {_shorten(line)}"
            )
        self.pid_idx = pid_idx
        self.name_idx = _find_cell(low, lambda c: c == "process name")
        self.mem_idx = _find_cell(low, lambda c: c.startswith("process memory"))
        self.cpid_idx = _find_cell(low, lambda c: c.startswith("process id in container"))

    def build(self, lineno: int, line: str) -> NpuProcess:
        cells = _split_cells(line)
        if len(cells) < self.ncols:
            raise NpuSmiParseError(
                f"line {lineno}: expected a process row with {self.ncols} columns, "
                f"got {len(cells)} in {_shorten(line)}"
            )
        extra = len(cells) - self.ncols
        if extra and self.name_idx is not None:
            # A '|' inside a process name: put the name back together.
            end = self.name_idx + extra + 1
            cells = [*cells[: self.name_idx], "|".join(cells[self.name_idx : end]), *cells[end:]]
        stripped = [c.strip() for c in cells]
        tokens = stripped[0].split()
        if len(tokens) != len(self.id_keys):
            raise NpuSmiParseError(
                f"line {lineno}: expected {len(self.id_keys)} id value(s) "
                f"({', '.join(self.id_keys)}) in the first column, got {_shorten(line)}"
            )
        ids = {
            key: _require_int(token, lineno, key, line) for key, token in zip(self.id_keys, tokens)
        }
        return NpuProcess(
            npu_id=ids["npu_id"],
            chip_id=ids.get("chip_id"),
            pid=_require_int(stripped[self.pid_idx], lineno, "process id", line),
            name=stripped[self.name_idx] if self.name_idx is not None else "",
            memory_mb=_to_int(stripped[self.mem_idx]) if self.mem_idx is not None else None,
            container_pid=_to_int(stripped[self.cpid_idx]) if self.cpid_idx is not None else None,
        )


# --------------------------------------------------------------------------------------------
# Public parsers
# --------------------------------------------------------------------------------------------


def parse_info(text: str) -> NpuSmiInfo:
    """Parse the output of ``npu-smi info``.

    Lines that are not part of the table (a shell prompt or a ``+ npu-smi info`` trace, for
    example) are skipped. Raises
    NpuSmiParseError, naming the line and what was expected, when the text has no npu-smi
    chip table or a table row cannot be read.
    """
    if text is None or not text.strip():
        raise NpuSmiParseError("empty input: expected the table printed by `npu-smi info`")
    numbered = [(index + 1, raw.strip()) for index, raw in enumerate(text.splitlines())]
    table = [(n, line) for n, line in numbered if line.startswith("|") or _BORDER_RE.match(line)]
    if not table:
        lineno, line = next((n, line) for n, line in numbered if line)
        raise NpuSmiParseError(
            f"line {lineno}: expected an `npu-smi info` table (lines starting with '+' or '|'), "
            f"got {_shorten(line)}"
        )

    info = NpuSmiInfo()
    state = "preamble"
    head1: tuple[int, str] | None = None
    chip_layout: _ChipLayout | None = None
    proc_layout: _ProcessLayout | None = None
    pending: tuple[int, str] | None = None

    for lineno, line in table:
        if _BORDER_RE.match(line):
            if pending is not None:
                raise NpuSmiParseError(
                    f"line {lineno}: expected the second row of the chip that starts on line "
                    f"{pending[0]}, got a border"
                )
            continue
        stripped = [c.strip() for c in _split_cells(line)]

        if state == "preamble":
            if _is_chip_header(stripped):
                head1 = (lineno, line)
                state = "chip_header2"
                continue
            banner = _BANNER_RE.match(stripped[0]) if len(stripped) == 1 else None
            if banner:
                info.npu_smi_version = banner.group("smi")
                info.driver_version = banner.group("drv")
                continue
            raise NpuSmiParseError(
                f"line {lineno}: expected the 'npu-smi <version>' banner or {_HEADER_HINT}, "
                f"got {_shorten(line)}"
            )

        if state == "chip_header2":
            assert head1 is not None
            chip_layout = _ChipLayout(head1, (lineno, line))
            state = "chips"
            continue

        if state == "chips":
            assert chip_layout is not None
            if pending is None and _is_process_header(stripped):
                proc_layout = _ProcessLayout((lineno, line))
                state = "processes"
                continue
            if len(stripped) != chip_layout.ncols:
                raise NpuSmiParseError(
                    f"line {lineno}: expected a chip row with {chip_layout.ncols} columns or the "
                    f"process header ('| NPU ... | Process id | ...'), got {_shorten(line)}"
                )
            if pending is None:
                pending = (lineno, line)
            else:
                info.chips.append(chip_layout.build(pending, (lineno, line), info.chips))
                pending = None
            continue

        # state == "processes"
        assert proc_layout is not None
        if len(stripped) == 1:
            # "No running processes found in NPU n" (or another one-cell message): no process.
            continue
        info.processes.append(proc_layout.build(lineno, line))

    last_lineno = table[-1][0]
    if state == "preamble":
        raise NpuSmiParseError(
            f"line {last_lineno}: expected {_HEADER_HINT} before the end of the input; "
            f"this does not look like `npu-smi info` output"
        )
    if state == "chip_header2":
        raise NpuSmiParseError(
            f"line {last_lineno}: expected the second chip header row "
            f"('| Chip | Bus-Id | AICore(%) ...'), but the input ended"
        )
    info.truncated = not _BORDER_RE.match(table[-1][1])
    if pending is not None:
        # Cut off between the two rows of a chip: keep what the first row says.
        assert chip_layout is not None
        info.chips.append(chip_layout.build(pending, None, info.chips))
    return info


_BOARD_LINE_RE = re.compile(r"^(?P<key>[^\s:][^:]*?)\s+:(?P<value>.*)$")
_COMMENT_RE = re.compile(r"\s#")


def parse_board(text: str) -> dict[str, str]:
    """Parse ``npu-smi info -t board -i N [-c M]`` output into ``{key: value}``.

    Indentation (spaces or a tab) is removed. An inline comment that starts with `` #`` is
    dropped from the value. A key needs whitespace before its colon, as npu-smi pads keys to a
    fixed width, so an error such as ``bash: npu-smi: command not found`` is not read as a
    pair. Lines that are not pairs are ignored. If a key repeats, the first value is kept.
    Raises NpuSmiParseError when the text holds no ``Key : value`` line.
    """
    if text is None or not text.strip():
        raise NpuSmiParseError("empty input: expected `npu-smi info -t board` 'Key : value' lines")
    result: dict[str, str] = {}
    first: tuple[int, str] | None = None
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if first is None:
            first = (lineno, line)
        match = _BOARD_LINE_RE.match(line)
        if not match:
            continue
        value = _COMMENT_RE.split(match.group("value").strip(), maxsplit=1)[0].strip()
        result.setdefault(match.group("key").strip(), value)
    if not result:
        assert first is not None
        raise NpuSmiParseError(
            f"line {first[0]}: expected 'Key : value' lines from `npu-smi info -t board -i N`, "
            f"got {_shorten(first[1])}"
        )
    return result


_INFO_M_KEYS = {
    "npu id": "npu_id",
    "chip id": "chip_id",
    "chip logic id": "logic_id",
    "logic id": "logic_id",
    "chip phy-id": "phy_id",
    "chip name": "chip_name",
    "slot id": "slot_id",
}


def _snake(label: str) -> str:
    return re.sub(r"[^0-9a-z]+", "_", label.lower()).strip("_")


def parse_info_m(text: str) -> list[dict[str, Any]]:
    """Parse ``npu-smi info -m`` into one dict per row.

    Known columns get these keys: ``npu_id``, ``chip_id``, ``logic_id``, ``phy_id``,
    ``slot_id`` and ``chip_name``. Other columns get a snake_case key. Id values are ints, or
    None for ``-`` (the ``Mcu`` rows have no logic id). The last column (the chip name) may
    contain spaces, e.g. ``Ascend 910B4``.
    """
    if text is None or not text.strip():
        raise NpuSmiParseError("empty input: expected the table printed by `npu-smi info -m`")
    lines = [(n, raw.strip()) for n, raw in enumerate(text.splitlines(), start=1)]
    lines = [(n, line) for n, line in lines if line]
    header_at = next(
        (
            i
            for i, (_, line) in enumerate(lines)
            if line.upper().startswith("NPU ID") and "chip" in line.lower()
        ),
        None,
    )
    if header_at is None:
        lineno, line = lines[0]
        raise NpuSmiParseError(
            f"line {lineno}: expected the `npu-smi info -m` header "
            f"('NPU ID  Chip ID  Chip Logic ID  Chip Name'), got {_shorten(line)}"
        )
    labels = re.split(r"\s{2,}|\t", lines[header_at][1])
    keys = [_INFO_M_KEYS.get(label.lower(), _snake(label)) for label in labels]
    rows: list[dict[str, Any]] = []
    for lineno, line in lines[header_at + 1 :]:
        values = line.split(None, len(keys) - 1)
        if len(values) != len(keys):
            raise NpuSmiParseError(
                f"line {lineno}: expected {len(keys)} columns ({', '.join(labels)}), "
                f"got {_shorten(line)}"
            )
        row: dict[str, Any] = {}
        for key, value in zip(keys, values):
            if key.endswith("_id"):
                if _is_missing(value):
                    row[key] = None
                elif value.isdigit():
                    row[key] = int(value)
                else:
                    row[key] = value
            else:
                row[key] = value.strip()
        if not isinstance(row.get("npu_id"), int):
            raise NpuSmiParseError(
                f"line {lineno}: expected an integer NPU ID, got {_shorten(line)}"
            )
        rows.append(row)
    return rows


# --------------------------------------------------------------------------------------------
# Classification and summary
# --------------------------------------------------------------------------------------------

# SoC version names and numbers as torch_npu numbers them (c10_npu::SocVersion).
# vllm-ascend reads 220-225 as A2, 250-255 as A3 and 260 as Ascend 950.
_SOC_NUMBERS = {
    "ascend910premiuma": 100,
    "ascend910proa": 101,
    "ascend910a": 102,
    "ascend910prob": 103,
    "ascend910b": 104,
    "ascend310p1": 200,
    "ascend310p2": 201,
    "ascend310p3": 202,
    "ascend310p4": 203,
    "ascend310p5": 204,
    "ascend310p7": 205,
    "ascend910b1": 220,
    "ascend910b2": 221,
    "ascend910b2c": 222,
    "ascend910b3": 223,
    "ascend910b4": 224,
    "ascend910b4_1": 225,
    "ascend310b1": 240,
    "ascend310b2": 241,
    "ascend310b3": 242,
    "ascend310b4": 243,
    "ascend910_9391": 250,
    "ascend910_9392": 251,
    "ascend910_9381": 252,
    "ascend910_9382": 253,
    "ascend910_9372": 254,
    "ascend910_9362": 255,
    "ascend950": 260,
}

# Prefixes for SoC names that are not in the table above. Order matters: the more specific
# prefix comes first.
_SOC_PREFIXES = (
    ("ascend910_95", FAMILY_950),
    ("ascend950", FAMILY_950),
    ("ascend910_93", FAMILY_A3),
    ("ascend910b", FAMILY_A2),
)


def _family_from_number(number: int) -> str:
    if 220 <= number <= 225:
        return FAMILY_A2
    if 250 <= number <= 255:
        return FAMILY_A3
    if number == 260:
        return FAMILY_950
    return FAMILY_OTHER


def _family_from_soc(soc_version: str | int | None) -> str | None:
    """The family given by a SoC version, or None if it is missing or not recognised."""
    if soc_version is None or isinstance(soc_version, bool):
        return None
    if isinstance(soc_version, int):
        return _family_from_number(soc_version)
    text = str(soc_version).strip().replace(" ", "").lower()
    if not text:
        return None
    if text.isdigit():
        return _family_from_number(int(text))
    if text in _SOC_NUMBERS:
        return _family_from_number(_SOC_NUMBERS[text])
    for prefix, family in _SOC_PREFIXES:
        if text.startswith(prefix):
            return family
    return None


def soc_family(soc_version: str | int | None, chip_name: str | None, dies_per_npu: int) -> str:
    """Classify a host as ``atlas-a2``, ``atlas-a3``, ``ascend-950`` or ``other``.

    ``soc_version`` comes first if it can be read. It may be a SoC string such as
    ``Ascend910B4``, ``Ascend910_9392`` or ``Ascend950PR_9579``, or a number (or a string of
    digits) as torch_npu reports it. Numbers 220-225 are A2, 250-255 are A3, 260 is 950, and
    any other number is ``other``.

    Without a SoC version that can be read, the rules use the chip name. An ``Ascend``
    prefix and spaces are ignored, so ``Ascend 910B4`` from ``npu-smi info -m`` counts as
    ``910B4``. A name starting with ``910B`` is A2. ``Ascend910`` with two dies per NPU is A3.
    The name alone cannot tell A2 from A3, because the 910C also shows as Ascend910. A name
    containing ``950`` is Ascend 950. Anything else is ``other``.
    """
    family = _family_from_soc(soc_version)
    if family is not None:
        return family
    if not chip_name:
        return FAMILY_OTHER
    compact = chip_name.replace(" ", "").strip().lower()
    bare = compact.removeprefix("ascend")
    if bare.startswith("910b"):
        return FAMILY_A2
    if bare == "910" and dies_per_npu == 2:
        return FAMILY_A3
    if "950" in compact:
        return FAMILY_950
    return FAMILY_OTHER


# "Ascend950PR_9579", "ascend950dt_9582" (vllm-ascend's SOC_VERSION), "Ascend950PR", "Ascend 950DT".
_VARIANT_RE = re.compile(r"950\s*(PR|DT)", re.IGNORECASE)
_VARIANTS = {"PR": VARIANT_950PR, "DT": VARIANT_950DT}


def soc_variant(soc_version: str | int | None, chip_names: Sequence[str] = ()) -> str | None:
    """``950PR`` or ``950DT`` for an Ascend 950 host, else None.

    vllm-ascend makes no difference between them (both are SoC 260, device type A5), but its
    ``-a5`` image is built with ``SOC_VERSION=ascend950dt_9582`` and its documentation names
    Atlas 950DT only, so a caller may want to say which part a host has. The SoC version
    (``Ascend950PR_9579`` from the board query) decides; a number such as torch_npu's 260 does
    not say, and then the chip names of ``npu-smi info`` (``Ascend950PR``) decide if they all
    name the same part. None when neither says, or the names disagree.
    """
    if isinstance(soc_version, str):
        match = _VARIANT_RE.search(soc_version)
        if match:
            return _VARIANTS[match.group(1).upper()]
    found = {m.group(1).upper() for m in map(_VARIANT_RE.search, chip_names) if m}
    unnamed = [name for name in chip_names if not _VARIANT_RE.search(name)]
    if len(found) == 1 and not unnamed:
        return _VARIANTS[found.pop()]
    return None


def soc_version_from_board(board: dict[str, str]) -> str | None:
    """Build the SoC version string from ``npu-smi info -t board`` fields.

    A3 and 950 boards report ``NPU Name``, so the SoC is ``<Chip Name>_<NPU Name>``, e.g.
    ``Ascend910_9392``. A2 boards report ``Chip Type`` and ``Chip Name``, so the SoC is
    ``<Chip Type><Chip Name>``, e.g. ``Ascend910B4``. Returns None without a ``Chip Name``.
    """
    chip_name = board.get("Chip Name", "").strip()
    if _is_missing(chip_name):
        return None
    npu_name = board.get("NPU Name", "").strip()
    if not _is_missing(npu_name):
        return f"{chip_name}_{npu_name}"
    chip_type = board.get("Chip Type", "").strip()
    if not _is_missing(chip_type) and not chip_name.lower().startswith(chip_type.lower()):
        return f"{chip_type}{chip_name}"
    return chip_name


def _process_memory(chips: list[Chip], processes: list[NpuProcess]) -> list[int]:
    """The memory (MB) of the processes listed on each chip, in chip order.

    A process row names its die by NPU and chip id (A2, A3); the 950's table keys on the NPU
    only, which is its one die. A row without a chip id on an NPU of several dies cannot be
    placed on one, and counts on none. A row without a memory value counts 0.
    """
    listed = [0] * len(chips)
    for process in processes:
        if not process.memory_mb:
            continue
        dies = [
            index
            for index, chip in enumerate(chips)
            if chip.npu_id == process.npu_id
            and (process.chip_id is None or chip.chip_id == process.chip_id)
        ]
        if len(dies) == 1:
            listed[dies[0]] += process.memory_mb
    return listed


def _dies_per_npu(chips: list[Chip]) -> int:
    counts: dict[int, int] = {}
    for chip in chips:
        counts[chip.npu_id] = counts.get(chip.npu_id, 0) + 1
    return max(counts.values()) if counts else 0


def summarize(
    info: NpuSmiInfo,
    board: dict[str, str] | None = None,
    soc_version: str | int | None = None,
) -> dict[str, Any]:
    """Return a JSON-ready summary of ``info`` for Ansible.

    ``health_ok`` is True only when there is at least one chip and every chip reports ``OK``.
    Health policy beyond that is left to the caller. ``family`` comes from ``soc_family``. The
    SoC version is ``soc_version`` if given, otherwise the one derived from ``board`` (parsed
    ``npu-smi info -t board`` output), otherwise there is none and the chip name decides.
    ``variant`` is ``soc_variant``'s: ``950PR``, ``950DT`` or None.

    Each chip's ``logic_id`` is its position in the chip table (NPU order, then die order):
    the device number that ``ASCEND_RT_VISIBLE_DEVICES`` and torch use, and the ``Chip Logic
    ID`` that ``npu-smi info -m`` prints for the same host.
    """
    chips = info.chips
    names = sorted({chip.name for chip in chips})
    dies = _dies_per_npu(chips)
    soc = soc_version
    if soc is None and board:
        soc = soc_version_from_board(board)
    families = {soc_family(soc, name, dies) for name in names} or {soc_family(soc, None, dies)}
    family = families.pop() if len(families) == 1 else FAMILY_OTHER
    hbm_totals = [chip.hbm_total_mb for chip in chips if chip.hbm_total_mb is not None]
    listed = _process_memory(chips, info.processes)
    variant = soc_variant(soc, names) if family == FAMILY_950 else None
    return {
        "npu_smi_version": info.npu_smi_version,
        "driver_version": info.driver_version,
        "npu_count": len({chip.npu_id for chip in chips}),
        "chip_count": len(chips),
        "chip_names": names,
        "dies_per_npu": dies,
        "health_ok": bool(chips) and all(chip.health == "OK" for chip in chips),
        "unhealthy": [
            {"npu_id": chip.npu_id, "chip_id": chip.chip_id, "health": chip.health}
            for chip in chips
            if chip.health != "OK"
        ],
        "chips": [
            {
                "logic_id": logic_id,
                "npu_id": chip.npu_id,
                "chip_id": chip.chip_id,
                "phy_id": chip.phy_id,
                "name": chip.name,
                "health": chip.health,
                "bus_id": chip.bus_id,
                "power_w": chip.power_w,
                "temp_c": chip.temp_c,
                "aicore_pct": chip.aicore_pct,
                "hbm_used_mb": chip.hbm_used_mb,
                "hbm_total_mb": chip.hbm_total_mb,
                "memory_used_mb": chip.memory_used_mb,
                "memory_total_mb": chip.memory_total_mb,
                # What the processes npu-smi lists on this die hold of its HBM (npu_memory
                # counts it as not the device's own: a server's, the service's).
                "process_memory_mb": listed[logic_id],
            }
            for logic_id, chip in enumerate(chips)
        ],
        "hbm_total_mb_per_chip": max(hbm_totals) if hbm_totals else None,
        "process_count": len(info.processes),
        "processes": [asdict(process) for process in info.processes],
        "truncated": info.truncated,
        "soc_version": None if soc is None else str(soc),
        "family": family,
        "variant": variant,
        "board": board,
    }


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def _first_line(text: str | None) -> str:
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()
    return ""


def run_npu_smi(
    args: Sequence[str] = ("info",), executable: str = "npu-smi", timeout: float = 30.0
) -> str:
    """Run ``executable args...`` (looked up on PATH) and return its stdout.

    Raises NpuSmiRunError with a one-line reason if the program is missing, cannot be
    started, times out or exits with a non-zero status.
    """
    command = " ".join([executable, *args])
    path = shutil.which(executable)
    if path is None:
        raise NpuSmiRunError(f"cannot run '{command}': {executable} not found on PATH")
    try:
        proc = subprocess.run(
            [path, *args],
            capture_output=True,
            encoding="utf-8",
            errors="replace",
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise NpuSmiRunError(f"cannot run '{command}': timed out after {timeout:g}s") from None
    except OSError as exc:
        raise NpuSmiRunError(f"cannot run '{command}': {exc.strerror or exc}") from None
    if proc.returncode != 0:
        detail = _first_line(proc.stderr) or _first_line(proc.stdout) or "no output"
        raise NpuSmiRunError(f"'{command}' failed with exit status {proc.returncode}: {detail}")
    return proc.stdout


def _query_board(
    chip: Chip, executable: str, timeout: float
) -> tuple[dict[str, str] | None, str | None]:
    """The board fields of ``chip``, or None and the reason npu-smi gave.

    A2 and A3 take ``-i NPU -c CHIP``; the 950's board query is documented without ``-c``,
    so that form is tried second.
    """
    errors: list[str] = []
    for args in (
        ("info", "-t", "board", "-i", str(chip.npu_id), "-c", str(chip.chip_id)),
        ("info", "-t", "board", "-i", str(chip.npu_id)),
    ):
        try:
            return parse_board(run_npu_smi(args, executable=executable, timeout=timeout)), None
        except (NpuSmiRunError, NpuSmiParseError) as exc:
            errors.append(str(exc))
    return None, "; ".join(errors)


def _read_input(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read()


def _build_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m specfleet_helpers.host.npu_smi",
        description=(
            "Parse `npu-smi info` (Huawei Ascend NPUs) and print a JSON summary on stdout: "
            "NPU and chip counts, chip names, dies per NPU, per-chip health and HBM, "
            "processes, and the family (atlas-a2, atlas-a3, ascend-950 or other)."
        ),
        epilog=(
            "Exit status: 0 if the output was parsed (even if some chip is not healthy; "
            "check health_ok / unhealthy in the JSON), 1 if the text is not npu-smi output, "
            "2 if npu-smi could not be run or an input file could not be read. "
            "Errors are one line on stderr."
        ),
    )
    parser.add_argument(
        "--input",
        metavar="FILE",
        help="read saved `npu-smi info` output from FILE ('-' for stdin) "
        "instead of running npu-smi",
    )
    parser.add_argument(
        "--board-input",
        metavar="FILE",
        help="also parse saved `npu-smi info -t board -i N [-c M]` output; its Chip Type, "
        "Chip Name and NPU Name give the SoC version used to pick the family",
    )
    parser.add_argument(
        "--board",
        action="store_true",
        help="also run `npu-smi info -t board -i N -c M` for the first chip listed (all chips "
        "of a host are one SoC); when that fails the summary says why in board_error and the "
        "chip name decides the family",
    )
    parser.add_argument(
        "--soc-version",
        metavar="SOC",
        help="SoC version used to pick the family, e.g. Ascend910B4, Ascend910_9392 or a "
        "torch_npu number such as 224 (takes precedence over --board-input)",
    )
    parser.add_argument(
        "--npu-smi",
        default="npu-smi",
        metavar="CMD",
        help="npu-smi program to run when --input is not given (default: %(default)s, "
        "looked up on PATH)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="time limit for running npu-smi (default: %(default)s)",
    )
    return parser


def _error(message: str) -> None:
    text = " ".join(message.split())
    print(f"npu_smi: {text}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point. Returns the exit status."""
    args = _build_arg_parser().parse_args(argv)
    if args.input is not None:
        source = args.input
        try:
            text = _read_input(args.input)
        except OSError as exc:
            _error(f"cannot read {args.input}: {exc.strerror or exc}")
            return EXIT_NO_INPUT
    else:
        source = f"'{args.npu_smi} info'"
        try:
            text = run_npu_smi(("info",), executable=args.npu_smi, timeout=args.timeout)
        except NpuSmiRunError as exc:
            _error(str(exc))
            return EXIT_NO_INPUT

    board: dict[str, str] | None = None
    if args.board_input is not None:
        try:
            board_text = _read_input(args.board_input)
        except OSError as exc:
            _error(f"cannot read {args.board_input}: {exc.strerror or exc}")
            return EXIT_NO_INPUT
        try:
            board = parse_board(board_text)
        except NpuSmiParseError as exc:
            _error(f"cannot parse board output from {args.board_input}: {exc}")
            return EXIT_PARSE_ERROR

    try:
        info = parse_info(text)
    except NpuSmiParseError as exc:
        _error(f"cannot parse npu-smi info output from {source}: {exc}")
        return EXIT_PARSE_ERROR

    board_error: str | None = None
    if board is None and args.board and info.chips:
        board, board_error = _query_board(info.chips[0], args.npu_smi, args.timeout)

    summary = summarize(info, board=board, soc_version=args.soc_version)
    if args.board:
        summary["board_error"] = board_error
    sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
