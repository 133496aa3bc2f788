"""Tests for specfleet_helpers.host.container's image-archive architecture check: the tars
`docker save` and `podman save` write (docker-archive, OCI layout, both at once from Docker 25
on), built here small, with configs of known architectures.

An x86 controller's `docker save` holds amd64; Kunpeng hosts are aarch64 (arm64). Such an
archive loads and fails only at `run` (exec format error): the check refuses it first.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest
from specfleet_helpers.host import container

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


class Tar:
    """A tar built in memory, written at the end; blobs are content-addressed as in OCI."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}

    def add(self, name: str, data: bytes | dict | list) -> str:
        raw = data if isinstance(data, bytes) else json.dumps(data).encode()
        self.files[name] = raw
        return name

    def blob(self, data: dict, *, store: bool = True) -> dict:
        """The descriptor of `data`; stored under blobs/sha256/ unless store is False (a
        platform an index names whose content was never saved)."""
        raw = json.dumps(data).encode()
        digest = hashlib.sha256(raw).hexdigest()
        if store:
            self.files[f"blobs/sha256/{digest}"] = raw
        return {"digest": f"sha256:{digest}", "size": len(raw)}

    def write(self, path: Path, mode: str = "w", prefix: str = "") -> Path:
        with tarfile.open(path, mode) as tar:
            for name, raw in self.files.items():
                info = tarfile.TarInfo(prefix + name)
                info.size = len(raw)
                tar.addfile(info, io.BytesIO(raw))
        return path


def config(arch: str) -> dict:
    return {"architecture": arch, "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}}


def image_manifest(tar: Tar, arch: str, *, store: bool = True) -> dict:
    cfg = tar.blob(config(arch), store=store)
    layer = tar.blob({"layer": arch}, store=store)
    return {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **cfg},
        "layers": [layer],
    }


def docker_archive(tmp_path: Path, arch: str, **write) -> Path:
    """`docker save` before Docker 25 / `podman save` (docker-archive): <hex>.json configs."""
    tar = Tar()
    name = tar.add("0123abcd.json", config(arch))
    tar.add("manifest.json", [{"Config": name, "RepoTags": ["img:1"], "Layers": ["l/layer.tar"]}])
    tar.add("l/layer.tar", b"")
    return tar.write(tmp_path / f"docker-{arch}.tar", **write)


def docker25_archive(tmp_path: Path, arch: str) -> Path:
    """`docker save` from Docker 25 on: an OCI layout with a manifest.json beside it."""
    tar = Tar()
    manifest = image_manifest(tar, arch)
    desc = tar.blob(manifest)
    tar.add("index.json", {"schemaVersion": 2, "manifests": [{"mediaType": OCI_MANIFEST, **desc}]})
    tar.add("oci-layout", {"imageLayoutVersion": "1.0.0"})
    cfg = manifest["config"]["digest"].split(":")[1]
    tar.add("manifest.json", [{"Config": f"blobs/sha256/{cfg}", "RepoTags": ["img:1"]}])
    return tar.write(tmp_path / f"docker25-{arch}.tar")


def oci_multi_platform(tmp_path: Path, saved: list[str], named_only: list[str]) -> Path:
    """An OCI archive whose index.json points to a nested image index (a multi-arch tag):
    `saved` platforms have their content in the archive, `named_only` are listed but absent
    (docker save with the containerd store writes what is present), plus an attestation."""
    tar = Tar()
    entries = []
    for arch in saved + named_only:
        desc = tar.blob(image_manifest(tar, arch, store=arch in saved), store=arch in saved)
        entries.append(
            {"mediaType": OCI_MANIFEST, **desc, "platform": {"os": "linux", "architecture": arch}}
        )
    attestation = tar.blob(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": tar.blob({"predicate": 1}),
            "layers": [],
        }
    )
    entries.append(
        {
            "mediaType": OCI_MANIFEST,
            **attestation,
            "platform": {"os": "unknown", "architecture": "unknown"},
            "annotations": {"vnd.docker.reference.type": "attestation-manifest"},
        }
    )
    nested = tar.blob({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries})
    tar.add("index.json", {"schemaVersion": 2, "manifests": [{"mediaType": OCI_INDEX, **nested}]})
    tar.add("oci-layout", {"imageLayoutVersion": "1.0.0"})
    return tar.write(tmp_path / "oci-multi.tar")


@pytest.mark.parametrize(
    ("machine", "arch"), [("x86_64", "amd64"), ("aarch64", "arm64"), ("arm64", "arm64")]
)
def test_uname_names_map_to_image_architectures(machine, arch) -> None:
    assert container.oci_arch(machine) == arch


def test_docker_archive_of_an_x86_controller_is_refused_on_a_kunpeng_host(tmp_path: Path) -> None:
    archive = docker_archive(tmp_path, "amd64")
    assert container.archive_architectures(str(archive)) == ["amd64"]
    result = container.check_archive_arch(
        str(archive), "aarch64", "quay.io/ascend/vllm-ascend:v0.23.0"
    )
    assert result["ok"] is False
    message = result["message"]
    assert "linux/amd64 only" in message and "this host is arm64 (uname -m aarch64)" in message
    assert "docker pull --platform linux/arm64 quay.io/ascend/vllm-ascend:v0.23.0" in message
    assert "docker save --platform linux/arm64" in message
    # the same archive on an x86 host is fine
    assert container.check_archive_arch(str(archive), "x86_64")["ok"] is True


def test_docker25_archive_is_read(tmp_path: Path) -> None:
    archive = docker25_archive(tmp_path, "arm64")
    assert container.archive_architectures(str(archive)) == ["arm64"]
    assert container.check_archive_arch(str(archive), "aarch64")["ok"] is True
    assert container.check_archive_arch(str(archive), "x86_64")["ok"] is False


def test_podman_oci_archive_with_dot_slash_names_and_gzip(tmp_path: Path) -> None:
    tar = Tar()
    desc = tar.blob(image_manifest(tar, "arm64"))
    tar.add("index.json", {"schemaVersion": 2, "manifests": [{"mediaType": OCI_MANIFEST, **desc}]})
    archive = tar.write(tmp_path / "oci.tar.gz", mode="w:gz", prefix="./")
    assert container.archive_architectures(str(archive)) == ["arm64"]


def test_multi_platform_archive_counts_only_the_platforms_it_holds(tmp_path: Path) -> None:
    both = oci_multi_platform(tmp_path, saved=["amd64", "arm64"], named_only=["s390x"])
    assert container.archive_architectures(str(both)) == ["amd64", "arm64"]
    assert container.check_archive_arch(str(both), "aarch64")["ok"] is True
    # the index names arm64 but only amd64's content was saved: refused on aarch64
    (tmp_path / "x").mkdir()
    amd_only = oci_multi_platform(tmp_path / "x", saved=["amd64"], named_only=["arm64"])
    result = container.check_archive_arch(str(amd_only), "aarch64")
    assert result["ok"] is False and result["architectures"] == ["amd64"]


def test_not_an_image_archive(tmp_path: Path) -> None:
    plain = tmp_path / "plain.tar"
    Tar().write(plain)
    with pytest.raises(container.ArchiveError, match=r"neither manifest\.json"):
        container.archive_architectures(str(plain))
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"not a tar at all" * 100)
    with pytest.raises(container.ArchiveError, match="not a readable tar"):
        container.archive_architectures(str(junk))
    with pytest.raises(container.ArchiveError, match="not a readable tar"):
        container.archive_architectures(str(tmp_path / "missing.tar"))


def test_cli_archive_arch(tmp_path: Path, capsys) -> None:
    archive = str(docker_archive(tmp_path, "amd64"))
    assert container.main(["archive-arch", f"--archive={archive}", "--host-arch=x86_64"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == {
        "archive": archive,
        "architectures": ["amd64"],
        "host_arch": "amd64",
        "ok": True,
        "message": "",
    }
    rc = container.main(
        ["archive-arch", f"--archive={archive}", "--host-arch=aarch64", "--image=img"]
    )
    assert rc == 1
    err = capsys.readouterr().err
    assert "holds linux/amd64 only, but this host is arm64" in err
    assert (
        container.main(["archive-arch", f"--archive={tmp_path / 'none.tar'}", "--host-arch=x86_64"])
        == 2
    )
    assert "cannot read the image archive's architecture" in capsys.readouterr().err


def test_cli_archive_arch_help() -> None:
    with pytest.raises(SystemExit) as exc:
        container.main(["archive-arch", "--help"])
    assert exc.value.code == 0
