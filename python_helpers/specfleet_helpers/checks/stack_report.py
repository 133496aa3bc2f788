"""Report the Python stack a stage will run on: distribution versions and, on NPU hosts,
whether torch sees the NPUs (the runbook's `torch.npu.is_available()` check).

Run it with the *target* interpreter (the vllm-ascend image's Python, or the CPU venv), not
Ansible's. Standard library only, except the optional `--npu` import of torch/torch_npu.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from importlib import metadata
from typing import Any, Optional

# The runbook prints these (vllm/vllm-ascend/triton* via importlib.metadata).
RUNBOOK_DISTRIBUTIONS = [
    "torch",
    "torch_npu",
    "torchvision",
    "torchaudio",
    "transformers",
    "vllm",
    "vllm-ascend",
    "triton-ascend",
    "triton",
]


def distribution_versions(names: list[str]) -> dict[str, Optional[str]]:
    """Installed version of each distribution, None when absent."""
    versions: dict[str, Optional[str]] = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def constraints(versions: dict[str, Optional[str]]) -> list[str]:
    """pip constraint lines pinning every installed distribution to its current version."""
    return [f"{name}=={version}" for name, version in sorted(versions.items()) if version]


def is_editable(name: str) -> Optional[bool]:
    """Whether the distribution is an editable install (PEP 610 direct_url.json); None if absent."""
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None
    raw = dist.read_text("direct_url.json")
    if not raw:
        return False
    try:
        return bool(json.loads(raw).get("dir_info", {}).get("editable", False))
    except ValueError:
        return False


def check_expectations(
    expected: list[str],
    absent: list[str],
    editable: Optional[list[str]] = None,
    not_editable: Optional[list[str]] = None,
) -> list[str]:
    """Human-readable problems: wrong or missing versions, distributions that should be
    absent, and installs of the wrong kind (editable from a git checkout, or not)."""
    problems = []
    for name in editable or []:
        if is_editable(name) is False:
            problems.append(f"{name} is not an editable install, expected one (git source)")
    for name in not_editable or []:
        if is_editable(name):
            problems.append(f"{name} is an editable install, expected a regular one")
    for spec in expected:
        name, _, want = spec.partition("==")
        have = distribution_versions([name])[name]
        if have != want:
            problems.append(f"{name} is {have or 'not installed'}, expected {want}")
    for name in absent:
        have = distribution_versions([name])[name]
        if have is not None:
            problems.append(f"{name} {have} is installed, expected absent")
    return problems


def soc_version(torch_npu: Any) -> tuple[Optional[int], Optional[str]]:
    """The SoC number torch_npu reports (224 for a 910B4, 251 for an A3 die, 260 for a 950),
    or None and why.

    vllm-ascend's device-type assert (`check_ascend_device_type` in `vllm_ascend/utils.py`)
    reads `torch_npu.npu.get_soc_version()`; older torch_npu builds only have the C binding
    `torch_npu._C._npu_get_soc_version()`, tried second.
    """
    readers = []
    npu = getattr(torch_npu, "npu", None)
    if callable(getattr(npu, "get_soc_version", None)):
        readers.append(("torch_npu.npu.get_soc_version()", npu.get_soc_version))
    binding = getattr(getattr(torch_npu, "_C", None), "_npu_get_soc_version", None)
    if callable(binding):
        readers.append(("torch_npu._C._npu_get_soc_version()", binding))
    if not readers:
        return None, "torch_npu has neither npu.get_soc_version() nor _C._npu_get_soc_version()"
    errors = []
    for name, reader in readers:
        try:
            return int(reader()), None
        except Exception as exc:
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
    return None, "; ".join(errors)


def npu_status() -> dict[str, Any]:
    """torch.npu availability, device count and SoC number; the error text when torch_npu
    cannot load or a value cannot be read."""
    failed: dict[str, Any] = {"npu_available": False, "npu_count": 0, "soc_version": None}
    try:
        import torch
        import torch_npu
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        return {**failed, "npu_error": error, "soc_error": error}
    try:
        available = bool(torch.npu.is_available())
        count = int(torch.npu.device_count()) if available else 0
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        return {**failed, "npu_error": error, "soc_error": error}
    soc, soc_error = soc_version(torch_npu) if available else (None, "no NPU is visible")
    return {
        "npu_available": available,
        "npu_count": count,
        "npu_error": None,
        "soc_version": soc,
        "soc_error": soc_error,
    }


# Where vllm-ascend defines _maybe_share_lm_head (v0.21 and later: the base proposer).
LM_HEAD_SOURCES = ("spec_decode/llm_base_proposer.py", "spec_decode/eagle_proposer.py")


def _function_source(text: str, name: str) -> Optional[str]:
    """The source of `def name(` up to the next def at the same or a lower indentation."""
    lines = text.splitlines()
    for start, line in enumerate(lines):
        stripped = line.lstrip()
        if stripped.startswith(f"def {name}("):
            indent = len(line) - len(stripped)
            body = [line]
            for following in lines[start + 1 :]:
                lead = len(following) - len(following.lstrip())
                if following.strip() and lead <= indent and not following.lstrip().startswith(")"):
                    break
                body.append(following)
            return "\n".join(body)
    return None


def dflash_lm_head_gate(package_dir: Optional[str]) -> dict[str, Any]:
    """Whether the installed vllm-ascend keeps a reduced-vocabulary DFlash draft's own lm_head.

    vllm-ascend's ``_maybe_share_lm_head`` replaces an EAGLE/DFlash draft's lm_head with the
    verifier's unless the draft maps its vocabulary (``draft_id_to_target_id``, the d2t gate of
    vllm-ascend PR #9795); a line without it (v0.20.2rc, vllm-ascend issue #11374) drops a
    reduced-vocabulary draft's acceptance from ~25 % to ~1.7 %. Read from the installed source,
    never imported (importing needs the NPU runtime). `gate`: present, absent, unknown (the
    function was not found where expected), or not_installed."""
    if not package_dir:
        return {"gate": "not_installed", "file": None}
    for relative in LM_HEAD_SOURCES:
        path = f"{package_dir.rstrip('/')}/{relative}"
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                function = _function_source(handle.read(), "_maybe_share_lm_head")
        except OSError:
            continue
        if function is not None:
            gate = "present" if "draft_id_to_target_id" in function else "absent"
            return {"gate": gate, "file": path}
    return {"gate": "unknown", "file": None}


def vllm_ascend_dir() -> Optional[str]:
    """The installed vllm_ascend package's directory, found without importing it."""
    import importlib.util  # noqa: PLC0415

    try:
        spec = importlib.util.find_spec("vllm_ascend")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return next(iter(spec.submodule_search_locations))


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specfleet_helpers.checks.stack_report",
        description="Print the target Python's version, package versions and NPU status as JSON.",
    )
    parser.add_argument(
        "--dist",
        action="append",
        default=None,
        help="distribution to report (repeat); default: the runbook's list",
    )
    parser.add_argument(
        "--npu",
        action="store_true",
        help="also import torch_npu: is_available, device count and SoC version; and read from"
        " vllm-ascend's source whether it keeps a reduced-vocabulary DFlash draft's lm_head",
    )
    parser.add_argument(
        "--constraints-out",
        help="write pip constraints pinning the reported distributions to this file",
    )
    parser.add_argument(
        "--expect",
        action="append",
        default=[],
        metavar="NAME==VERSION",
        help="exit 1 unless NAME is installed at VERSION (repeat)",
    )
    parser.add_argument(
        "--expect-absent",
        action="append",
        default=[],
        metavar="NAME",
        help="exit 1 if NAME is installed (repeat)",
    )
    parser.add_argument(
        "--expect-editable",
        action="append",
        default=[],
        metavar="NAME",
        help="exit 1 if NAME is installed but not editable (repeat)",
    )
    parser.add_argument(
        "--expect-not-editable",
        action="append",
        default=[],
        metavar="NAME",
        help="exit 1 if NAME is an editable install (repeat)",
    )
    args = parser.parse_args(argv)
    problems = check_expectations(
        args.expect, args.expect_absent, args.expect_editable, args.expect_not_editable
    )
    if problems:
        print("; ".join(problems))
        return 1
    versions = distribution_versions(args.dist or RUNBOOK_DISTRIBUTIONS)
    report: dict[str, Any] = {
        "python": platform.python_version(),
        "executable": sys.executable,
        "versions": versions,
    }
    if args.npu:
        report.update(npu_status())
        report["dflash_lm_head"] = dflash_lm_head_gate(vllm_ascend_dir())
    if args.constraints_out:
        lines = constraints(versions)
        with open(args.constraints_out, "w") as fh:
            fh.write("# generated by specfleet: keep what the image preinstalled\n")
            fh.write("".join(line + "\n" for line in lines))
        report["constraints"] = lines
    print(json.dumps(report, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
