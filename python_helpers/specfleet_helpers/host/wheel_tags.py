"""Which wheels a host's Python can install, and pip downloads made for that Python.

The wheelhouse is downloaded on the controller for the hosts, whose Python (3.12 in the
vllm-ascend image), architecture and glibc usually differ from the controller's. This module

- describes the interpreter it runs in (`describe`, run on the host with the target Python):
  its wheel tags (python, abi, platforms incl. manylinux/glibc) and its PEP 508 marker
  environment;
- lists the tags such a target accepts, most preferred first, as `packaging.tags.sys_tags`
  does for CPython on Linux (`supported_tags`);
- parses wheel file names and names every wheel that does not fit a target (`check`);
- runs `pip download` for a target (`download`): pip's `--platform/--python-version/
  --implementation/--abi` select the wheels, and pip's marker environment is replaced by the
  target's (pip evaluates `; python_version < "3.12"` or `; platform_machine == "x86_64"`
  against the Python running pip, even with those options: pypa/pip#11664).

Standard library only (it runs in the image's Python and on the controller); `download`
imports the running interpreter's pip.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

Tag = tuple[str, str, str]

# glibc versions of the legacy manylinux names (PEP 600).
LEGACY_MANYLINUX = {(2, 17): "manylinux2014", (2, 12): "manylinux2010", (2, 5): "manylinux1"}
# Architectures manylinux2010 and manylinux1 were defined for.
LEGACY_OLD_ARCHES = {"x86_64", "i686"}
# Marker keys that differ between otherwise identical hosts (kernel builds): left out of the
# identity of a wheel set, still given to pip.
HOST_SPECIFIC_MARKERS = ("platform_release", "platform_version")


def normalize(name: str) -> str:
    """PEP 503 normalized project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Wheel:
    filename: str
    name: str
    version: str
    build: str
    tags: frozenset[Tag]


def parse_wheel_filename(filename: str) -> Wheel:
    """name-version(-build)?-python-abi-platform.whl, with compressed tag sets (a.b)."""
    if not filename.endswith(".whl"):
        raise ValueError(f"{filename}: not a wheel (.whl)")
    parts = filename[: -len(".whl")].split("-")
    if len(parts) not in (5, 6):
        raise ValueError(f"{filename}: expected name-version[-build]-python-abi-platform.whl")
    build = parts[2] if len(parts) == 6 else ""
    if build and not build[0].isdigit():
        raise ValueError(f"{filename}: build tag {build!r} must start with a digit")
    pythons, abis, platforms = parts[-3:]
    tags = frozenset(
        (p, a, plat)
        for p in pythons.split(".")
        for a in abis.split(".")
        for plat in platforms.split(".")
    )
    return Wheel(filename, parts[0], parts[1], build, tags)


def glibc_version() -> Optional[str]:
    """glibc version of the running process ("2.35"), None on other C libraries."""
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (AttributeError, OSError, ValueError):
        text = ""
    name, _, version = text.partition(" ")
    if name != "glibc" or not re.match(r"^\d+\.\d+", version):
        return None
    return ".".join(version.split(".")[:2])


def marker_environment() -> dict[str, str]:
    """PEP 508 marker values of the running interpreter (packaging.markers.default_environment)."""
    impl = sys.implementation
    info = impl.version
    iver = f"{info.major}.{info.minor}.{info.micro}"
    if info.releaselevel != "final":
        iver += info.releaselevel[0] + str(info.serial)
    return {
        "implementation_name": impl.name,
        "implementation_version": iver,
        "os_name": os.name,
        "platform_machine": platform.machine(),
        "platform_release": platform.release(),
        "platform_system": platform.system(),
        "platform_version": platform.version(),
        "python_full_version": platform.python_version(),
        "platform_python_implementation": platform.python_implementation(),
        "python_version": ".".join(platform.python_version_tuple()[:2]),
        "sys_platform": sys.platform,
    }


def describe() -> dict[str, Any]:
    """The running interpreter as a wheel target."""
    if sys.implementation.name != "cpython":
        raise SystemExit(f"{sys.executable}: {sys.implementation.name} is not CPython")
    soabi = sysconfig.get_config_var("SOABI") or ""
    # cpython-312-x86_64-linux-gnu -> cp312; free-threaded cpython-313t-... -> cp313t
    match = re.match(r"^cpython-(\d+)([a-z]*)", soabi)
    nodot = f"{sys.version_info.major}{sys.version_info.minor}"
    abi = f"cp{match.group(1)}{match.group(2)}" if match else f"cp{nodot}"
    # linux-x86_64 (sysconfig knows a 32-bit userland on a 64-bit kernel; platform.machine not)
    plat = sysconfig.get_platform()
    system, _, arch = plat.partition("-")
    return {
        "executable": sys.executable,
        "python": platform.python_version(),
        "implementation": "cp",
        "abi": abi,
        "system": system,
        "arch": arch.replace("-", "_").replace(".", "_"),
        "glibc": glibc_version(),
        "markers": marker_environment(),
    }


def with_overrides(
    target: dict[str, Any],
    python: Optional[str] = None,
    arch: Optional[str] = None,
    glibc: Optional[str] = None,
) -> dict[str, Any]:
    """A target with the Python (X.Y[.Z]), architecture or glibc replaced, markers to match."""
    out = json.loads(json.dumps(target))
    markers = out.setdefault("markers", {})
    if python:
        if not re.match(r"^3\.\d+(\.\d+)?$", python):
            raise ValueError(f"python {python!r}: expected a version such as 3.12")
        major_minor = ".".join(python.split(".")[:2])
        full = python if python.count(".") == 2 else f"{major_minor}.0"
        out["python"] = full
        out["abi"] = "cp" + major_minor.replace(".", "")
        markers["python_version"] = major_minor
        markers["python_full_version"] = full
        markers["implementation_version"] = full
    if arch:
        out["arch"] = arch
        markers["platform_machine"] = arch
    if glibc:
        if not re.match(r"^\d+\.\d+$", glibc):
            raise ValueError(f"glibc {glibc!r}: expected a version such as 2.35")
        out["glibc"] = glibc
    return out


def identity(target: dict[str, Any]) -> dict[str, Any]:
    """What decides which wheels fit and which dependencies apply (no paths, no kernel build)."""
    markers = {k: v for k, v in target.get("markers", {}).items() if k not in HOST_SPECIFIC_MARKERS}
    keys = ("python", "implementation", "abi", "system", "arch", "glibc")
    return {**{k: target.get(k) for k in keys}, "markers": markers}


def platform_tags(target: dict[str, Any]) -> list[str]:
    """Platform tags, most preferred first: manylinux_2_N down to the oldest, then linux."""
    arch = target["arch"]
    if target.get("system", "linux") != "linux":
        raise ValueError(f"system {target.get('system')!r}: only Linux hosts are supported")
    tags = []
    glibc = target.get("glibc")
    if glibc:
        major, minor = (int(x) for x in glibc.split(".")[:2])
        oldest = 4 if arch in LEGACY_OLD_ARCHES else 16
        for m in range(minor, oldest, -1) if major == 2 else []:
            tags.append(f"manylinux_{major}_{m}_{arch}")
            legacy = LEGACY_MANYLINUX.get((major, m))
            if legacy and (legacy == "manylinux2014" or arch in LEGACY_OLD_ARCHES):
                tags.append(f"{legacy}_{arch}")
    tags.append(f"linux_{arch}")
    return tags


def supported_tags(target: dict[str, Any]) -> list[Tag]:
    """Tags the target accepts, most preferred first (packaging's cpython_tags, then
    compatible_tags)."""
    major, minor = (int(x) for x in target["python"].split(".")[:2])
    interpreter = f"cp{major}{minor}"
    abi = target.get("abi") or interpreter
    platforms = platform_tags(target)
    tags: list[Tag] = [(interpreter, abi, p) for p in platforms]
    abi3 = not abi.endswith("t")  # free-threaded builds have no stable ABI
    if abi3:
        tags += [(interpreter, "abi3", p) for p in platforms]
    tags += [(interpreter, "none", p) for p in platforms]
    if abi3:
        for m in range(minor - 1, 1, -1):
            tags += [(f"cp{major}{m}", "abi3", p) for p in platforms]
    pythons = [f"py{major}{minor}", f"py{major}"] + [
        f"py{major}{m}" for m in range(minor - 1, -1, -1)
    ]
    for py in pythons:
        tags += [(py, "none", p) for p in platforms]
    tags.append((interpreter, "none", "any"))
    tags += [(py, "none", "any") for py in pythons]
    return tags


def summary(target: dict[str, Any]) -> str:
    glibc = f" glibc {target['glibc']}" if target.get("glibc") else " (no glibc)"
    system = target.get("system", "linux")
    return f"CPython {target['python']} ({target.get('abi')}) on {system} {target['arch']}{glibc}"


def misfits(filenames: list[str], target: dict[str, Any], host: str) -> list[str]:
    """One problem per file that this target (host) cannot install, naming the file."""
    accepted = set(supported_tags(target))
    problems = []
    for filename in sorted(filenames):
        try:
            wheel = parse_wheel_filename(filename)
        except ValueError as exc:
            problems.append(f"{exc} (host {host} installs wheels only, with --no-index)")
            continue
        if not wheel.tags & accepted:
            tags = ", ".join("-".join(t) for t in sorted(wheel.tags))
            problems.append(f"{filename} (tags {tags})")
    return problems


def pip_target_args(target: dict[str, Any]) -> list[str]:
    """pip options that select wheels for the target instead of the Python running pip."""
    major_minor = ".".join(target["python"].split(".")[:2])
    args = [
        "--only-binary=:all:",
        "--implementation",
        "cp",
        "--python-version",
        major_minor,
        "--abi",
        target.get("abi") or "cp" + major_minor.replace(".", ""),
    ]
    for plat in platform_tags(target):
        args += ["--platform", plat]
    return args


def run_pip_download(target: dict[str, Any], pip_args: list[str]) -> int:
    """pip download for the target, with its marker environment in place of ours."""
    try:
        from pip._internal.cli.main import main as pip_main
        from pip._vendor.packaging import markers
    except ImportError as exc:
        raise SystemExit(f"{sys.executable} has no usable pip: {exc}") from exc
    if not callable(getattr(markers, "default_environment", None)):
        raise SystemExit("this pip has no packaging.markers.default_environment to set")
    environment = {**markers.default_environment(), **target.get("markers", {})}
    markers.default_environment = lambda: dict(environment)  # type: ignore[assignment]
    return int(pip_main(["download", *pip_target_args(target), *pip_args]) or 0)


def load_target(source: str) -> dict[str, Any]:
    """A target from inline JSON or a JSON file; a {"target": ...} document gives its target."""
    if source.lstrip().startswith("{"):
        # Output of describe run through the stage wrapper: the JSON is its last line.
        data = json.loads(source.strip().splitlines()[-1])
    else:
        with open(source) as fh:
            data = json.load(fh)
    return data.get("target", data)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specfleet_helpers.host.wheel_tags",
        description="Describe a Python as a wheel target, check wheels against one, "
        "or pip download for one.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("describe", help="print the running interpreter as a wheel target (JSON)")
    target_p = sub.add_parser(
        "target", help="print a target with its Python, architecture or glibc replaced"
    )
    target_p.add_argument(
        "--target", required=True, help="JSON (or a file of it) written by describe"
    )
    target_p.add_argument("--python", help="X.Y or X.Y.Z")
    target_p.add_argument("--arch", help="e.g. aarch64")
    target_p.add_argument("--glibc", help="e.g. 2.28")
    check_p = sub.add_parser("check", help="exit 1 naming each wheel the target cannot install")
    check_p.add_argument(
        "--target", required=True, help="JSON (or a file of it) written by describe"
    )
    check_p.add_argument("--host", default="the host", help="host name for the messages")
    check_p.add_argument("paths", nargs="+", help="wheel files or directories of them")
    tags_p = sub.add_parser("tags", help="print the tags the target accepts, most preferred first")
    tags_p.add_argument("--target", required=True)
    dl_p = sub.add_parser(
        "download", help="pip download for the target (the rest of the arguments go to pip)"
    )
    dl_p.add_argument("--target", required=True, help="JSON file written by describe or target")
    args, rest = parser.parse_known_args(argv)
    if rest and rest[0] == "--":
        rest = rest[1:]
    if rest and args.command != "download":
        parser.error(f"unrecognized arguments: {' '.join(rest)}")

    if args.command == "describe":
        print(json.dumps(describe(), sort_keys=True))
        return 0
    if args.command == "target":
        try:
            out = with_overrides(load_target(args.target), args.python, args.arch, args.glibc)
        except ValueError as exc:
            print(str(exc), file=sys.stderr)
            return 2
        print(json.dumps({"target": out, "identity": identity(out)}, sort_keys=True))
        return 0
    if args.command == "tags":
        for tag in supported_tags(load_target(args.target)):
            print("-".join(tag))
        return 0
    if args.command == "check":
        files: list[str] = []
        for path in map(Path, args.paths):
            files += (
                sorted(p.name for p in path.iterdir() if p.is_file())
                if path.is_dir()
                else [path.name]
            )
        target = load_target(args.target)
        problems = misfits(files, target, args.host)
        if problems:
            print(
                f"{len(problems)} of {len(files)} files do not fit {args.host} "
                f"({summary(target)}): " + "; ".join(problems)
            )
            return 1
        print(f"{len(files)} wheels fit {args.host} ({summary(target)})")
        return 0
    return run_pip_download(load_target(args.target), rest)


if __name__ == "__main__":
    sys.exit(main())
