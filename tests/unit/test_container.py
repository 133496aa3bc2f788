"""Tests for specfleet_helpers.host.container: the stage container's settings hash, run arguments
and the plan (ok / start / create / recreate) from what `<engine> container inspect` prints.

The engine itself is exercised for real by tests/integration/test_container_runtime.py.
"""

from __future__ import annotations

import json

import pytest
from specfleet_helpers.host import container
from specfleet_helpers.host.container import Wanted

IMAGE_ID = "04095c3a4d272ef63079e14e26f7c4fe914b152e25ae3aaa2c7ae818cd126748"
OTHER_ID = "a" * 64


def wanted(**overrides) -> Wanted:
    base = {
        "engine": "podman",
        "name": "specfleet",
        "image": "localhost/vllm-ascend:v0.23.0",
        "devices": ["/dev/davinci0", "/dev/davinci_manager"],
        "mounts": ["/srv/sf:/srv/sf", "/usr/local/dcmi:/usr/local/dcmi:ro"],
        "shm_size": "64g",
    }
    return Wanted(**{**base, **overrides})


def inspected(w: Wanted, *, image_id: str = IMAGE_ID, running: bool = True) -> dict:
    """The part of `container inspect` the plan reads, for a container made from w."""
    labels = {}
    for arg in container.run_argv(w):
        if arg.startswith("--label="):
            key, _, value = arg[len("--label=") :].partition("=")
            labels[key] = value
    # Docker prefixes ids with the digest algorithm; Podman does not.
    return {
        "Image": f"sha256:{image_id}",
        "Config": {"Labels": labels},
        "State": {"Running": running},
    }


def test_unchanged_container_is_ok() -> None:
    w = wanted()
    plan = container.decide(inspected(w), w, IMAGE_ID)
    assert plan["action"] == "ok", plan
    assert plan["reason"] == ""
    assert plan["settings_hash"] == container.settings_hash(w.settings())


def test_no_container_is_created() -> None:
    plan = container.decide(None, wanted(), IMAGE_ID)
    assert plan["action"] == "create"
    assert "no container specfleet" in plan["reason"]


def test_a_changed_mount_recreates_and_names_the_mount() -> None:
    old = wanted()
    new = wanted(mounts=[*old.mounts, "/root/.cache:/root/.cache"])
    plan = container.decide(inspected(old), new, IMAGE_ID)
    assert plan["action"] == "recreate"
    assert "mounts +/root/.cache:/root/.cache" in plan["reason"], plan["reason"]
    assert "image" not in plan["reason"]


def test_a_removed_device_recreates_and_names_it() -> None:
    old = wanted()
    new = wanted(devices=["/dev/davinci_manager"])
    plan = container.decide(inspected(old), new, IMAGE_ID)
    assert plan["action"] == "recreate"
    assert "devices -/dev/davinci0" in plan["reason"]


def test_a_new_image_id_recreates() -> None:
    w = wanted()
    plan = container.decide(inspected(w, image_id=OTHER_ID), w, IMAGE_ID)
    assert plan["action"] == "recreate"
    assert f"image changed: runs {OTHER_ID[:12]}" in plan["reason"]
    assert "run settings" not in plan["reason"]


def test_shm_and_run_args_are_settings() -> None:
    w = wanted()
    for changed in (wanted(shm_size="32g"), wanted(run_args=["--runtime=runc"])):
        assert container.decide(inspected(w), changed, IMAGE_ID)["action"] == "recreate"


def test_a_stopped_container_is_started_not_recreated() -> None:
    w = wanted()
    plan = container.decide(inspected(w, running=False), w, IMAGE_ID)
    assert plan["action"] == "start"


def test_a_running_container_whose_process_is_gone_is_recreated() -> None:
    """Its monitor and processes killed at once (a host crash with /run kept, an OOM kill):
    the engine still records it running, and refuses exec and start; recreating clears it."""
    w = wanted()
    gone = {**inspected(w), "State": {"Running": True, "Pid": 4242}}
    plan = container.decide(gone, w, IMAGE_ID, alive=lambda pid: pid != 4242)
    assert plan["action"] == "recreate"
    assert "recorded as running, but its process 4242 is gone" in plan["reason"]
    assert container.decide(gone, w, IMAGE_ID, alive=lambda pid: True)["action"] == "ok"


def test_device_nodes_and_mount_sources_the_host_lacks_are_named(tmp_path) -> None:
    """Never handed to the engine: docker fails a create on a missing --device node and makes
    an empty directory of a missing mount source; ensure refuses to create with them."""
    present = tmp_path / "driver"
    present.mkdir()
    w = wanted(
        devices=["/dev/null:/dev/davinci0", "/dev/ummu"],
        mounts=[f"{present}:/usr/local/Ascend/driver:ro", f"{tmp_path / 'nfs'}:{tmp_path / 'nfs'}"],
    )
    plan = container.decide(None, w, IMAGE_ID)
    assert plan["missing"] == ["/dev/ummu", str(tmp_path / "nfs")]
    assert (
        container.decide(None, wanted(devices=["/dev/null"], mounts=[]), IMAGE_ID)["missing"] == []
    )


def test_a_container_without_labels_is_recreated() -> None:
    foreign = {"Image": IMAGE_ID, "Config": {"Labels": None}, "State": {"Running": True}}
    plan = container.decide(foreign, wanted(), IMAGE_ID)
    assert plan["action"] == "recreate"
    assert "not made by specfleet" in plan["reason"]


def test_missing_image_under_check_is_a_recreate_with_reason() -> None:
    w = wanted()
    plan = container.decide(inspected(w), w, "")
    assert plan["action"] == "recreate"
    assert "is not on the host yet" in plan["reason"]


def test_duplicates_do_not_change_the_hash() -> None:
    a = wanted()
    b = wanted(mounts=[*a.mounts, a.mounts[0]])
    assert container.settings_hash(a.settings()) == container.settings_hash(b.settings())


def test_run_argv_shares_host_namespaces_and_marks_the_inside() -> None:
    w = wanted(env={"FOO": "1"}, run_args=["--runtime=runc"], command=["sleep", "infinity"])
    argv = container.run_argv(w)
    assert argv[:5] == ["podman", "run", "--detach", "--name", "specfleet"]
    # Pids in the run dir and the servers' loopback must mean the same inside and outside.
    assert "--network=host" in argv and "--pid=host" in argv
    assert "--device=/dev/davinci0" in argv
    assert "--volume=/usr/local/dcmi:/usr/local/dcmi:ro" in argv
    assert "--shm-size=64g" in argv
    assert "--env=SPECFLEET_CONTAINER=specfleet" in argv and "--env=FOO=1" in argv
    # Extra run arguments go before the image, the command after it.
    assert argv.index("--runtime=runc") < argv.index(w.image)
    assert argv[-3:] == [w.image, "sleep", "infinity"]
    settings_label = next(a for a in argv if a.startswith(f"--label={container.LABEL_SETTINGS}="))
    assert json.loads(settings_label.split("=", 2)[2]) == w.settings()


@pytest.mark.parametrize(
    ("text", "expected"), [("sha256:abc", "abc"), ("abc\n", "abc"), ("", ""), (None, "")]
)
def test_normalize_id(text, expected) -> None:
    assert container.normalize_id(text) == expected


def test_cli_rejects_a_bad_command(capsys) -> None:
    with pytest.raises(SystemExit):
        container.main(
            ["plan", "--engine=podman", "--name=x", "--image=i", "--command=sleep infinity"]
        )
    assert "is not JSON" in capsys.readouterr().err


def test_cli_help() -> None:
    with pytest.raises(SystemExit) as exc:
        container.main(["--help"])
    assert exc.value.code == 0


def test_cli_plan_passes_env_json_into_the_settings(monkeypatch, capsys) -> None:
    seen = {}

    def fake_plan(w: Wanted) -> dict:
        seen["env"] = w.env
        return {"action": "ok"}

    monkeypatch.setattr(container, "plan", fake_plan)
    argv = ["plan", "--engine=podman", "--name=x", "--image=i", "--env=A=1"]
    container.main([*argv, '--env-json={"B": 2}'])
    assert seen["env"] == {"A": "1", "B": "2"}
    assert json.loads(capsys.readouterr().out) == {"action": "ok"}


# -- podman's pids limit and SELinux: settings of their own ------------------------------------


def test_podman_runs_without_its_2048_pids_limit() -> None:
    """torchrun ranks x dataloader workers x threads pass podman's default of 2048."""
    argv = container.run_argv(wanted(engine="podman"))
    assert "--pids-limit=-1" in argv
    assert argv.index("--pids-limit=-1") < argv.index(wanted().image)
    # docker has no default limit: nothing to lift, and its settings (hash) stay as they were
    docker = wanted(engine="docker")
    assert not [a for a in container.run_argv(docker) if a.startswith("--pids-limit")]
    assert "pids_limit" not in docker.settings()


def test_a_podman_container_made_without_the_pids_limit_is_recreated_naming_it() -> None:
    old = wanted(engine="docker")  # the same settings, minus the pids limit
    plan = container.decide(inspected(old), wanted(engine="podman"), IMAGE_ID)
    assert plan["action"] == "recreate"
    assert 'pids_limit null -> "-1"' in plan["reason"], plan["reason"]


def test_selinux_enforcing_turns_label_separation_off_and_relabels_nothing() -> None:
    w = wanted(selinux_enforcing=True, mounts=["/srv/sf:/srv/sf", "/usr/local/dcmi:/d:ro"])
    argv = container.run_argv(w)
    assert "--security-opt=label=disable" in argv
    # no :z/:Z: it would relabel the work root and the cache on the host, and must never
    # touch system paths (the driver, dcmi, npu-smi)
    volumes = [a for a in argv if a.startswith("--volume=")]
    assert volumes == ["--volume=/srv/sf:/srv/sf", "--volume=/usr/local/dcmi:/d:ro"]
    assert not [a for a in container.run_argv(wanted()) if a.startswith("--security-opt")]


def test_selinux_turning_enforcing_recreates_naming_it() -> None:
    old = wanted()
    plan = container.decide(inspected(old), wanted(selinux_enforcing=True), IMAGE_ID)
    assert plan["action"] == "recreate"
    assert 'security_opt null -> ["label=disable"]' in plan["reason"], plan["reason"]
    same = wanted(selinux_enforcing=True)
    assert container.decide(inspected(same), same, IMAGE_ID)["action"] == "ok"


def test_cli_passes_selinux_enforcing(monkeypatch, capsys) -> None:
    seen = {}
    monkeypatch.setattr(container, "plan", lambda w: seen.update(w=w) or {"action": "ok"})
    container.main(["plan", "--engine=docker", "--name=x", "--image=i", "--selinux-enforcing"])
    assert seen["w"].selinux_enforcing is True
    assert "security_opt" in seen["w"].settings()


# -- the engine `auto` means -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("installed", "holding", "engine", "said"),
    [
        # the image loaded into podman: docker would not see it (and would pull)
        (["podman", "docker"], {"podman"}, "podman", "podman has the image"),
        (["docker", "podman"], {"docker"}, "docker", "docker has the image"),
        (["docker", "podman"], {"docker", "podman"}, "docker", "podman has it too"),
        # nobody has it yet: docker, as vllm-ascend documents
        (["podman", "docker"], set(), "docker", "the engine vllm-ascend documents"),
        (["podman"], set(), "podman", "podman is the only engine installed"),
        (["docker"], set(), "docker", "docker is installed"),
        ([], set(), "", "neither docker nor podman is installed"),
    ],
)
def test_choose_engine(installed, holding, engine, said) -> None:
    asked = []

    def has_image(e: str) -> bool:
        asked.append(e)
        return e in holding

    choice = container.choose_engine(installed, "quay.io/ascend/vllm-ascend:v0.23.0", has_image)
    assert choice["engine"] == engine, choice
    assert said in choice["reason"], choice["reason"]
    assert set(asked) == set(installed), "only installed engines are asked"


def test_cli_engine_asks_each_installed_engine(monkeypatch, capsys) -> None:
    asked = []
    monkeypatch.setattr(
        container, "engine_has_image", lambda e, image: asked.append((e, image)) or e == "podman"
    )
    container.main(["engine", "--image=img", "--installed=podman", "--installed=docker"])
    out = json.loads(capsys.readouterr().out)
    assert out["engine"] == "podman"
    assert sorted(asked) == [("docker", "img"), ("podman", "img")]
