"""Keep the one long-lived stage container of a host: plan what must change, then do it.

The npu_env role calls ``plan`` (always, also under --check) and ``ensure`` (only when the
plan is not ``ok``). The decision compares the container that exists with what is wanted:

- the image: the id the container runs vs the id the image reference has now;
- the run settings (devices, mounts, shm size, environment, extra run arguments, command):
  kept in the container's labels as JSON and a sha256, so an unchanged host is ``ok`` and a
  changed one is recreated with a reason naming what changed.

Docker and Podman are driven through the same CLI subset (``image inspect``,
``container inspect``, ``run``, ``start``, ``rm``), so both engines get the same decisions and
the same messages. The container always runs with the host's network and pid namespace: the
stage runner records pids that the host's stop, timeout and lock takeover must be able to
signal (stage_run.py), and the servers bind the host's loopback. Standard library only.

Two more jobs come before a container exists, so that the role decides nothing by guesswork:

- ``engine``: which engine ``specfleet_container_engine: auto`` means on this host (the one
  that already has the image, else docker, else podman; choose_engine says why);
- ``archive-arch``: the CPU architecture(s) of the images in a ``docker save`` / ``podman
  save`` archive (docker-archive or OCI layout, read with tarfile, no engine needed), checked
  against the host's before the archive is loaded: an amd64 image on an aarch64 host loads
  fine and fails only at ``run`` with ``exec format error``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tarfile
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

LABEL_HASH = "specfleet.settings-sha256"
LABEL_SETTINGS = "specfleet.settings"
LABEL_IMAGE_REF = "specfleet.image-ref"
# Set in the container: the stage environment wrapper runs inside when it sees it.
INSIDE_ENV = "SPECFLEET_CONTAINER"
# Namespaces that are not settings: the pid files and the loopback servers depend on them.
FIXED_ARGS = ("--network=host", "--pid=host")
# Podman caps a container at 2048 pids (containers.conf pids_limit); torchrun ranks times
# dataloader workers times their threads pass that on an 8- or 16-device host. -1 is podman's
# documented "unlimited" (0 on the command line would be passed on as a limit of 0); docker has
# no default limit, so it gets nothing.
PODMAN_PIDS_LIMIT = "-1"
# On a host where SELinux is enforcing, the container must read the driver files and use the
# /dev/davinci* devices (labelled for the host: usr_t, device_t) and write the work root and the
# cache. Relabelling (:z) is right for the last two only, must never touch system paths, and would
# rewrite the label of every file of a model cache on each creation; the devices would still need
# the container_use_devices boolean. Turning label separation off for this one container covers
# all of it and relabels nothing. Both engines already do so for a container that shares the
# host's pid namespace (podman setLabelOpts, moby generateSecurityOpt): saying it makes that a
# setting of its own, not a side effect of --pid=host.
SELINUX_SECURITY_OPTS = ("label=disable",)


@dataclass
class Wanted:
    """What the container must look like."""

    engine: str
    name: str
    image: str
    devices: list[str] = field(default_factory=list)
    mounts: list[str] = field(default_factory=list)
    shm_size: str = ""
    env: dict[str, str] = field(default_factory=dict)
    run_args: list[str] = field(default_factory=list)
    command: list[str] = field(default_factory=lambda: ["sleep", "infinity"])
    # The engine starts the container again after it exits and after a reboot (docker; podman
    # with its podman-restart.service): the services deployed in it come back with it
    # (service.py boot, run by the command). "" = no policy.
    restart: str = "always"
    # SELinux is enforcing on the host: label separation is turned off (SELINUX_SECURITY_OPTS).
    selinux_enforcing: bool = False

    def settings(self) -> dict[str, Any]:
        """The run settings that decide whether an existing container still fits.

        Devices and mounts keep their given order (it is the order of the run arguments), but
        duplicates are dropped. The image reference is not a setting: the image id is compared
        on its own, so a retag of the same image does not recreate anything. The pids limit and
        the security options are keys only where they apply (podman; an enforcing SELinux), so a
        container they do not concern keeps its hash.
        """
        settings: dict[str, Any] = {
            "devices": list(dict.fromkeys(self.devices)),
            "mounts": list(dict.fromkeys(self.mounts)),
            "shm_size": self.shm_size,
            "env": {INSIDE_ENV: self.name, **dict(sorted(self.env.items()))},
            "run_args": list(self.run_args),
            "command": list(self.command),
            "restart": self.restart,
            "fixed": list(FIXED_ARGS),
        }
        if self.engine == "podman":
            settings["pids_limit"] = PODMAN_PIDS_LIMIT
        if self.selinux_enforcing:
            settings["security_opt"] = list(SELINUX_SECURITY_OPTS)
        return settings


def host_side(spec: str) -> str:
    """The host path of a ``--device`` (HOST[:CONTAINER[:PERMS]]) or ``--volume``
    (HOST:CONTAINER[:OPTIONS]) argument."""
    return spec.split(":", 1)[0]


def missing_sources(wanted: Wanted) -> list[str]:
    """The device nodes and mount sources the host lacks, in the order given. Neither engine
    may be handed one: ``docker run --device`` of a node the host lacks fails the create (after
    the old container was removed, on a recreation), and docker creates an empty directory for
    a missing volume source, which hides the driver files or the job's storage the stages
    need."""
    wanted_paths = [host_side(d) for d in wanted.devices] + [host_side(m) for m in wanted.mounts]
    return [p for p in dict.fromkeys(wanted_paths) if not os.path.exists(p)]


def settings_hash(settings: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def normalize_id(image_id: Optional[str]) -> str:
    """Docker prints image ids as ``sha256:<hex>``, Podman as ``<hex>``."""
    text = (image_id or "").strip()
    return text.split(":", 1)[1] if text.startswith("sha256:") else text


def run_argv(wanted: Wanted) -> list[str]:
    """``<engine> run`` arguments that create the container from the wanted settings."""
    settings = wanted.settings()
    argv = [wanted.engine, "run", "--detach", "--name", wanted.name, *FIXED_ARGS]
    if settings["shm_size"]:
        argv.append(f"--shm-size={settings['shm_size']}")
    if settings["restart"]:
        argv.append(f"--restart={settings['restart']}")
    if "pids_limit" in settings:
        argv.append(f"--pids-limit={settings['pids_limit']}")
    for opt in settings.get("security_opt", []):
        argv.append(f"--security-opt={opt}")
    for device in settings["devices"]:
        argv.append(f"--device={device}")
    for mount in settings["mounts"]:
        argv.append(f"--volume={mount}")
    for key, value in settings["env"].items():
        argv.append(f"--env={key}={value}")
    argv += [
        f"--label={LABEL_HASH}={settings_hash(settings)}",
        f"--label={LABEL_SETTINGS}={json.dumps(settings, sort_keys=True)}",
        f"--label={LABEL_IMAGE_REF}={wanted.image}",
        *settings["run_args"],
        wanted.image,
        *settings["command"],
    ]
    return argv


def _changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What differs between two settings dicts, readably (for the plan's reason)."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        if isinstance(a, list) and isinstance(b, list):
            added = [x for x in b if x not in a]
            removed = [x for x in a if x not in b]
            parts = [f"+{x}" for x in added] + [f"-{x}" for x in removed]
            out.append(f"{key} {' '.join(parts) if parts else 'reordered'}")
        else:
            out.append(f"{key} {json.dumps(a, sort_keys=True)} -> {json.dumps(b, sort_keys=True)}")
    return out


def pid_alive(pid: int) -> bool:
    """The process runs (the container shares the host's pid namespace: its pid is the host's)."""
    return pid > 0 and os.path.exists(f"/proc/{pid}")


def decide(
    existing: Optional[dict[str, Any]],
    wanted: Wanted,
    image_id: str,
    alive: Callable[[int], bool] = pid_alive,
) -> dict[str, Any]:
    """The plan: action (ok | start | create | recreate) and why.

    existing is the container as ``<engine> container inspect`` prints it (one object), or
    None when there is none; image_id is the id the wanted image reference has on the host
    (empty when the image is not there yet, e.g. a pull planned under --check).

    A container the engine records as running whose process is gone (its monitor and its
    processes killed at once, as a host crash or an OOM kill of conmon leaves it, with /run
    kept) is recreated: podman then refuses both `exec` ("cannot exec in a stopped
    container") and `start` ("container state improper"); `rm --force` clears it.
    """
    settings = wanted.settings()
    want_hash = settings_hash(settings)
    plan: dict[str, Any] = {
        "engine": wanted.engine,
        "name": wanted.name,
        "image": wanted.image,
        "image_id": normalize_id(image_id),
        "settings_hash": want_hash,
        "missing": missing_sources(wanted),
    }
    if existing is None:
        return {**plan, "action": "create", "reason": f"no container {wanted.name} yet"}
    labels = (existing.get("Config") or {}).get("Labels") or {}
    running_image = normalize_id(existing.get("Image"))
    reasons = []
    if labels.get(LABEL_HASH) != want_hash:
        try:
            old = json.loads(labels.get(LABEL_SETTINGS) or "{}")
        except ValueError:
            old = {}
        changed = _changes(old, settings) if old else ["not made by specfleet (no settings label)"]
        reasons.append("run settings changed: " + "; ".join(changed))
    if not plan["image_id"]:
        reasons.append(f"image {wanted.image} is not on the host yet")
    elif running_image != plan["image_id"]:
        reasons.append(
            f"image changed: runs {running_image[:12] or '?'}, "
            f"{wanted.image} is {plan['image_id'][:12]}"
        )
    state = existing.get("State") or {}
    pid = state.get("Pid")
    if state.get("Running") and isinstance(pid, int) and not alive(pid):
        reasons.append(
            f"container {wanted.name} is recorded as running, but its process {pid} is gone"
        )
    if reasons:
        return {**plan, "action": "recreate", "reason": "; ".join(reasons)}
    if not state.get("Running"):
        return {**plan, "action": "start", "reason": f"container {wanted.name} is not running"}
    return {**plan, "action": "ok", "reason": ""}


def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise SystemExit(
            f"`{' '.join(argv[:4])} ...` failed (rc {proc.returncode}): "
            f"{(proc.stderr or proc.stdout).strip()[-800:]}"
        )
    return proc


def image_id(engine: str, image: str) -> str:
    proc = _run([engine, "image", "inspect", "--format", "{{.Id}}", image], check=False)
    return normalize_id(proc.stdout) if proc.returncode == 0 else ""


def inspect_container(engine: str, name: str) -> Optional[dict[str, Any]]:
    proc = _run([engine, "container", "inspect", name], check=False)
    if proc.returncode != 0:
        return None
    data = json.loads(proc.stdout or "[]")
    return data[0] if data else None


def plan(wanted: Wanted) -> dict[str, Any]:
    return decide(
        inspect_container(wanted.engine, wanted.name), wanted, image_id(wanted.engine, wanted.image)
    )


def ensure(wanted: Wanted) -> dict[str, Any]:
    """Do what the plan says; the result adds ``changed`` and the container's image id."""
    result = plan(wanted)
    if result["action"] != "ok" and not result["image_id"]:
        raise SystemExit(f"image {wanted.image} is not on the host ({wanted.engine} image inspect)")
    if result["action"] in ("create", "recreate") and result["missing"]:
        raise SystemExit(
            "not on the host, so not passed to the container: " + ", ".join(result["missing"])
        )
    if result["action"] == "recreate":
        _run([wanted.engine, "rm", "--force", wanted.name])
    if result["action"] in ("create", "recreate"):
        _run(run_argv(wanted))
    elif result["action"] == "start":
        _run([wanted.engine, "start", wanted.name])
    after = inspect_container(wanted.engine, wanted.name)
    if not after or not (after.get("State") or {}).get("Running"):
        logs = _run([wanted.engine, "logs", "--tail", "20", wanted.name], check=False)
        raise SystemExit(
            f"container {wanted.name} is not running after {result['action']}: "
            f"{(logs.stdout + logs.stderr).strip()[-800:]}"
        )
    return {**result, "changed": result["action"] != "ok"}


# --- the engine `auto` means ------------------------------------------------------------------

# Order of preference when no engine has the image yet: vllm-ascend documents docker only.
ENGINE_ORDER = ("docker", "podman")


def choose_engine(
    installed: list[str], image: str, has_image: Callable[[str], bool]
) -> dict[str, Any]:
    """The engine for ``specfleet_container_engine: auto`` among the installed ones, and why.

    The one that already has `image` wins (an image loaded into docker is invisible to podman,
    which would try to pull it: on an air-gapped host that fails), docker before podman when
    both have it; else docker, as every vllm-ascend document runs it; else podman. engine is ""
    when neither is installed.
    """
    candidates = [e for e in ENGINE_ORDER if e in installed]
    holding = [e for e in candidates if has_image(e)]
    if holding:
        engine = holding[0]
        reason = f"{engine} has the image {image}"
        for other in candidates:
            if other != engine:
                reason += f" ({other} {'has it too' if other in holding else 'has not'})"
    elif not candidates:
        engine, reason = "", "neither docker nor podman is installed"
    else:
        engine = candidates[0]
        reason = f"no installed engine has the image {image} yet; " + (
            "docker is installed (the engine vllm-ascend documents)"
            if engine == "docker"
            else "podman is the only engine installed"
        )
    return {"engine": engine, "reason": reason, "installed": candidates}


def engine_has_image(engine: str, image: str) -> bool:
    return (
        _run([engine, "image", "inspect", "--format", "{{.Id}}", image], check=False).returncode
        == 0
    )


# --- the architecture of a saved image archive --------------------------------------------------

# `uname -m` (ansible_facts architecture, platform.machine()) -> the OCI/Go name images use.
UNAME_TO_OCI = {
    "x86_64": "amd64",
    "amd64": "amd64",
    "aarch64": "arm64",
    "arm64": "arm64",
    "armv7l": "arm",
    "armv6l": "arm",
    "i386": "386",
    "i686": "386",
    "ppc64le": "ppc64le",
    "s390x": "s390x",
    "riscv64": "riscv64",
}


class ArchiveError(Exception):
    """The archive is not a tar of images this reader understands."""


def oci_arch(machine: str) -> str:
    """The image architecture name of a `uname -m` value (unknown names pass through)."""
    return UNAME_TO_OCI.get(machine.strip().lower(), machine.strip().lower())


def _blob_path(digest: str) -> str:
    algo, _, hexpart = str(digest).partition(":")
    return f"blobs/{algo}/{hexpart}"


def archive_architectures(path: str) -> list[str]:
    """The architectures of the images whose configs are in the archive at `path`, sorted.

    Reads both layouts `docker save` and `podman save` write, from any tar tarfile opens
    (plain, gzip, bzip2, xz):

    - docker-archive: manifest.json (a list) -> each entry's Config (``<hex>.json``, or
      ``blobs/sha256/<hex>`` from Docker 25 on) -> ``architecture``;
    - OCI layout (oci-archive, and Docker >= 25, whose tars are both): index.json ->
      manifests -> a nested index's manifests -> the image manifest -> config -> architecture.

    Only images whose config is in the archive count: a multi-platform index may name platforms
    whose content was never saved, and attestation manifests have no architecture.
    """
    try:
        with tarfile.open(path, mode="r:*") as tar:
            archs = _tar_architectures(tar, path)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ArchiveError(f"{path} is not a readable tar archive: {exc}") from None
    if not archs:
        raise ArchiveError(f"{path} names no image configuration with an architecture")
    return sorted(archs)


def _tar_architectures(tar: tarfile.TarFile, path: str) -> set[str]:
    members = {
        (m.name[2:] if m.name.startswith("./") else m.name): m
        for m in tar.getmembers()
        if m.isfile()
    }
    if "manifest.json" not in members and "index.json" not in members:
        raise ArchiveError(
            f"{path} holds neither manifest.json (docker-archive) nor index.json (OCI layout)"
        )

    def read_json(name: str) -> Any:
        member = members.get(name)
        handle = tar.extractfile(member) if member is not None else None
        if handle is None:
            return None
        try:
            return json.loads(handle.read().decode("utf-8"))
        except ValueError:
            return None

    archs: set[str] = set()

    def add_config(name: str) -> None:
        config = read_json(name)
        arch = config.get("architecture") if isinstance(config, dict) else None
        if arch and arch != "unknown":
            archs.add(str(arch))

    def walk(descriptors: Any, depth: int) -> None:
        for desc in descriptors if isinstance(descriptors, list) and depth < 4 else []:
            if not isinstance(desc, dict) or not desc.get("digest"):
                continue
            doc = read_json(_blob_path(desc["digest"]))
            if not isinstance(doc, dict):
                continue  # a platform the index names but the archive does not hold
            if "manifests" in doc:
                walk(doc["manifests"], depth + 1)
            elif isinstance(doc.get("config"), dict) and doc["config"].get("digest"):
                add_config(_blob_path(doc["config"]["digest"]))

    manifest = read_json("manifest.json")
    for entry in manifest if isinstance(manifest, list) else []:
        if isinstance(entry, dict) and entry.get("Config"):
            add_config(str(entry["Config"]))
    index = read_json("index.json")
    if isinstance(index, dict):
        walk(index.get("manifests"), 0)
    return archs


def check_archive_arch(path: str, host_machine: str, image: str = "") -> dict[str, Any]:
    """Compare the archive's architectures with the host's; ``ok`` false with a ``message``
    saying how to save the right one when the host's is not among them."""
    archs = archive_architectures(path)
    host = oci_arch(host_machine)
    result: dict[str, Any] = {"archive": path, "architectures": archs, "host_arch": host}
    if host in archs:
        return {**result, "ok": True, "message": ""}
    ref, out = image or "IMAGE", path.rsplit("/", 1)[-1]
    held = ", ".join(f"linux/{a}" for a in archs)
    return {
        **result,
        "ok": False,
        "message": (
            f"the image archive {path} holds {held} only, but this host is {host} (uname -m"
            f" {host_machine}): a container from it would fail with `exec format error`. On the"
            f" controller, save the {host} image: `docker pull --platform linux/{host} {ref}`, then"
            f" `docker save --platform linux/{host} -o {out} {ref}` (podman: `podman pull --arch"
            f" {host} {ref}`, then `podman save -o {out} {ref}`); an archive of several platforms"
            " that include this host's is accepted too"
        ),
    }


def _env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--env {text!r}: expected NAME=VALUE")
    return key, value


def _wanted(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Wanted:
    try:
        command = json.loads(args.command)
    except ValueError:
        parser.error(f"--command {args.command!r} is not JSON")
    if not isinstance(command, list) or not command:
        parser.error("--command must be a non-empty JSON list")
    try:
        env_json = json.loads(args.env_json)
    except ValueError:
        parser.error(f"--env-json {args.env_json!r} is not JSON")
    if not isinstance(env_json, dict):
        parser.error("--env-json must be a JSON object")
    return Wanted(
        engine=args.engine,
        name=args.name,
        image=args.image,
        devices=args.device,
        mounts=args.mount,
        shm_size=args.shm_size,
        env={**{str(k): str(v) for k, v in env_json.items()}, **dict(args.env)},
        run_args=args.run_arg,
        command=[str(c) for c in command],
        restart=args.restart,
        selinux_enforcing=args.selinux_enforcing,
    )


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specfleet_helpers.host.container",
        description=(
            "Plan (print what would change) or ensure (create, recreate or start) the long-lived "
            "stage container, comparing its image id and a hash of its run settings; choose the "
            "engine `auto` means; check a saved image archive's architecture against the host's."
        ),
    )
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    container_opts = argparse.ArgumentParser(add_help=False)
    container_opts.add_argument(
        "--engine", required=True, help="podman or docker (the CLI to call)"
    )
    container_opts.add_argument("--name", required=True, help="container name")
    container_opts.add_argument("--image", required=True, help="image reference")
    container_opts.add_argument(
        "--device", action="append", default=[], help="HOST[:CONTAINER[:PERMS]]"
    )
    container_opts.add_argument(
        "--mount", action="append", default=[], help="HOST:CONTAINER[:OPTIONS]"
    )
    container_opts.add_argument("--shm-size", default="", help="e.g. 64g")
    container_opts.add_argument(
        "--env", action="append", default=[], type=_env_pair, help="NAME=VALUE"
    )
    container_opts.add_argument(
        "--env-json", default="{}", help="JSON object of more NAME: VALUE pairs"
    )
    container_opts.add_argument("--run-arg", action="append", default=[], help="extra run argument")
    container_opts.add_argument(
        "--command",
        default='["sleep", "infinity"]',
        help="JSON list: the container's command (it must stay running)",
    )
    container_opts.add_argument(
        "--restart",
        default="always",
        help="restart policy (always, unless-stopped, on-failure, no; '' = none)",
    )
    container_opts.add_argument(
        "--selinux-enforcing",
        action="store_true",
        help="SELinux enforces on the host: run with --security-opt=label=disable",
    )
    sub.add_parser("plan", parents=[container_opts], help="print what would change (read-only)")
    sub.add_parser(
        "ensure", parents=[container_opts], help="create, recreate or start the container"
    )
    engine = sub.add_parser(
        "engine",
        help="the engine `auto` means: the one that has the image, else docker, else podman",
    )
    engine.add_argument("--image", required=True, help="image reference")
    engine.add_argument(
        "--installed",
        action="append",
        default=[],
        choices=list(ENGINE_ORDER),
        help="an engine installed on the host (repeat)",
    )
    arch = sub.add_parser(
        "archive-arch",
        help="check that a saved image archive holds an image of the host's architecture",
        description=(
            "Read the architecture(s) of the images in a docker-archive or OCI-layout tar and "
            "compare them with the host's. Prints JSON; exit 1 when the host's architecture is "
            "not among them (the message says how to save the right one), 2 when the archive "
            "cannot be read."
        ),
    )
    arch.add_argument("--archive", required=True, help="the saved image archive (a tar)")
    arch.add_argument(
        "--host-arch", required=True, help="the host's `uname -m` (x86_64, aarch64) or amd64/arm64"
    )
    arch.add_argument("--image", default="", help="image reference, for the message")
    args = parser.parse_args(argv)
    if args.action == "engine":
        result = choose_engine(
            args.installed, args.image, lambda e: engine_has_image(e, args.image)
        )
    elif args.action == "archive-arch":
        try:
            result = check_archive_arch(args.archive, args.host_arch, args.image)
        except ArchiveError as exc:
            print(f"cannot read the image archive's architecture: {exc}", file=sys.stderr)
            return 2
        print(json.dumps(result, sort_keys=True))
        if not result["ok"]:
            print(result["message"], file=sys.stderr)
            return 1
        return 0
    else:
        wanted = _wanted(parser, args)
        result = plan(wanted) if args.action == "plan" else ensure(wanted)
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
