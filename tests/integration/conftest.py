"""Shared setup of the integration suite: run the real playbooks through Ansible on this
machine, with the NPU hardware (npu-smi, torch.npu, the CANN install) replaced by the mock
kit in tests/integration/mock_npu/ and by files generated here under tmp_path.

Only the NPU is mocked. Ansible, the roles, group_vars and python_helpers are the real ones;
the helpers run exactly as on a fleet host (bundled, shipped, run from the zip).

Run explicitly (pyproject's testpaths is tests/unit):
    .venv/bin/python -m pytest tests/integration
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from siteruns import LOW_HOST_FLOORS, free_port

REPO = Path(__file__).resolve().parents[2]
MOCK_NPU_DIR = Path(__file__).resolve().parent / "mock_npu"
MOCK_NPU_SMI = MOCK_NPU_DIR / "npu-smi"
NPU_SMI_FIXTURES = REPO / "tests" / "fixtures" / "npu-smi"
PLAYBOOK = REPO / "playbooks" / "provision.yml"
HOST = "localhost"
SPECULATORS = "speculators_install"
# A playbook run takes ~10 s here; this only stops a hung run.
RUN_TIMEOUT_S = 600

# Distributions of the vllm-ascend v0.23.0 image as importlib.metadata reports them
# (stack_report reads versions that way, not from __version__).
MOCK_DISTRIBUTIONS = {
    "torch": "2.10.0+cpu",
    "torch_npu": "2.10.0.post4",
    "torchvision": "0.25.0+cpu",
    "torchaudio": "2.10.0+cpu",
    "transformers": "5.5.4",
    "vllm": "0.23.0+empty",
    "vllm-ascend": "0.23.0",
    "triton-ascend": "3.2.2",
    "triton": "3.5.0",
}

TOOLKIT_SET_ENV = """\
# MOCK of NPU hardware for tests: stands in for CANN's ascend-toolkit/set_env.sh.
export ASCEND_TOOLKIT_HOME={home}
export ASCEND_HOME_PATH="$ASCEND_TOOLKIT_HOME"
export LD_LIBRARY_PATH="$ASCEND_TOOLKIT_HOME/lib64${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"
export MOCK_CANN_TOOLKIT_SOURCED=1
"""

# The AscendNPU IR toolchain (bishengir, what Triton-Ascend kernels compile with) that the
# vllm-ascend image's entrypoint sources after the toolkit.
ASCENDNPU_IR_SET_ENV = """\
# MOCK of NPU hardware for tests: stands in for CANN's share/info/ascendnpu-ir/bin/set_env.sh.
export PATH={home}/bin:$PATH
export MOCK_ASCENDNPU_IR_SOURCED=1
"""

# Like NNAL's atb/set_env.sh it reads $ZSH_VERSION unguarded, so sourcing it under `set -u`
# fails unless the caller defined ZSH_VERSION (what specfleet's wrapper must do), and it picks
# the C++ ABI build from --cxx_abi=0|1 (0 when not given; the image sources it with 1).
ATB_SET_ENV = """\
# MOCK of NPU hardware for tests: stands in for NNAL's atb/set_env.sh (reads $ZSH_VERSION).
if [ -n "$ZSH_VERSION" ]; then _mock_atb_shell=zsh; else _mock_atb_shell=bash; fi
_mock_atb_abi=0
for _mock_atb_arg in "$@"; do
    case "$_mock_atb_arg" in --cxx_abi=*) _mock_atb_abi="${{_mock_atb_arg#--cxx_abi=}}" ;; esac
done
export ATB_HOME_PATH={home}/cxx_abi_$_mock_atb_abi
export MOCK_ATB_ARGS="$*"
export MOCK_ATB_SOURCED_BY="$_mock_atb_shell"
export MOCK_ATB_ZSH_VERSION_DEFINED="${{ZSH_VERSION+yes}}"
unset _mock_atb_shell _mock_atb_abi _mock_atb_arg
"""

NPU_PYTHON_WRAPPER = """\
#!/bin/sh
# MOCK of NPU hardware for tests: the vllm-ascend image's Python, i.e. the controller venv's
# Python with the torch/torch_npu stubs and the image's distribution metadata first on
# sys.path. PYTHONPATH is prepended to, never replaced (the role puts the helpers zip there).
PYTHONPATH={stubs}${{PYTHONPATH:+:$PYTHONPATH}}
PYTHONDONTWRITEBYTECODE=1
export PYTHONPATH PYTHONDONTWRITEBYTECODE
exec {python} "$@"
"""


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "integration: runs real playbooks through Ansible on this machine (NPU mocked); slow",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked slow (whole pipelines killed, corrupted and run again) run with
    SPECFLEET_SLOW_TESTS=1, i.e. `make test-reliability`; CI's time budget leaves them out."""
    if os.environ.get("SPECFLEET_SLOW_TESTS") == "1":
        return
    skip = pytest.mark.skip(reason="slow: set SPECFLEET_SLOW_TESTS=1 (make test-reliability)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@dataclass
class PlayResult:
    """One ansible-playbook run: its status, stats and the events ansible-runner recorded."""

    rc: int
    status: str
    stats: dict[str, dict[str, int]]
    events: list[dict[str, Any]]
    stdout: str

    def count(self, stat: str, host: str = HOST) -> int:
        return (self.stats.get(stat) or {}).get(host, 0)

    @property
    def failed(self) -> bool:
        return self.count("failures") > 0 or self.count("dark") > 0

    def failure_messages(self, host: str = HOST) -> list[str]:
        """The `msg` of every failed task (and failed loop item) for host, in order."""
        messages = []
        for event in self.events:
            if event.get("event") not in ("runner_on_failed", "runner_item_on_failed"):
                continue
            data = event.get("event_data", {})
            if data.get("host") != host:
                continue
            res = data.get("res", {})
            if event["event"] == "runner_on_failed" and res.get("results"):
                continue  # a loop: its items were reported one by one
            if res.get("msg"):
                messages.append(str(res["msg"]))
        return messages

    @property
    def failure_message(self) -> str:
        messages = self.failure_messages()
        assert messages, f"no failed task for {HOST}; rc={self.rc}\n{self.stdout[-4000:]}"
        return "\n".join(messages)

    def started_tasks(self) -> list[tuple[str, str]]:
        """(role, task name) of every task the play started."""
        return [
            (e["event_data"].get("role", ""), e["event_data"].get("task", ""))
            for e in self.events
            if e.get("event") == "playbook_on_task_start"
        ]

    def task_results(self, task: str, host: str = HOST) -> list[dict[str, Any]]:
        return [
            e["event_data"].get("res", {})
            for e in self.events
            if e.get("event") == "runner_on_ok"
            and e["event_data"].get("host") == host
            and e["event_data"].get("task") == task
        ]


@dataclass
class MockNpuHost:
    """This machine dressed as an Ascend host: a CANN install, the image's Python and a
    work root under tmp_path; `run` plays playbooks/provision.yml against it."""

    tmp: Path
    stub_site: Path
    root: Path = field(init=False)
    toolkit_env: Path = field(init=False)
    atb_env: Path = field(init=False)
    npu_python: Path = field(init=False)
    ports: dict[str, int] = field(init=False)
    _runs: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        assert os.access(MOCK_NPU_SMI, os.X_OK), f"{MOCK_NPU_SMI} must be executable (chmod +x)"
        self.root = self.tmp / "root"
        ascend = self.tmp / "Ascend"
        self.toolkit_env = ascend / "ascend-toolkit" / "set_env.sh"
        self.ir_env = (
            ascend / "cann-9.1.0" / "share" / "info" / "ascendnpu-ir" / "bin" / "set_env.sh"
        )
        self.atb_env = ascend / "nnal" / "atb" / "set_env.sh"
        self.toolkit_home = ascend / "ascend-toolkit" / "latest"
        self.ir_home = self.ir_env.parent.parent
        self.atb_home = ascend / "nnal" / "atb" / "latest" / "atb" / "cxx_abi_1"
        for path, text, home in (
            (self.toolkit_env, TOOLKIT_SET_ENV, self.toolkit_home),
            (self.ir_env, ASCENDNPU_IR_SET_ENV, self.ir_home),
            (self.atb_env, ATB_SET_ENV, self.atb_home.parent),
        ):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text.format(home=shlex.quote(str(home))))
        self.npu_python = self.tmp / "bin" / "python-npu-mock"
        self.npu_python.parent.mkdir(parents=True, exist_ok=True)
        stubs = f"{MOCK_NPU_DIR}:{self.stub_site}"
        self.npu_python.write_text(
            NPU_PYTHON_WRAPPER.format(stubs=shlex.quote(stubs), python=shlex.quote(sys.executable))
        )
        self.npu_python.chmod(0o755)
        # Free ports for the pipeline's servers (this machine may run other things on 8000/8001).
        self.ports = {
            "specfleet_hidden_states_port": free_port(),
            "specfleet_serve_port": free_port(),
            "specfleet_data_port": free_port(),
        }

    @property
    def cann_env_files(self) -> list[str]:
        """As roles/specfleet/defaults/main.yml lists them: the entrypoint's scripts and args,
        the IR script by its pattern (cann-*/)."""
        ir = str(self.ir_env).replace("/cann-9.1.0/", "/cann-*/")
        return [str(self.toolkit_env), ir, f"{self.atb_env} --cxx_abi=1"]

    @property
    def state_file(self) -> Path:
        return self.root / "state" / "npu_env.json"

    @property
    def env_wrapper(self) -> Path:
        return self.root / "run" / "specfleet-env"

    def wrapper_env(self, *command: str) -> dict[str, str]:
        """Environment printed by `env` run through <root>/run/specfleet-env (or `command`),
        from a clean environment."""
        clean = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.tmp)}
        out = subprocess.run(
            [*command, "env"] if command else [str(self.env_wrapper), "env"],
            env=clean,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def host_vars(self, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
        """Inventory host variables; an override of None removes the variable."""
        hostvars: dict[str, Any] = {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "specfleet_root": str(self.root),
            "specfleet_accelerator": "npu",
            # The mock NPU is this machine itself, not an image: the host runtime (container
            # is the npu profile's default; test_container_runtime.py covers it).
            "specfleet_runtime": "host",
            "npu_env_npu_smi": str(MOCK_NPU_SMI),
            "specfleet_cann_env_files": self.cann_env_files,
            "specfleet_npu_python": str(self.npu_python),
            # HCCL's ports are reserved in this machine's network namespace for real (a harmless
            # reservation), and kept across reboots in a file of the test's, not /etc.
            "npu_env_hccl_sysctl_file": str(self.tmp / "sysctl.d" / "60-specfleet-hccl-ports.conf"),
            # The disk case overrides the low floors with extra vars.
            **LOW_HOST_FLOORS,
            **self.ports,
        }
        for key, value in (overrides or {}).items():
            if value is None:
                hostvars.pop(key, None)
            else:
                hostvars[key] = value
        return hostvars

    def write_inventory(self, group: str, overrides: dict[str, Any] | None = None) -> Path:
        inventory = self.tmp / f"inventory-{group}.yml"
        content = {"all": {"children": {group: {"hosts": {HOST: self.host_vars(overrides)}}}}}
        inventory.write_text(yaml.safe_dump(content, sort_keys=True))
        return inventory

    def run(
        self,
        fixture: str,
        *,
        group: str = "atlas-a2",
        npu_count: int = 8,
        soc_version: int | None = None,
        board_fixture: str | None = None,
        overrides: dict[str, Any] | None = None,
        extravars: dict[str, Any] | None = None,
        mock_npu_smi_on_path: bool = False,
        skip_speculators_install: bool = True,
    ) -> PlayResult:
        """Play provision.yml with --tags npu_env against this host.

        The host lists `fixture` in `npu-smi info` and, with board_fixture, answers
        `npu-smi info -t board`; torch sees npu_count NPUs (narrowed by the
        ASCEND_RT_VISIBLE_DEVICES the role exports) and, with soc_version, torch_npu reports
        that SoC number (else it cannot read one).

        --tags npu_env alone still starts speculators_install's argument-spec validation
        (Ansible tags that task `always`), so --skip-tags speculators_install is passed too
        unless skip_speculators_install is False.
        """
        import ansible_runner

        fixture_path = NPU_SMI_FIXTURES / fixture
        assert fixture_path.is_file(), f"no npu-smi fixture {fixture_path}"
        inventory = self.write_inventory(group, overrides)
        venv_bin = str(Path(sys.executable).parent)
        path = [venv_bin, os.environ.get("PATH", "/usr/bin:/bin")]
        if mock_npu_smi_on_path:
            path.insert(1, str(MOCK_NPU_DIR))
        envvars = {
            "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
            "ANSIBLE_NOCOLOR": "1",
            "PATH": ":".join(path),
            "MOCK_NPU_SMI_FIXTURE": str(fixture_path),
            "MOCK_NPU_COUNT": str(npu_count),
        }
        if soc_version is not None:
            envvars["MOCK_NPU_SOC_VERSION"] = str(soc_version)
        if board_fixture is not None:
            board_path = NPU_SMI_FIXTURES / board_fixture
            assert board_path.is_file(), f"no npu-smi board fixture {board_path}"
            envvars["MOCK_NPU_SMI_BOARD_FIXTURE"] = str(board_path)
        self._runs += 1
        # One private data dir per run: ansible-runner keeps env/envvars and env/extravars
        # from the first run of a dir and ignores the arguments of later runs.
        private_data_dir = self.tmp / f"runner-{self._runs}"
        private_data_dir.mkdir()
        runner = ansible_runner.run(
            private_data_dir=str(private_data_dir),
            project_dir=str(REPO),
            playbook=str(PLAYBOOK),
            inventory=str(inventory),
            tags="npu_env",
            skip_tags=SPECULATORS if skip_speculators_install else None,
            extravars=extravars or {},
            envvars=envvars,
            timeout=RUN_TIMEOUT_S,
            quiet=True,
        )
        stdout = runner.stdout.read() if runner.stdout else ""
        result = PlayResult(
            rc=runner.rc,
            status=runner.status,
            stats=runner.stats or {},
            events=list(runner.events),
            stdout=stdout,
        )
        assert runner.status != "timeout", f"playbook run timed out\n{stdout[-4000:]}"
        if skip_speculators_install:
            started = [task for role, task in result.started_tasks() if role == SPECULATORS]
            assert not started, f"speculators_install ran with --skip-tags: {started}"
        return result


@pytest.fixture(scope="session")
def stub_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """dist-info metadata of the vllm-ascend image's distributions (mock NPU stack)."""
    site = tmp_path_factory.mktemp("mock_npu_site")
    for name, version in MOCK_DISTRIBUTIONS.items():
        dist_info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        dist_info.mkdir()
        (dist_info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            "Summary: MOCK of NPU hardware for tests (metadata only)\n"
        )
        (dist_info / "INSTALLER").write_text("specfleet-mock-npu\n")
    return site


@pytest.fixture
def npu_host(tmp_path: Path, stub_site: Path) -> MockNpuHost:
    return MockNpuHost(tmp_path, stub_site)


@pytest.fixture
def listening_port() -> Iterator[int]:
    """A port this test process listens on (127.0.0.1)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield sock.getsockname()[1]
