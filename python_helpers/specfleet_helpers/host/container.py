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
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any, Optional

LABEL_HASH = "specfleet.settings-sha256"
LABEL_SETTINGS = "specfleet.settings"
LABEL_IMAGE_REF = "specfleet.image-ref"
# Set in the container: the stage environment wrapper runs inside when it sees it.
INSIDE_ENV = "SPECFLEET_CONTAINER"
# Namespaces that are not settings: the pid files and the loopback servers depend on them.
FIXED_ARGS = ("--network=host", "--pid=host")


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

    def settings(self) -> dict[str, Any]:
        """The run settings that decide whether an existing container still fits.

        Devices and mounts keep their given order (it is the order of the run arguments), but
        duplicates are dropped. The image reference is not a setting: the image id is compared
        on its own, so a retag of the same image does not recreate anything.
        """
        return {
            "devices": list(dict.fromkeys(self.devices)),
            "mounts": list(dict.fromkeys(self.mounts)),
            "shm_size": self.shm_size,
            "env": {INSIDE_ENV: self.name, **dict(sorted(self.env.items()))},
            "run_args": list(self.run_args),
            "command": list(self.command),
            "restart": self.restart,
            "fixed": list(FIXED_ARGS),
        }


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


def decide(existing: Optional[dict[str, Any]], wanted: Wanted, image_id: str) -> dict[str, Any]:
    """The plan: action (ok | start | create | recreate) and why.

    existing is the container as ``<engine> container inspect`` prints it (one object), or
    None when there is none; image_id is the id the wanted image reference has on the host
    (empty when the image is not there yet, e.g. a pull planned under --check).
    """
    settings = wanted.settings()
    want_hash = settings_hash(settings)
    plan: dict[str, Any] = {
        "engine": wanted.engine,
        "name": wanted.name,
        "image": wanted.image,
        "image_id": normalize_id(image_id),
        "settings_hash": want_hash,
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
    if reasons:
        return {**plan, "action": "recreate", "reason": "; ".join(reasons)}
    if not (existing.get("State") or {}).get("Running"):
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


def _env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--env {text!r}: expected NAME=VALUE")
    return key, value


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specfleet_helpers.host.container",
        description=(
            "Plan (print what would change) or ensure (create, recreate or start) the long-lived "
            "stage container, comparing its image id and a hash of its run settings."
        ),
    )
    parser.add_argument("action", choices=["plan", "ensure"])
    parser.add_argument("--engine", required=True, help="podman or docker (the CLI to call)")
    parser.add_argument("--name", required=True, help="container name")
    parser.add_argument("--image", required=True, help="image reference")
    parser.add_argument("--device", action="append", default=[], help="HOST[:CONTAINER[:PERMS]]")
    parser.add_argument("--mount", action="append", default=[], help="HOST:CONTAINER[:OPTIONS]")
    parser.add_argument("--shm-size", default="", help="e.g. 64g")
    parser.add_argument("--env", action="append", default=[], type=_env_pair, help="NAME=VALUE")
    parser.add_argument("--env-json", default="{}", help="JSON object of more NAME: VALUE pairs")
    parser.add_argument("--run-arg", action="append", default=[], help="extra run argument")
    parser.add_argument(
        "--command",
        default='["sleep", "infinity"]',
        help="JSON list: the container's command (it must stay running)",
    )
    parser.add_argument(
        "--restart",
        default="always",
        help="restart policy (always, unless-stopped, on-failure, no; '' = none)",
    )
    args = parser.parse_args(argv)
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
    wanted = Wanted(
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
    )
    result = plan(wanted) if args.action == "plan" else ensure(wanted)
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
