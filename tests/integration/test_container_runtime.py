"""The container runtime for real, with Podman on this machine: provision.yml's npu_env brings
up the stage container from a local Debian image, leaves it alone when nothing changed,
recreates it when a mount changes (and says so under --check first), and what runs through
run/specfleet-env runs inside it, where a stage's timeout and stop still reach every process.

CPU profile (no NPU here). The images are scripts/test-images' (`make test-images`); without
podman or an image the tests skip. The molecule
`container` scenario runs the whole pipeline in the container; this file is the quick check.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from siteruns import LOW_HOST_FLOORS, free_port

pytestmark = pytest.mark.integration

STAGE_RUN = "specfleet_helpers.host.stage_run"
REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = REPO / "playbooks" / "provision.yml"
HOST = "localhost"
# Images with /usr/bin/python3.11 (the CPU profile's check and the helpers run inside).
IMAGES = (
    "localhost/specfleet-test/cpu:bookworm",
    "localhost/specfleet-test/bookworm:latest",
)
CREATE_TASK = "Create, recreate or start the stage container"
PLAN_TASK = "Show the plan for the stage container"


def podman(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=check)


def local_image() -> str | None:
    if shutil.which("podman") is None:
        return None
    for image in IMAGES:
        if podman("image", "exists", image, check=False).returncode == 0:
            return image
    return None


IMAGE = local_image()
if IMAGE is None:
    pytest.skip(
        f"needs podman and one of {', '.join(IMAGES)} (scripts/test-images build)",
        allow_module_level=True,
    )


def docker_ready() -> bool:
    """Docker's daemon answers and has the image (scripts/test-images dockerd start; build)."""
    if shutil.which("docker") is None:
        return False
    info = subprocess.run(["docker", "info"], capture_output=True, text=True)
    found = subprocess.run(["docker", "image", "inspect", IMAGES[0]], capture_output=True)
    return info.returncode == 0 and found.returncode == 0


class ContainerHost:
    """localhost as a host of the container runtime, with its work root under tmp_path."""

    def __init__(self, tmp: Path, engine: str = "podman", image: str | None = IMAGE) -> None:
        self.tmp = tmp
        self.engine = engine
        self.image = image
        self.root = tmp / "root"
        self.cache = tmp / "cache"
        self.name = f"specfleet-test-{uuid.uuid4().hex[:8]}"
        self.runs = 0

    @property
    def wrapper(self) -> Path:
        return self.root / "run" / "specfleet-env"

    def host_vars(self, extra: dict[str, Any]) -> dict[str, Any]:
        return {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "specfleet_root": str(self.root),
            "specfleet_accelerator": "cpu",
            "specfleet_runtime": "container",
            "specfleet_container_engine": self.engine,
            "specfleet_container_image": self.image,
            "specfleet_container_name": self.name,
            "specfleet_container_python": "/usr/bin/python3",
            "npu_env_container_cache_dir": str(self.cache),
            "npu_env_container_shm_size": "256m",
            **LOW_HOST_FLOORS,
            "specfleet_hidden_states_port": 18701,
            "specfleet_serve_port": 18702,
            "specfleet_data_port": 18703,
            **extra,
        }

    def play(
        self, *, check: bool = False, playbook: Path = PLAYBOOK, ok: bool = True, **extra: Any
    ):
        import ansible_runner
        import yaml

        self.runs += 1
        inventory = self.tmp / f"inventory-{self.runs}.yml"
        content = {"all": {"hosts": {HOST: self.host_vars(extra)}}}
        inventory.write_text(yaml.safe_dump(content))
        data_dir = self.tmp / f"runner-{self.runs}"
        data_dir.mkdir()
        runner = ansible_runner.run(
            private_data_dir=str(data_dir),
            project_dir=str(REPO),
            playbook=str(playbook),
            inventory=str(inventory),
            tags="npu_env,probe",
            skip_tags="speculators_install",
            cmdline="--check" if check else None,
            envvars={
                "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
                "ANSIBLE_NOCOLOR": "1",
                "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            },
            timeout=900,
            quiet=True,
        )
        stdout = runner.stdout.read() if runner.stdout else ""
        stats = runner.stats or {}
        if ok:
            assert runner.status == "successful", f"play failed: {stats}\n{stdout[-5000:]}"
        return runner, stats, stdout

    def container_id(self) -> str:
        argv = [self.engine, "container", "inspect", "--format", "{{.Id}}", self.name]
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()

    def state(self) -> dict[str, Any]:
        return json.loads((self.root / "state" / "npu_env.json").read_text())


def task_events(runner, task: str) -> list[dict[str, Any]]:
    return [
        e["event_data"]
        for e in runner.events
        if e.get("event") in ("runner_on_ok", "runner_on_skipped")
        and e["event_data"].get("task") == task
    ]


def plan_message(runner) -> str:
    return " ".join(str(e["res"].get("msg", "")) for e in task_events(runner, PLAN_TASK))


def container_pid(pid: int, name: str) -> bool:
    """True when pid runs inside the container (its cgroup names the container's id)."""
    cid = podman("container", "inspect", "--format", "{{.Id}}", name).stdout.strip()
    try:
        return cid in Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return False


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory):
    h = ContainerHost(tmp_path_factory.mktemp("container-runtime"))
    yield h
    podman("rm", "--force", h.name, check=False)


def test_converge_is_idempotent_and_a_mount_change_recreates(host: ContainerHost) -> None:
    runner, stats, _ = host.play()
    created = [e for e in task_events(runner, CREATE_TASK) if e.get("res", {}).get("changed")]
    assert created, "the first run must create the container"
    assert f"create: no container {host.name} yet" in plan_message(runner)
    first_id = host.container_id()
    state = host.state()
    assert state["runtime"] == "container"
    assert state["container"]["engine"] == "podman"
    assert state["container"]["image"] == IMAGE
    # The CPU profile's Python was checked inside the container (the image's python3.11).
    args = podman("container", "inspect", "--format", "{{json .Config.Env}}", host.name).stdout
    assert f"SPECFLEET_CONTAINER={host.name}" in args

    runner, stats, _ = host.play()
    assert stats["changed"].get(HOST, 0) == 0, f"second run changed something: {stats}"
    assert "up to date" in plan_message(runner)
    assert host.container_id() == first_id, "an unchanged container must not be recreated"

    extra_dir = host.tmp / "extra"
    extra_dir.mkdir()
    mounts = [f"{host.root}:{host.root}", f"{host.cache}:{host.cache}", f"{extra_dir}:/extra:ro"]
    runner, stats, _ = host.play(check=True, npu_env_container_mounts=mounts)
    assert f"would recreate: run settings changed: mounts +{extra_dir}:/extra:ro" in plan_message(
        runner
    ), plan_message(runner)
    assert host.container_id() == first_id, "--check must not recreate the container"

    runner, stats, _ = host.play(npu_env_container_mounts=mounts)
    assert f"recreate: run settings changed: mounts +{extra_dir}:/extra:ro" in plan_message(runner)
    assert host.container_id() != first_id
    assert host.state()["container"]["settings_sha256"] != state["container"]["settings_sha256"]
    runner, stats, _ = host.play(npu_env_container_mounts=mounts)
    assert stats["changed"].get(HOST, 0) == 0, f"run after the recreation changed: {stats}"


def test_wrapper_runs_scripts_and_commands_inside(host: ContainerHost) -> None:
    if not host.wrapper.exists():
        host.play()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(host.tmp)}
    out = subprocess.run(
        [str(host.wrapper), "sh", "-c", 'echo "$SPECFLEET_CONTAINER $PYTHONPATH"; exit 3'],
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 3, out.stderr
    assert out.stdout.split() == [host.name, f"{host.root}/lib/specfleet_helpers.zip"]
    # A script that sources the wrapper runs whole inside, at the same path, with its
    # arguments; a secret named in SPECFLEET_PASS_ENV passes by name.
    script = host.root / "run" / "probe.sh"
    script.write_text(
        "#!/usr/bin/env bash\nset -euo pipefail\n"
        f". {host.wrapper}\n"
        'echo "inside=${SPECFLEET_CONTAINER:-no} args=$* token=${MY_TOKEN:-unset}"\n'
    )
    out = subprocess.run(
        ["bash", str(script), "a", "b c"],
        env={**env, "MY_TOKEN": "t0k", "SPECFLEET_PASS_ENV": "MY_TOKEN"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == f"inside={host.name} args=a b c token=t0k"


@pytest.mark.parametrize("ending", ["timeout", "stop"])
def test_stage_timeout_and_stop_end_what_runs_inside(host: ContainerHost, ending: str) -> None:
    """The stage runner starts inside the container (as run.yml does there); its script's
    children run in the container, and a timeout (inside) or a stop (from the host, by the
    recorded process group) ends all of them."""
    if not host.wrapper.exists():
        host.play()
    run_dir = host.root / "run"
    name = f"probe_{ending}"
    child_file = run_dir / f"{name}.child"
    child_file.unlink(missing_ok=True)
    script = run_dir / f"{name}.sh"
    script.write_text(
        "#!/usr/bin/env bash\nset -euo pipefail\n"
        f". {host.wrapper}\n"
        'echo "==> inside $SPECFLEET_CONTAINER"\n'
        f"sleep 300 & echo $! > {child_file}\n"
        "sleep 300\n"
    )
    timeout = "6" if ending == "timeout" else "300"
    helpers = {"PYTHONPATH": f"{host.root}/lib/specfleet_helpers.zip", "PATH": os.environ["PATH"]}
    started = subprocess.run(
        [
            *(str(host.wrapper), "/usr/bin/python3", "-m", STAGE_RUN, "start"),
            *(f"--name={name}", f"--run-dir={run_dir}", f"--log={host.root}/logs/{name}.log"),
            *(f"--script={script}", f"--timeout={timeout}"),
        ],
        env=helpers,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    info = json.loads(started.stdout.strip().splitlines()[-1])
    deadline = time.monotonic() + 30
    while not child_file.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    child = int(child_file.read_text())
    script_pid = int(info["pid"])
    assert container_pid(child, host.name), "the stage's child must run inside the container"
    assert container_pid(script_pid, host.name)

    status_cmd = [sys.executable, "-m", STAGE_RUN, "status", f"--name={name}"]
    status_cmd += [f"--run-dir={run_dir}", f"--log={host.root}/logs/{name}.log"]
    running = json.loads(subprocess.check_output(status_cmd, env=helpers, text=True))
    assert running["state"] == "running", running
    if ending == "stop":
        stop_cmd = [sys.executable, "-m", STAGE_RUN, "stop", f"--name={name}"]
        stopped = json.loads(
            subprocess.check_output([*stop_cmd, f"--run-dir={run_dir}"], env=helpers, text=True)
        )
        assert stopped["stopped"], stopped
    deadline = time.monotonic() + 40
    while (alive(child) or alive(script_pid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(child), f"{ending}: the child {child} inside the container survived"
    assert not alive(script_pid), f"{ending}: the script {script_pid} survived"
    if ending == "timeout":
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            final = json.loads(subprocess.check_output(status_cmd, env=helpers, text=True))
            if final["state"] == "finished":
                break
            time.sleep(0.5)
        assert final["timed_out"] and final["rc"] == 124, final


STAGE_PLAY = """\
- name: Provision (npu_env brings up the stage container)
  ansible.builtin.import_playbook: {provision}

- name: Run one stage through the stage role, as every stage does
  hosts: localhost
  gather_facts: false
  roles:
    - role: specfleet
  tasks:
    - name: Run the probe stage
      ansible.builtin.import_role:
        name: stage
        tasks_from: run
      vars:
        stage_name: probe_stage
        # a stage declared for this test alone (roles/specfleet/vars/main/stages.yml)
        specfleet_stages:
          probe_stage: {{script: {template}, timeout_s: 8, poll_delay_s: 2}}
      tags: [probe]
"""


def test_a_stage_run_by_the_stage_role_runs_inside_and_its_timeout_ends_it(
    host: ContainerHost,
) -> None:
    """roles/stage/tasks/run.yml starts the runner inside the container: the script's child
    runs there, and the stage's timeout ends it (a runner on the host would only end the
    `podman exec` client and leave the child running in the container)."""
    child_file = host.root / "run" / "probe_stage.child"
    child_file.unlink(missing_ok=True)
    template = host.tmp / "probe_stage.sh.j2"
    template.write_text(
        "#!/usr/bin/env bash\nset -euo pipefail\n"
        ". {{ specfleet_env_wrapper | quote }}\n"
        'echo "==> inside ${SPECFLEET_CONTAINER:-the host}"\n'
        f"sleep 300 & echo $! > {child_file}\n"
        "sleep 300\n"
    )
    playbook = host.tmp / "stage-play.yml"
    playbook.write_text(STAGE_PLAY.format(provision=PLAYBOOK, template=template))
    _, stats, stdout = host.play(playbook=playbook, ok=False)
    assert stats["failures"].get(HOST), f"the stage must fail on its timeout: {stats}"
    assert "timed out after 8s" in stdout, stdout[-3000:]
    assert f"inside {host.name}" in stdout, "the stage script did not run in the container"
    child = int(child_file.read_text())
    assert not alive(child), f"the stage's child {child} in the container survived its timeout"


# Docker as the stage container's engine runs in CI through test_container_npu_mock (its A3
# host: created, kept when unchanged); this CPU-image variant is in make test-reliability's
# budget.
@pytest.mark.slow
@pytest.mark.skipif(not docker_ready(), reason="needs dockerd and the image (scripts/test-images)")
def test_docker_engine_converges_idempotently_and_runs_inside(tmp_path: Path) -> None:
    docker_host = ContainerHost(tmp_path, engine="docker", image=IMAGES[0])
    try:
        runner, _, _ = docker_host.play()
        assert f"create: no container {docker_host.name} yet" in plan_message(runner)
        first_id = docker_host.container_id()
        _, stats, _ = docker_host.play()
        assert stats["changed"].get(HOST, 0) == 0, f"second run changed something: {stats}"
        assert docker_host.container_id() == first_id
        out = subprocess.run(
            [str(docker_host.wrapper), "sh", "-c", 'echo "$SPECFLEET_CONTAINER"'],
            env={"PATH": os.environ["PATH"]},
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.strip() == docker_host.name
        assert docker_host.state()["container"]["engine"] == "docker"
    finally:
        subprocess.run(["docker", "rm", "--force", docker_host.name], capture_output=True)


def test_image_archive_is_pushed_and_loaded_once(tmp_path: Path) -> None:
    """Air-gapped: the image is not on the host, only an archive on the controller; the run
    copies it to <root>/images, loads it and runs the container; the next run loads nothing."""
    tag = f"localhost/specfleet-archive-test:{uuid.uuid4().hex[:8]}"
    archive = tmp_path / "controller" / "image.tar"
    archive.parent.mkdir()
    podman("tag", IMAGE, tag)
    try:
        podman("save", "--output", str(archive), tag)
        # `untag IMAGE NAME`: without a NAME podman drops every name of the image, the shared
        # test image's own too.
        podman("untag", tag, tag)
        archive_host = ContainerHost(tmp_path / "host", image=tag)
        archive_host.tmp.mkdir()
        runner, _, _ = archive_host.play(specfleet_container_image_archive=str(archive))
        loads = [
            e
            for e in task_events(runner, "Load the image archive")
            if e.get("res", {}).get("changed")
        ]
        assert loads, "the archive must be loaded on a host without the image"
        assert (archive_host.root / "images" / "image.tar").is_file()
        assert podman("image", "exists", tag, check=False).returncode == 0
        assert archive_host.container_id()
        runner, stats, _ = archive_host.play(specfleet_container_image_archive=str(archive))
        assert stats["changed"].get(HOST, 0) == 0, f"second run changed something: {stats}"
        assert not [
            e
            for e in task_events(runner, "Load the image archive")
            if e.get("res", {}).get("changed")
        ]
    finally:
        for line in podman("ps", "-a", "--format", "{{.Names}} {{.Image}}").stdout.splitlines():
            name, _, image = line.partition(" ")
            if image == tag:
                podman("rm", "--force", name, check=False)
        # The loaded image is the shared test image under another name: drop the name only
        # (`rmi --force` would remove every container of that image, other tests' too).
        podman("untag", tag, tag, check=False)


def test_a_service_deployed_inside_comes_back_when_the_container_restarts(
    host: ContainerHost,
) -> None:
    """serve_mode service on the container runtime: the service's supervisor runs in the stage
    container; a killed server is restarted by it, and when the container itself restarts (a
    crash of it, or a reboot) the engine's restart policy starts the container again and its
    command (`service boot`) starts the supervisor again: the same deployment, its secret
    included, without any run of specfleet. A small HTTP server stands in for vLLM."""
    if not host.wrapper.exists():
        host.play()
    inspected = json.loads(podman("container", "inspect", host.name).stdout)[0]
    assert inspected["HostConfig"]["RestartPolicy"]["Name"] == "always", inspected["HostConfig"]
    run_dir, port = host.root / "run", free_port()
    site = host.root / "svc-site"
    site.mkdir(exist_ok=True)
    (site / "health").write_text("ok\n")
    launcher = run_dir / "svc.service.sh"
    launcher.write_text(
        "#!/usr/bin/env bash\n"
        f"exec python3 -m http.server {port} --bind 127.0.0.1 --directory {site}\n"
    )
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(host.tmp)}

    def service(*args: str, **extra_env: str) -> dict[str, Any]:
        argv = [str(host.wrapper), "python3", "-m", "specfleet_helpers.host.service", *args]
        argv += ["--name", "svc", "--run-dir", str(run_dir)]
        out = subprocess.run(argv, env={**env, **extra_env}, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])

    def server_env(pid: int) -> list[str]:
        return Path(f"/proc/{pid}/environ").read_text(errors="replace").split("\0")

    deployed = service(
        "deploy", "--launcher", str(launcher), "--log", str(host.root / "logs" / "svc.log"),
        "--port", str(port), "--pass-env", "VLLM_API_KEY", "--restart-delay-s", "1",
        VLLM_API_KEY="sekret-for-the-test",
    )  # fmt: skip
    assert deployed["manager"] == "specfleet", deployed
    first = service("wait", "--timeout", "60")
    assert container_pid(first["main_pid"], host.name)
    assert "VLLM_API_KEY=sekret-for-the-test" in server_env(first["main_pid"])

    # The server dies: its supervisor starts it again.
    os.kill(first["main_pid"], signal.SIGKILL)
    again = wait_for_health(service, lambda s: s["main_pid"] != first["main_pid"])
    assert again["restarts"] == 1 and again["supervisor_pid"] == first["supervisor_pid"]

    # The container restarts: everything in it ends, the engine starts it again, and its
    # command brings the service back as it was deployed.
    podman("restart", "--time", "2", host.name)
    assert not alive(first["supervisor_pid"]), "the old supervisor outlived its container"
    back = wait_for_health(service, lambda s: s["supervisor_pid"] != first["supervisor_pid"])
    assert back["launcher_sha256"] == first["launcher_sha256"] and back["launcher_unchanged"]
    assert container_pid(back["main_pid"], host.name)
    assert "VLLM_API_KEY=sekret-for-the-test" in server_env(back["main_pid"])
    record = json.loads((run_dir / "svc.service.json").read_text())
    assert record.get("restored_at"), record
    # The secret is in the container's own filesystem, never under the (mounted) work root.
    leaked = subprocess.run(
        ["grep", "-rl", "sekret-for-the-test", str(host.root)], capture_output=True
    )
    assert leaked.stdout == b"", leaked.stdout

    stopped = service("stop")
    assert stopped["stopped"], stopped
    podman("restart", "--time", "2", host.name)
    time.sleep(2)
    assert not service("status")["deployed"], "a stopped service came back"


def wait_for_health(service: Callable[..., dict[str, Any]], new: Callable[[dict], bool]) -> dict:
    deadline = time.monotonic() + 60
    while True:
        now = service("status")
        if now.get("healthy") and new(now):
            return now
        assert time.monotonic() < deadline, f"the service did not come back: {now}"
        time.sleep(0.5)
