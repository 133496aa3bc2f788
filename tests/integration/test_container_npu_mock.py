"""npu_env and speculators_install in the NPU-shaped MOCK container, for real through Ansible.

Three inventory hosts on this machine, one per hardware group, each with its own work root
and its own stage container (specfleet_runtime: container) from the MOCK vllm-ascend v0.23.0
image of its group that scripts/test-images builds (Python 3.12 at the image's path, the
CANN env scripts, the preinstalled stack as metadata, torch/torch_npu stubs; no NPU):

  a2-mock    atlas-a2    podman  the runbook's one-card host (910B4)          image v0.23.0
  a3-mock    atlas-a3    docker  16 dies (8 x Ascend910), all mounted         image v0.23.0-a3
  a950-mock  ascend-950  podman  3 x 950PR, two in Alarm: uses device 2 only  image v0.23.0-a5

(docker falls back to podman when no dockerd answers, unless SPECFLEET_REQUIRE_CONTAINERS=1,
as CI sets.) As on a real fleet, npu-smi is not in the image: each host's MOCK npu-smi
(printing a recorded output, tests/fixtures/npu-smi) is bind-mounted at /usr/local/bin/npu-smi,
the NPU devices are MOCK devices (/dev/null mounted as /dev/davinciN) and the driver files are
MOCK files at the driver's paths. speculators comes from its git source: a local repository of
speculators 0.9.0 tagged v0.9.0 (test_speculators_sources builds it from the release sdist),
installed with the image's constraints; pip reaches the package index from the container.

  1. first run: each container is created from its group's image with the host's devices;
     npu_env passes inside it; speculators_install clones the tag into the work root and
     installs it editable into the venv over the image's Python without changing any
     preinstalled distribution, then stops at `speculators --version`: the MOCK torch is a
     stub, so the real speculators cannot import (the one step a MOCK image cannot pass).
  2. the same run again, npu_env alone (--tags npu_env; it owns the containers): every
     container is kept (same id, same start time), npu_env changes nothing.
  3. a2-mock's image reference now names a rebuilt image: only its container is recreated
     (the plan names the image change), and speculators_install runs there with the new
     image id in its inputs; the other two hosts keep their containers.

About 6 minutes here (pip fetches speculators' dependencies once into a cache the three
containers share). Needs root, podman (+ dockerd) and the images: make test-images.

Run explicitly:
    .venv/bin/python -m pytest -q tests/integration/test_container_npu_mock.py
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import MOCK_DISTRIBUTIONS, free_port
from siteruns import LOW_HOST_FLOORS
from test_speculators_sources import TAG, run, speculators_git_repo  # noqa: F401 - a fixture

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TEST_IMAGES = REPO / "scripts" / "test-images"
PLAYBOOK = REPO / "playbooks" / "provision.yml"
NPU_SMI_FIXTURES = REPO / "tests" / "fixtures" / "npu-smi"
MOCK_REPO = "localhost/specfleet-mock/vllm-ascend"
MOCK_VERSION = "v0.23.0"
IMAGE_PYTHON = "/usr/local/python3.12.13/bin/python3"
# First run: pip resolves and downloads speculators' dependencies for three hosts.
RUN_TIMEOUT_S = 40 * 60
STAGE = "speculators_install"


@dataclass
class MockHost:
    """One inventory host: an Ascend server of a group, as its stage container sees it."""

    name: str
    group: str
    fixture: str
    # npu-smi device ids made available (specfleet_npu_devices); `all`: every device listed
    devices: list[int] | str
    device_count: int
    tag_suffix: str
    flavour: str
    # what the MOCK torch_npu reports as get_soc_version() (vllm-ascend: 220-225 A2, 250-255
    # A3, 260 950)
    soc_version: int
    engine: str
    tmp: Path = field(default=Path())
    token: str = ""
    ports: list[int] = field(default_factory=list)

    @property
    def root(self) -> Path:
        return self.tmp / "root"

    @property
    def container(self) -> str:
        return f"sfmock-{self.token}-{self.name}"

    @property
    def image(self) -> str:
        # A reference of this test only (same tag, own repository), so that step 3 can point
        # it at another image without touching the shared MOCK tags.
        repo = f"localhost/specfleet-mock-test-{self.token}/vllm-ascend"
        return f"{repo}:{MOCK_VERSION}{self.tag_suffix}"

    @property
    def shared_image(self) -> str:
        return f"{MOCK_REPO}:{MOCK_VERSION}{self.tag_suffix}"

    @property
    def npu_smi(self) -> Path:
        return self.tmp / "bin" / "npu-smi"

    @property
    def mounted_ids(self) -> list[int]:
        """The devices made available: mounted into the container, numbered 0.. there."""
        return list(range(self.device_count)) if self.devices == "all" else list(self.devices)

    @property
    def used_ids(self) -> list[int]:
        """The first of them the stages use: serve's three servers measured together where
        three are made available (a device each), else one (train's one rank, TP 1 servers)."""
        mounted = self.mounted_ids
        return mounted[: 3 if len(mounted) >= 3 else 1]


def docker_cli() -> str:
    return "/usr/bin/docker" if Path("/usr/bin/docker").exists() else "docker"


def engine_cli(engine: str) -> str:
    return docker_cli() if engine == "docker" else "podman"


def docker_answers() -> bool:
    if not shutil.which(docker_cli()):
        return False
    proc = subprocess.run(
        [docker_cli(), "version", "--format", "{{.Server.Version}}"],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    return proc.returncode == 0


def inspect(host: MockHost) -> dict[str, Any]:
    out = run([engine_cli(host.engine), "container", "inspect", host.container]).stdout
    return json.loads(out)[0]


def in_container(host: MockHost, *argv: str) -> str:
    return run([engine_cli(host.engine), "exec", host.container, *argv]).stdout


@dataclass
class Play:
    rc: int
    stdout: str
    events: list[dict[str, Any]]
    stats: dict[str, dict[str, int]]
    started: float
    seconds: float

    def changed_tasks(self, host: str, role: str) -> list[str]:
        return [
            e["event_data"].get("task", "")
            for e in self.events
            if e.get("event") == "runner_on_ok"
            and e["event_data"].get("host") == host
            and e["event_data"].get("role") == role
            and e["event_data"].get("res", {}).get("changed")
        ]

    def task_results(self, host: str, task: str) -> list[dict[str, Any]]:
        return [
            e["event_data"].get("res", {})
            for e in self.events
            if e.get("event") in ("runner_on_ok", "runner_on_failed")
            and e["event_data"].get("host") == host
            and e["event_data"].get("task") == task
        ]

    def failed_hosts(self) -> set[str]:
        return set(self.stats.get("failures") or {}) | set(self.stats.get("dark") or {})


class Fleet:
    """The three MOCK hosts, their inventory and the plays run against them."""

    def __init__(self, tmp: Path, hosts: list[MockHost], git_repo: Path) -> None:
        self.tmp = tmp
        self.hosts = {h.name: h for h in hosts}
        self.git_repo = git_repo
        self.cache = tmp / "cache"
        (self.cache / "pip").mkdir(parents=True)
        self.plays: dict[str, Play] = {}
        self.containers: dict[str, dict[str, dict[str, Any]]] = {}
        for host in hosts:
            self._dress(host)

    def _dress(self, host: MockHost) -> None:
        """MOCK npu-smi and driver files for the host (its container mounts them)."""
        host.npu_smi.parent.mkdir(parents=True)
        run(
            [
                str(TEST_IMAGES),
                "mock-npu-smi",
                str(NPU_SMI_FIXTURES / host.fixture),
                str(host.npu_smi),
            ]
        )
        driver = host.tmp / "driver"
        (driver / "lib64").mkdir(parents=True)
        (driver / "dcmi").mkdir()
        (driver / "lib64" / "MOCK").write_text(
            "MOCK of the Ascend driver's lib64 (no driver here)\n"
        )
        (driver / "version.info").write_text("Version=MOCK (specfleet test, no driver)\n")
        (driver / "ascend_install.info").write_text("Driver_Install_Path_Param=MOCK\n")

    def hostvars(self, host: MockHost) -> dict[str, Any]:
        driver = host.tmp / "driver"
        devices = [f"/dev/null:/dev/davinci{i}" for i in host.mounted_ids] + [
            f"/dev/null:{d}" for d in ("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc")
        ]
        return {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "specfleet_root": str(host.root),
            "specfleet_accelerator": "npu",
            "specfleet_runtime": "container",
            "specfleet_container_engine": host.engine,
            "specfleet_container_image": host.image,
            "specfleet_container_name": host.container,
            "specfleet_npu_devices": host.devices,
            # the host's npu-smi; the container sees it at the driver's path and at this one
            "npu_env_npu_smi": str(host.npu_smi),
            "npu_env_container_devices": devices,
            "npu_env_container_npu_mounts": [
                f"{driver / 'dcmi'}:/usr/local/dcmi:ro",
                f"{host.npu_smi}:/usr/local/bin/npu-smi:ro",
                f"{host.npu_smi}:{host.npu_smi}:ro",
                f"{driver / 'lib64'}:/usr/local/Ascend/driver/lib64:ro",
                f"{driver / 'version.info'}:/usr/local/Ascend/driver/version.info:ro",
                f"{driver / 'ascend_install.info'}:/etc/ascend_install.info:ro",
            ],
            "npu_env_container_cache_dir": str(self.cache),
            "npu_env_container_mounts": [
                f"{host.root}:{host.root}",
                f"{self.cache}:{self.cache}",
                f"{self.git_repo}:{self.git_repo}:ro",
                # pip's cache, shared: the three hosts download each wheel once
                f"{self.cache / 'pip'}:/root/.cache/pip",
            ],
            # the MOCK torch counts what the container was given (a real torch_npu sees the
            # mounted devices); a tmpfs of 64 GB is not what this machine should promise
            "npu_env_container_run_args": [
                f"--env=MOCK_NPU_COUNT={len(host.mounted_ids)}",
                f"--env=MOCK_NPU_SOC_VERSION={host.soc_version}",
            ],
            "npu_env_container_shm_size": "1g",
            # HCCL's ports reserved in this machine's network namespace (harmless), kept across
            # reboots in a file of the test's, not /etc.
            "npu_env_hccl_sysctl_file": str(host.tmp / "sysctl.d" / "60-specfleet-hccl-ports.conf"),
            "speculators_install_source": "git",
            "speculators_install_git_repo": self.git_repo.as_uri(),
            "speculators_install_git_ref": TAG,
            **LOW_HOST_FLOORS,
            "specfleet_hidden_states_port": host.ports[0],
            "specfleet_serve_port": host.ports[1],
            "specfleet_data_port": host.ports[2],
        }

    def inventory(self) -> Path:
        groups: dict[str, Any] = {}
        for host in self.hosts.values():
            groups.setdefault(host.group, {"hosts": {}})["hosts"][host.name] = self.hostvars(host)
        path = self.tmp / "inventory.yml"
        path.write_text(yaml.safe_dump({"all": {"children": groups}}, sort_keys=True))
        return path

    def play(self, label: str, cmdline: str | None = None) -> Play:
        import ansible_runner

        private = self.tmp / f"runner-{label}"
        private.mkdir()
        envvars = {
            "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_FORKS": "3",
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        }
        started, clock = time.time(), time.monotonic()
        runner = ansible_runner.run(
            private_data_dir=str(private),
            project_dir=str(REPO),
            playbook=str(PLAYBOOK),
            inventory=str(self.inventory()),
            envvars=envvars,
            cmdline=cmdline,
            timeout=RUN_TIMEOUT_S,
            quiet=True,
        )
        play = Play(
            rc=runner.rc,
            stdout=runner.stdout.read() if runner.stdout else "",
            events=list(runner.events),
            stats=runner.stats or {},
            started=started,
            seconds=time.monotonic() - clock,
        )
        assert runner.status != "timeout", f"{label}: timed out\n{play.stdout[-4000:]}"
        self.plays[label] = play
        self.containers[label] = {name: inspect(h) for name, h in self.hosts.items()}
        return play

    def require(self, label: str) -> Play:
        if label not in self.plays:
            pytest.skip(f"needs step {label}, which did not run")
        return self.plays[label]


def hosts_for_this_machine(token: str) -> list[MockHost]:
    require = os.environ.get("SPECFLEET_REQUIRE_CONTAINERS") == "1"
    if not shutil.which("podman"):
        if require:
            pytest.fail("podman is not installed: make test-images")
        pytest.skip("podman is not installed: make test-images (root)")
    second = "docker" if docker_answers() else "podman"
    if second != "docker" and require:
        pytest.fail("no dockerd answers: scripts/test-images dockerd start")
    return [
        MockHost(
            "a2-mock",
            "atlas-a2",
            "a2_910b4_1npu_idle_26.0.rc1_container_pid_col.txt",
            "all",
            1,
            "",
            "a2",
            224,
            "podman",
        ),
        MockHost(
            "a3-mock",
            "atlas-a3",
            "a3_ascend910_8npu_16die_idle_24.1.rc3.5.txt",
            "all",
            16,
            "-a3",
            "a3",
            250,
            second,
        ),
        MockHost(
            "a950-mock",
            "ascend-950",
            "950pr_3npu_2alarm_2proc_25.7.rc1.txt",
            [2],
            3,
            "-a5",
            "a5",
            260,
            "podman",
        ),
    ]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, speculators_git_repo: Path) -> Any:  # noqa: F811
    if os.geteuid() != 0:
        pytest.skip("needs root (rootful podman/docker, as scripts/test-images builds for)")
    token = secrets.token_hex(3)
    hosts = hosts_for_this_machine(token)
    engines = sorted({h.engine for h in hosts})
    build = [str(TEST_IMAGES), "build", *[f"--engine={e}" for e in engines], "npu-mock"]
    run(build, timeout=1800)
    tmp = tmp_path_factory.mktemp("container_npu_mock")
    for host in hosts:
        host.tmp = tmp / host.name
        host.tmp.mkdir()
        host.token = token
        host.ports = [free_port(), free_port(), free_port()]
        run([engine_cli(host.engine), "tag", host.shared_image, host.image])
    fleet = Fleet(tmp, hosts, speculators_git_repo)
    yield fleet
    print("\ncontainer NPU mock, wall time per play:")
    for label, play in fleet.plays.items():
        print(f"  {label:<18} {play.seconds:7.1f}s  rc={play.rc}")
    for host in hosts:
        cli = engine_cli(host.engine)
        subprocess.run([cli, "rm", "--force", host.container], capture_output=True, check=False)
        subprocess.run([cli, "rmi", host.image], capture_output=True, check=False)
    rebuilt = f"localhost/specfleet-mock-test-{token}/rebuilt:latest"
    subprocess.run(["podman", "rmi", rebuilt], capture_output=True, check=False)


def read_json(path: Path) -> dict[str, Any]:
    assert path.is_file(), f"{path} is missing"
    return json.loads(path.read_text())


def iso_seconds(text: str) -> int:
    return int(
        datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()
    )


def image_id(host: MockHost, ref: str) -> str:
    out = run([engine_cli(host.engine), "image", "inspect", "--format", "{{.Id}}", ref]).stdout
    return out.strip().removeprefix("sha256:")


# -- 1. first run ----------------------------------------------------------------------------


def test_1_containers_run_the_group_images_with_the_used_devices(fleet: Fleet) -> None:
    play = fleet.play("1-first")
    for name, host in fleet.hosts.items():
        info = fleet.containers["1-first"][name]
        assert info["State"]["Running"], (name, info["State"])
        assert info["Image"].removeprefix("sha256:") == image_id(host, host.shared_image), name
        assert in_container(host, "cat", "/usr/local/Ascend/MOCK-FLAVOUR").strip() == host.flavour
        davinci = in_container(host, "sh", "-c", "ls /dev | grep -E '^davinci[0-9]+$' || true")
        assert sorted(davinci.split()) == sorted(f"davinci{i}" for i in host.mounted_ids), name
        # the host's npu-smi at the driver's path, printing the host's recorded output
        recorded = (NPU_SMI_FIXTURES / host.fixture).read_text()
        assert in_container(host, "/usr/local/bin/npu-smi", "info").rstrip() == recorded.rstrip()
        assert host.root.is_dir()
    failed = play.failed_hosts()
    assert failed == set(fleet.hosts), (
        f"expected every host to stop at `speculators --version` (MOCK torch); failed: {failed}\n"
        f"{play.stdout[-6000:]}"
    )


def test_1_npu_env_passed_inside_each_container(fleet: Fleet) -> None:
    fleet.require("1-first")
    for name, host in fleet.hosts.items():
        assert not (host.root / "state" / "npu_env.failed.json").exists(), read_json(
            host.root / "state" / "npu_env.failed.json"
        )["error"]
        state = read_json(host.root / "state" / "npu_env.json")
        assert (state["profile"], state["runtime"]) == ("npu", "container"), (name, state)
        assert state["hardware_family"] == host.group, (name, state)
        assert state["container"]["name"] == host.container, (name, state["container"])
        assert state["container"]["image_id"] == image_id(host, host.image), name
        # measured inside the image: its interpreter and the MOCK stack, the devices mounted
        stack = state["stack"]
        assert stack["executable"] == IMAGE_PYTHON, (name, stack)
        assert stack["python"].startswith("3.12."), (name, stack)
        assert stack["versions"]["torch_npu"] == MOCK_DISTRIBUTIONS["torch_npu"], (name, stack)
        assert stack["npu_count"] == len(host.mounted_ids), (name, stack)
        assert state["npu"]["available_device_ids"] == host.mounted_ids, (name, state["npu"])
        assert state["npu"]["used_device_ids"] == host.used_ids, (name, state["npu"])
        # what the container calls them: 0.. in the order of their ids (a950-mock's device 2 is 0)
        assert state["npu"]["stage_device_ids"] == list(range(len(host.used_ids))), name


def test_1_speculators_install_ran_in_the_container_and_kept_the_image_stack(fleet: Fleet) -> None:
    fleet.require("1-first")
    probe = (
        "import json, sys\n"
        "from importlib import metadata\n"
        "names = sys.argv[1:]\n"
        "print(json.dumps({n: metadata.version(n) for n in names}))\n"
    )
    for name, host in fleet.hosts.items():
        failure = read_json(host.root / "state" / f"{STAGE}.failed.json")
        assert "speculators --version" in failure["error"], (name, failure["error"])
        assert "No module named" in "\n".join(failure["log_tail"]), (name, failure["log_tail"])
        venv_python = str(host.root / "venv" / "bin" / "python")
        # the stage Python is a venv over the image's interpreter, on the work root
        cfg = (host.root / "venv" / "pyvenv.cfg").read_text()
        assert f"home = {Path(IMAGE_PYTHON).parent}" in cfg, (name, cfg)
        assert "include-system-site-packages = true" in cfg, (name, cfg)
        versions = json.loads(
            in_container(host, venv_python, "-c", probe, *MOCK_DISTRIBUTIONS, "speculators")
        )
        assert versions.pop("speculators") == "0.9.0", name
        assert versions == MOCK_DISTRIBUTIONS, f"{name}: a preinstalled distribution changed"
        show = in_container(host, venv_python, "-m", "pip", "show", "speculators")
        assert f"Editable project location: {host.root}" in show, (name, show)
        src = show.split("Editable project location: ", 1)[1].splitlines()[0]
        described = in_container(host, "git", "-C", src, "describe", "--tags").strip()
        assert described == TAG, name


# -- 2. unchanged ----------------------------------------------------------------------------


def test_2_unchanged_keeps_every_container(fleet: Fleet) -> None:
    fleet.require("1-first")
    # npu_env alone: it owns the containers. speculators_install, which stopped where the
    # MOCK image stops it, would only install the same stack three times again (step 3 shows
    # it redone in a recreated container).
    play = fleet.play("2-again", "--tags npu_env")
    for name in fleet.hosts:
        before = fleet.containers["1-first"][name]
        after = fleet.containers["2-again"][name]
        assert after["Id"] == before["Id"], f"{name}: an unchanged run recreated its container"
        assert after["State"]["StartedAt"] == before["State"]["StartedAt"], name
        assert play.changed_tasks(name, "npu_env") == [], (
            name,
            play.changed_tasks(name, "npu_env"),
        )


# -- 3. a changed image ----------------------------------------------------------------------


# A changed stage container setting recreating the container (and only on a change) runs in CI
# through test_container_runtime (a mount added); this image change across the three hosts is
# in make test-reliability's budget.
@pytest.mark.slow
def test_3_changed_image_recreates_only_that_container(fleet: Fleet) -> None:
    fleet.require("2-again")
    a2 = fleet.hosts["a2-mock"]
    rebuilt = f"localhost/specfleet-mock-test-{a2.token}/rebuilt:latest"
    run(
        ["podman", "build", "--network=host", "-t", rebuilt, "-f", "-", str(a2.tmp)],
        input=f"FROM {a2.shared_image}\nLABEL org.specfleet.test.rebuilt={a2.token}\n",
    )
    run(["podman", "tag", rebuilt, a2.image])
    new_id = image_id(a2, a2.image)
    play = fleet.play("3-new-image")
    before, after = fleet.containers["2-again"], fleet.containers["3-new-image"]
    assert after["a2-mock"]["Id"] != before["a2-mock"]["Id"], "a2-mock: new image, same container"
    assert after["a2-mock"]["Image"].removeprefix("sha256:") == new_id
    plans = [
        r.get("msg", "")
        for r in play.task_results("a2-mock", "Show the plan for the stage container")
    ]
    assert any("image changed" in p for p in plans), plans
    for name in ("a3-mock", "a950-mock"):
        assert after[name]["Id"] == before[name]["Id"], (
            f"{name}: recreated, its image did not change"
        )
    # speculators_install ran again, in the new container, and stopped where it stops
    failure = read_json(a2.root / "state" / f"{STAGE}.failed.json")
    assert iso_seconds(failure["time"]) >= int(play.started), failure
    assert "speculators --version" in failure["error"], failure["error"]
