"""Tests for specfleet_helpers.host.wheel_tags: wheel names, the tags a host's Python accepts,
the check that names wheels which do not fit, and pip download for another Python."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest
from procutil import HELPERS, run_helper
from specfleet_helpers.host.wheel_tags import (
    describe,
    identity,
    misfits,
    parse_wheel_filename,
    pip_target_args,
    platform_tags,
    supported_tags,
    with_overrides,
)

# The vllm-ascend v0.23.0 image (Ubuntu 22.04: glibc 2.35) on an A2 host (Kunpeng, aarch64).
A2_IMAGE = {
    "python": "3.12.13",
    "implementation": "cp",
    "abi": "cp312",
    "system": "linux",
    "arch": "aarch64",
    "glibc": "2.35",
    "markers": {"python_version": "3.12", "platform_machine": "aarch64"},
}
X86_IMAGE = {**A2_IMAGE, "arch": "x86_64", "markers": {"platform_machine": "x86_64"}}


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return run_helper("specfleet_helpers.host.wheel_tags", *args)


def test_parse_wheel_filename_with_compressed_tags_and_build():
    wheel = parse_wheel_filename(
        "aiohttp-3.14.5-cp312-cp312-manylinux2014_aarch64.manylinux_2_17_aarch64.whl"
    )
    assert (wheel.name, wheel.version, wheel.build) == ("aiohttp", "3.14.5", "")
    assert wheel.tags == {
        ("cp312", "cp312", "manylinux2014_aarch64"),
        ("cp312", "cp312", "manylinux_2_17_aarch64"),
    }
    built = parse_wheel_filename("torch-2.10.0+cpu-1-cp312-cp312-linux_aarch64.whl")
    assert (built.version, built.build) == ("2.10.0+cpu", "1")
    assert parse_wheel_filename("six-1.17.0-py2.py3-none-any.whl").tags == {
        ("py2", "none", "any"),
        ("py3", "none", "any"),
    }


@pytest.mark.parametrize(
    "name",
    ["speculators-0.9.0.tar.gz", "bad-1.0-py3-any.whl", "x-1.0-build-py3-none-any.whl"],
)
def test_parse_wheel_filename_rejects_what_is_not_a_wheel(name):
    with pytest.raises(ValueError, match=name.split("-")[0]):
        parse_wheel_filename(name)


def test_platform_tags_aarch64_stop_at_manylinux2014():
    tags = platform_tags(A2_IMAGE)
    assert tags[0] == "manylinux_2_35_aarch64"
    assert tags[-3:] == ["manylinux_2_17_aarch64", "manylinux2014_aarch64", "linux_aarch64"]
    assert not [t for t in tags if "manylinux1" in t or "manylinux2010" in t]


def test_platform_tags_x86_64_go_down_to_manylinux1():
    tags = platform_tags(X86_IMAGE)
    assert "manylinux2010_x86_64" in tags and "manylinux_2_12_x86_64" in tags
    assert tags[-3:] == ["manylinux_2_5_x86_64", "manylinux1_x86_64", "linux_x86_64"]


def test_platform_tags_without_glibc_is_plain_linux():
    assert platform_tags({**A2_IMAGE, "glibc": None}) == ["linux_aarch64"]


def test_supported_tags_order_and_content():
    tags = supported_tags(A2_IMAGE)
    assert tags[0] == ("cp312", "cp312", "manylinux_2_35_aarch64")
    assert ("cp312", "abi3", "manylinux2014_aarch64") in tags
    assert ("cp38", "abi3", "manylinux_2_17_aarch64") in tags
    assert ("py3", "none", "any") in tags
    assert tags.index(("cp312", "cp312", "linux_aarch64")) < tags.index(
        ("cp312", "abi3", "manylinux_2_35_aarch64")
    )
    assert tags[-1] == ("py30", "none", "any")
    # Nothing for another Python, ABI or architecture.
    assert not [t for t in tags if t[0] == "cp311" and t[1] == "cp311"]
    assert not [t for t in tags if "x86_64" in t[2]]


def test_supported_tags_free_threaded_has_no_abi3():
    tags = supported_tags({**A2_IMAGE, "python": "3.13.1", "abi": "cp313t"})
    assert tags[0] == ("cp313", "cp313t", "manylinux_2_35_aarch64")
    assert not [t for t in tags if t[1] == "abi3"]


FITS = [
    "numpy-2.5.4-cp312-cp312-manylinux_2_27_aarch64.manylinux_2_28_aarch64.whl",
    "pydantic_core-2.50.5-cp312-cp312-manylinux2014_aarch64.manylinux_2_17_aarch64.whl",
    "safetensors-0.8.0-cp310-abi3-manylinux_2_17_aarch64.manylinux2014_aarch64.whl",
    "multiprocess-0.70.19-py312-none-any.whl",
    "speculators-0.9.0-py3-none-any.whl",
]


def test_misfits_accepts_what_the_host_installs():
    assert misfits(FITS, A2_IMAGE, "a2-host") == []


@pytest.mark.parametrize(
    "wheel",
    [
        # the controller's Python
        "numpy-2.5.4-cp311-cp311-manylinux_2_27_aarch64.manylinux_2_28_aarch64.whl",
        # the controller's architecture
        "numpy-2.5.4-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
        # a newer glibc than the image's
        "pyarrow-26.0.1-cp312-cp312-manylinux_2_39_aarch64.whl",
        # musl, not glibc
        "numpy-2.5.4-cp312-cp312-musllinux_1_2_aarch64.whl",
        # a later Python's pure wheel
        "multiprocess-0.70.19-py313-none-any.whl",
    ],
)
def test_misfits_names_each_wheel_that_does_not_fit(wheel):
    problems = misfits([*FITS, wheel], A2_IMAGE, "a2-host")
    assert len(problems) == 1, problems
    assert problems[0].startswith(wheel + " (tags "), problems


def test_misfits_names_a_source_distribution():
    problems = misfits(["jieba-0.42.1.tar.gz"], A2_IMAGE, "a2-host")
    assert len(problems) == 1 and "jieba-0.42.1.tar.gz" in problems[0] and "a2-host" in problems[0]


def test_pip_target_args():
    args = pip_target_args(A2_IMAGE)
    assert args[:7] == [
        "--only-binary=:all:",
        "--implementation",
        "cp",
        "--python-version",
        "3.12",
        "--abi",
        "cp312",
    ]
    platforms = [args[i + 1] for i, a in enumerate(args) if a == "--platform"]
    assert platforms == platform_tags(A2_IMAGE)


def test_with_overrides_moves_markers_too():
    out = with_overrides(X86_IMAGE, python="3.11", arch="aarch64", glibc="2.28")
    assert (out["python"], out["abi"], out["arch"], out["glibc"]) == (
        "3.11.0",
        "cp311",
        "aarch64",
        "2.28",
    )
    assert out["markers"]["python_version"] == "3.11"
    assert out["markers"]["platform_machine"] == "aarch64"
    assert X86_IMAGE["arch"] == "x86_64"  # the input is not modified
    with pytest.raises(ValueError, match="python"):
        with_overrides(X86_IMAGE, python="twelve")
    with pytest.raises(ValueError, match="glibc"):
        with_overrides(X86_IMAGE, glibc="2")


def test_identity_leaves_out_the_kernel_build():
    a = {**X86_IMAGE, "markers": {"python_version": "3.12", "platform_release": "6.1"}}
    b = {**a, "executable": "/elsewhere", "markers": {**a["markers"], "platform_release": "6.8"}}
    assert identity(a) == identity(b)
    assert identity(a) != identity(with_overrides(a, arch="aarch64"))


def test_describe_the_running_interpreter():
    me = describe()
    assert me["python"] == platform.python_version()
    assert me["abi"].startswith(f"cp{sys.version_info.major}{sys.version_info.minor}")
    assert me["arch"] == platform.machine()
    assert me["markers"]["python_version"] == ".".join(platform.python_version_tuple()[:2])
    assert me["markers"]["sys_platform"] == sys.platform
    # The interpreter running the tests accepts its own tags.
    assert (
        f"cp{sys.version_info.major}{sys.version_info.minor}",
        me["abi"],
        f"linux_{me['arch']}",
    ) in (supported_tags(me))


def test_cli_describe_check_and_target(tmp_path):
    proc = run_cli("describe")
    assert proc.returncode == 0, proc.stderr
    me = json.loads(proc.stdout)
    good = f"x-1.0-py3-none-linux_{me['arch']}.whl"
    bad = "x-1.0-cp27-cp27mu-linux_s390x.whl"
    for name in (good, bad):
        (tmp_path / name).write_bytes(b"")
    ok = run_cli("check", "--target", proc.stdout, "--host", "h1", str(tmp_path / good))
    assert ok.returncode == 0 and "1 wheels fit h1" in ok.stdout, ok.stdout + ok.stderr
    failed = run_cli("check", "--target", proc.stdout, "--host", "h1", str(tmp_path))
    assert failed.returncode == 1
    assert "1 of 2 files do not fit h1" in failed.stdout and bad in failed.stdout
    assert good not in failed.stdout
    (tmp_path / "t.json").write_text(proc.stdout)
    moved = run_cli("target", "--target", str(tmp_path / "t.json"), "--arch", "aarch64")
    assert moved.returncode == 0, moved.stderr
    assert json.loads(moved.stdout)["target"]["arch"] == "aarch64"
    assert json.loads(moved.stdout)["identity"]["markers"]["platform_machine"] == "aarch64"
    assert run_cli("target", "--target", str(tmp_path / "t.json"), "--glibc", "x").returncode == 2


def test_cli_download_evaluates_markers_for_the_target(tmp_path):
    """pip download from local wheels only: a dependency marked for Python 3.12 is fetched for
    a 3.12 target even when the Python running pip is another one."""
    links = tmp_path / "links"
    links.mkdir()
    from specfleet_helpers.stages.image_pins import stub_wheel

    top = stub_wheel(links, "toplevel", "1.0", "py3-none-any")
    # Give it a dependency that applies on Python 3.12 only.
    import zipfile

    with zipfile.ZipFile(top) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    meta = "toplevel-1.0.dist-info/METADATA"
    members[meta] += b'Requires-Dist: only312; python_version == "3.12"\n'
    top.unlink()
    with zipfile.ZipFile(top, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    stub_wheel(links, "only312", "2.0", "py3-none-any")
    target = {**X86_IMAGE, "markers": {**describe()["markers"], "python_version": "3.12"}}
    (tmp_path / "t.json").write_text(json.dumps(target))
    dest = tmp_path / "dest"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "specfleet_helpers.host.wheel_tags",
            "download",
            "--target",
            str(tmp_path / "t.json"),
            "--",
            "--isolated",
            "--no-index",
            "--find-links",
            str(links),
            "--dest",
            str(dest),
            "toplevel==1.0",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(HELPERS)},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(p.name.split("-")[0] for p in dest.iterdir()) == ["only312", "toplevel"]
