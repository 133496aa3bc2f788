"""Tests for specfleet_helpers.stages.image_pins: the image's whole package list pinned, a changed
preinstalled distribution named after installing, and the wheelhouse's stand-in wheels."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from specfleet_helpers.host.wheel_tags import parse_wheel_filename
from specfleet_helpers.stages.image_pins import (
    additions,
    changes,
    constraint_lines,
    drop,
    is_pinnable,
    snapshot,
    stub_wheel,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
HELPERS = REPO_ROOT / "python_helpers"
IMAGE = {
    "torch": "2.10.0+cpu",
    "torch_npu": "2.10.0.post4",
    "vllm": "0.23.0+empty",
    "numpy": "1.26.4",
    "modelscope": "1.38.1",
}


def test_snapshot_splits_image_own_and_earlier_additions():
    present = {**IMAGE, "speculators": "0.9.0", "datasets": "4.0.0", "requests": "2.32.3"}
    snap = snapshot(
        present,
        exclude=["speculators", "modelscope"],
        added_before={"datasets": "4.0.0", "requests": "2.0.0"},
        required=["torch", "torch-npu", "vllm-ascend"],
    )
    assert snap["excluded"] == {"speculators": "0.9.0", "modelscope": "1.38.1"}
    # datasets came from an earlier install at this version; requests has moved since: the image's.
    assert snap["previously_added"] == {"datasets": "4.0.0"}
    assert snap["preinstalled"] == {
        "torch": "2.10.0+cpu",
        "torch_npu": "2.10.0.post4",
        "vllm": "0.23.0+empty",
        "numpy": "1.26.4",
        "requests": "2.32.3",
    }
    assert snap["missing"] == ["vllm-ascend"]  # torch-npu matches torch_npu
    assert snap["unpinnable"] == []


def test_constraints_skip_versions_pip_cannot_read():
    assert is_pinnable("2.10.0+cpu") and is_pinnable("1.0.post4") and is_pinnable("2!1.0rc1")
    assert not is_pinnable("2.0-ubuntu-build") and not is_pinnable("latest")
    assert constraint_lines({"b": "1.0", "a": "2.10.0+cpu", "c": "weird version"}) == [
        "a==2.10.0+cpu",
        "b==1.0",
    ]


def test_changes_name_before_and_after():
    assert changes(IMAGE, dict(IMAGE)) == []
    after = {**IMAGE, "numpy": "2.3.1", "Torch-NPU": "2.10.0.post4"}
    del after["vllm"]
    del after["torch_npu"]
    assert changes(IMAGE, after) == ["numpy 1.26.4 -> 2.3.1", "vllm 0.23.0+empty -> removed"]


def test_additions_are_what_the_image_did_not_have():
    before = {"preinstalled": {"torch": "2.10.0+cpu"}}
    assert additions(before, {"torch": "2.10.0+cpu", "speculators": "0.9.0"}) == {
        "speculators": "0.9.0"
    }


def test_stub_wheel_is_a_wheel_pip_reads(tmp_path):
    path = stub_wheel(tmp_path, "vllm-ascend", "0.23.0", "cp312-cp312-manylinux_2_35_aarch64")
    assert path.name == "vllm_ascend-0.23.0-0specfleet-cp312-cp312-manylinux_2_35_aarch64.whl"
    wheel = parse_wheel_filename(path.name)
    assert (wheel.version, wheel.build) == ("0.23.0", "0specfleet")
    with zipfile.ZipFile(path) as zf:
        meta = zf.read("vllm_ascend-0.23.0.dist-info/METADATA").decode()
        assert "Name: vllm-ascend\nVersion: 0.23.0\n" in meta
        assert "Requires-Dist" not in meta
        assert "RECORD" in " ".join(zf.namelist())
    # The same image gives the same bytes (the wheel set's files do not churn).
    (tmp_path / "again").mkdir()
    again = stub_wheel(
        tmp_path / "again", "vllm-ascend", "0.23.0", "cp312-cp312-manylinux_2_35_aarch64"
    )
    assert again.read_bytes() == path.read_bytes()


def test_drop_removes_the_image_and_refuses_other_versions(tmp_path):
    for name in (
        "torch-2.10.0+cpu-0specfleet-cp312-cp312-manylinux_2_35_aarch64.whl",
        "numpy-1.26.4-cp312-cp312-manylinux_2_17_aarch64.whl",
        "datasets-4.0.0-py3-none-any.whl",
    ):
        (tmp_path / name).write_bytes(b"")
    removed, problems = drop(tmp_path, {"torch": "2.10.0+cpu", "numpy": "1.26.4"})
    assert len(removed) == 2 and problems == []
    assert [p.name for p in tmp_path.iterdir()] == ["datasets-4.0.0-py3-none-any.whl"]
    (tmp_path / "torch-2.13.0-cp312-cp312-manylinux_2_28_aarch64.whl").write_bytes(b"")
    removed, problems = drop(tmp_path, {"torch": "2.10.0+cpu"})
    assert removed == []
    assert problems == [
        "torch-2.13.0-cp312-cp312-manylinux_2_28_aarch64.whl is torch 2.13.0, "
        "but the image preinstalled torch 2.10.0+cpu"
    ]


# -- the CLI against a site directory of metadata, as the image's Python sees it -------------


def fake_dist(site: Path, name: str, version: str) -> None:
    for old in site.glob(f"{name.replace('-', '_')}-*.dist-info"):
        shutil.rmtree(old)
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def run_cli(site: Path, *args: str) -> subprocess.CompletedProcess:
    # -S: no site-packages of the interpreter running the tests, only the fake image's.
    return subprocess.run(
        [sys.executable, "-S", "-m", "specfleet_helpers.stages.image_pins", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": f"{HELPERS}{os.pathsep}{site}"},
    )


@pytest.fixture
def site(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    for name, version in IMAGE.items():
        fake_dist(site, name, version)
    return site


def test_cli_freeze_install_compare_then_freeze_again(site: Path, tmp_path: Path):
    constraints, snap, record = (tmp_path / n for n in ("c.txt", "snap.json", "added.json"))
    common = ["--exclude=speculators", "--exclude=modelscope", f"--record={record}"]
    proc = run_cli(
        site,
        "freeze",
        *common,
        f"--constraints-out={constraints}",
        f"--snapshot-out={snap}",
        "--required=torch_npu",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = constraints.read_text().splitlines()
    assert lines[1:] == [
        "numpy==1.26.4",
        "torch==2.10.0+cpu",
        "torch_npu==2.10.0.post4",
        "vllm==0.23.0+empty",
    ]
    # The install: speculators and a dependency added, modelscope moved (on purpose).
    fake_dist(site, "speculators", "0.9.0")
    fake_dist(site, "datasets", "4.0.0")
    fake_dist(site, "modelscope", "1.37.0")
    proc = run_cli(site, "compare", f"--snapshot={snap}", f"--record-out={record}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all 4 preinstalled distributions unchanged" in proc.stdout
    assert json.loads(record.read_text())["added"] == {
        "datasets": "4.0.0",
        "modelscope": "1.37.0",
        "speculators": "0.9.0",
    }
    # Next run: what the first one added is not pinned (a newer speculators may move it).
    proc = run_cli(site, "freeze", *common, f"--constraints-out={constraints}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "datasets" not in constraints.read_text()
    assert json.loads(proc.stdout)["previously_added"] == {"datasets": "4.0.0"}


def test_cli_compare_names_a_changed_preinstalled_distribution(site: Path, tmp_path: Path):
    snap = tmp_path / "snap.json"
    assert run_cli(site, "freeze", f"--snapshot-out={snap}").returncode == 0
    fake_dist(site, "numpy", "2.3.1")
    shutil.rmtree(next(site.glob("vllm-*.dist-info")))
    proc = run_cli(site, "compare", f"--snapshot={snap}")
    assert proc.returncode == 1
    assert proc.stdout.strip() == (
        "the install changed 2 distributions the image preinstalled: "
        "numpy 1.26.4 -> 2.3.1; vllm 0.23.0+empty -> removed"
    )


def test_cli_freeze_fails_naming_a_missing_required(site: Path):
    proc = run_cli(site, "freeze", "--required=torch", "--required=triton-ascend")
    assert proc.returncode == 1
    assert "lacks triton-ascend" in proc.stderr and "torch," not in proc.stderr


def test_cli_stubs_and_drop(tmp_path: Path):
    request = tmp_path / "set.json"
    target = {"python": "3.12.13", "abi": "cp312", "arch": "aarch64", "glibc": "2.35"}
    request.write_text(json.dumps({"target": target, "snapshot": {"preinstalled": IMAGE}}))
    stubs = tmp_path / "stubs"
    proc = run_cli(
        tmp_path,
        "stubs",
        f"--snapshot={request}",
        f"--target={request}",
        f"--dest={stubs}",
        f"--constraints-out={stubs / 'c.txt'}",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = sorted(p.name for p in stubs.glob("*.whl"))
    assert len(names) == len(IMAGE)
    assert "torch-2.10.0+cpu-0specfleet-cp312-cp312-manylinux_2_35_aarch64.whl" in names
    assert "vllm==0.23.0+empty" in (stubs / "c.txt").read_text()
    proc = run_cli(tmp_path, "drop", f"--snapshot={request}", str(stubs))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not list(stubs.glob("*.whl"))
