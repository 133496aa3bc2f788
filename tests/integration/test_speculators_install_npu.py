"""speculators_install on the NPU profile, for real through Ansible: installing speculators
into the vllm-ascend image's Python never upgrades what the image preinstalled, and a
conflict stops the host naming the conflicting requirement.

The "image Python" is a real Python 3.11 venv under tmp_path (speculators needs >= 3.11)
whose site-packages holds the image's preinstalled distributions as metadata only (the
mock kit's dist-info: torch 2.10.0+cpu, torch_npu, vllm 0.23.0+empty, ...), so pip sees
them installed without any of them being real. It is reached through a wrapper that puts
the mock kit's torch/torch_npu stubs first on PYTHONPATH (for npu_env's torch.npu check).
Everything else is real: site.yml with --tags npu_env,speculators_install, the roles, the
generated constraints and pip against the package index (source pypi, no git).

  a. fake transformers 4.57.0, speculators 0.9.0 needs transformers>=5.0: the play fails
     in speculators_install naming the conflict; nothing preinstalled changed.
  b. fake transformers 5.5.4: pip installs speculators' other dependencies without touching
     a pinned distribution; then `speculators --version` fails, since torch is a stub.
     About 2 minutes (pip fetches datasets, pyarrow, pandas, ...); case a about 1.

Run explicitly:
    .venv/bin/python -m pytest -q tests/integration/test_speculators_install_npu.py
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import pytest
import yaml

if TYPE_CHECKING:
    from conftest import MockNpuHost

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SITE = REPO / "site.yml"
MOCK_NPU_DIR = HERE / "mock_npu"
NPU_SMI_FIXTURES = REPO / "tests" / "fixtures" / "npu-smi"
ROLE_DEFAULTS = REPO / "roles" / "speculators_install" / "defaults" / "main.yml"
VERSIONS = yaml.safe_load((REPO / "group_vars" / "all" / "versions.yml").read_text())
A2_IDLE = "a2_910b4_8npu_idle_25.0.rc1.1.txt"
HOST = "localhost"
STAGE = "speculators_install"
SPECULATORS_VERSION = VERSIONS["specfleet_speculators_version"]
MODELSCOPE_VERSION = VERSIONS["specfleet_modelscope_version"]
# The conflict case resolves in about a minute; the install case downloads speculators'
# dependencies. Other tests (molecule) may share the 2 cores: generous.
CONFLICT_TIMEOUT_S = 15 * 60
INSTALL_TIMEOUT_S = 40 * 60
CMD_TIMEOUT_S = 300

# The image's Python: the venv's interpreter with the mock torch/torch_npu first on
# PYTHONPATH, prepended to (the role's env wrapper puts the helpers zip there).
IMAGE_PYTHON_WRAPPER = """\
#!/bin/sh
# MOCK of NPU hardware for tests: the vllm-ascend image's Python (a venv whose site-packages
# holds the image's distributions as metadata), with the torch/torch_npu stubs importable.
PYTHONPATH={stubs}${{PYTHONPATH:+:$PYTHONPATH}}
PYTHONDONTWRITEBYTECODE=1
export PYTHONPATH PYTHONDONTWRITEBYTECODE
exec {python} "$@"
"""

VERSIONS_SCRIPT = """\
import json, sys
from importlib import metadata
out = {}
for name in sys.argv[1:]:
    try:
        out[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        out[name] = None
print(json.dumps(out))
"""


def run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    kwargs.setdefault("timeout", CMD_TIMEOUT_S)
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)
    assert proc.returncode == 0, (
        f"{shlex.join(argv)} failed (rc {proc.returncode})\n{proc.stdout[-3000:]}\n"
        f"{proc.stderr[-3000:]}"
    )
    return proc


def read_metadata(dist_info: Path) -> dict[str, str]:
    headers = {}
    for line in (dist_info / "METADATA").read_text().splitlines():
        key, sep, value = line.partition(": ")
        if not sep:
            break
        headers[key] = value
    return headers


def role_pinned() -> list[str]:
    return yaml.safe_load(ROLE_DEFAULTS.read_text())["speculators_install_npu_pinned"]


@dataclass
class ImagePython:
    """A Python 3.11 venv playing the vllm-ascend image's Python."""

    venv: Path
    wrapper: Path
    site: Path
    # What the image preinstalled: distribution name -> version.
    preinstalled: dict[str, str]

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def versions(self, names: list[str]) -> dict[str, str | None]:
        """importlib.metadata versions seen by the venv's own interpreter (no stubs, no zip)."""
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        out = run([str(self.python), "-c", VERSIONS_SCRIPT, *names], env=env).stdout
        return json.loads(out.strip().splitlines()[-1])

    def dist_infos(self, name: str) -> list[str]:
        """dist-info directories of a distribution in site-packages (one when untouched)."""
        stem = name.replace("-", "_").lower()
        return sorted(
            p.name for p in self.site.glob("*.dist-info") if p.name.lower().startswith(stem + "-")
        )

    def installers(self) -> dict[str, str]:
        """INSTALLER of every preinstalled distribution's dist-info (the mock's mark)."""
        return {
            name: (self.site / self.dist_infos(name)[0] / "INSTALLER").read_text().strip()
            for name in self.preinstalled
        }


@pytest.fixture
def image_python(tmp_path: Path, stub_site: Path) -> Callable[[str], ImagePython]:
    """Factory: the image's Python with the mock stack, transformers at the version given."""
    base = shutil.which("python3.11")
    if base is None:
        pytest.skip("python3.11 is not on PATH (speculators needs Python >= 3.11)")

    def make(transformers: str) -> ImagePython:
        venv = tmp_path / "image-venv"
        run([base, "-m", "venv", str(venv)])
        purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
        site = Path(run([str(venv / "bin" / "python"), "-c", purelib]).stdout.strip())
        preinstalled = {}
        for dist_info in sorted(stub_site.glob("*.dist-info")):
            headers = read_metadata(dist_info)
            name, version = headers["Name"], headers["Version"]
            if name == "transformers" and version != transformers:
                target = site / f"transformers-{transformers}.dist-info"
                target.mkdir()
                text = (dist_info / "METADATA").read_text()
                (target / "METADATA").write_text(
                    text.replace(f"Version: {version}\n", f"Version: {transformers}\n")
                )
                shutil.copy2(dist_info / "INSTALLER", target / "INSTALLER")
                version = transformers
            else:
                shutil.copytree(dist_info, site / dist_info.name)
            preinstalled[name] = version
        wrapper = tmp_path / "bin" / "python-image"
        wrapper.parent.mkdir(parents=True, exist_ok=True)
        wrapper.write_text(
            IMAGE_PYTHON_WRAPPER.format(
                stubs=shlex.quote(str(MOCK_NPU_DIR)),
                python=shlex.quote(str(venv / "bin" / "python")),
            )
        )
        wrapper.chmod(0o755)
        image = ImagePython(venv=venv, wrapper=wrapper, site=site, preinstalled=preinstalled)
        assert image.versions(list(preinstalled)) == preinstalled
        return image

    return make


@dataclass
class Play:
    """One run of site.yml: status, stats, events, output and wall time."""

    rc: int
    status: str
    stats: dict[str, dict[str, int]]
    events: list[dict[str, Any]]
    stdout: str
    seconds: float
    failures: list[dict[str, Any]] = field(init=False)

    def __post_init__(self) -> None:
        self.failures = [
            e["event_data"]
            for e in self.events
            if e.get("event") == "runner_on_failed" and e["event_data"].get("host") == HOST
        ]

    @property
    def failed(self) -> bool:
        return any((self.stats.get(k) or {}).get(HOST, 0) for k in ("failures", "dark"))

    def tail(self, lines: int = 80) -> str:
        return "\n".join(self.stdout.splitlines()[-lines:])


# site.yml defers stage failures to its last play, which fails the hosts that are not green.
REPORT_PLAY = "Validate the fleet and write the report"


def play(
    npu_host: MockNpuHost, image: ImagePython, *, timeout_s: int, fixture: str = A2_IDLE
) -> Play:
    """site.yml --tags npu_env,speculators_install against localhost in group atlas-a2, on
    the mock NPU, with the image's Python as specfleet_npu_python and source pypi."""
    import ansible_runner

    fixture_path = NPU_SMI_FIXTURES / fixture
    assert fixture_path.is_file(), f"no npu-smi fixture {fixture_path}"
    inventory = npu_host.write_inventory(
        "atlas-a2",
        {"specfleet_npu_python": str(image.wrapper), "speculators_install_source": "pypi"},
    )
    venv_bin = str(Path(sys.executable).parent)
    envvars = {
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_CALLBACK_PLUGINS": str(REPO / "callback_plugins"),
        "ANSIBLE_NOCOLOR": "1",
        "PATH": ":".join([venv_bin, os.environ.get("PATH", "/usr/bin:/bin")]),
        "MOCK_NPU_SMI_FIXTURE": str(fixture_path),
        "MOCK_NPU_COUNT": "8",
    }
    private_data_dir = npu_host.tmp / f"runner-site-{time.monotonic_ns()}"
    private_data_dir.mkdir()
    started = time.monotonic()
    runner = ansible_runner.run(
        private_data_dir=str(private_data_dir),
        project_dir=str(REPO),
        playbook=str(SITE),
        inventory=str(inventory),
        tags="npu_env,speculators_install",
        envvars=envvars,
        timeout=timeout_s,
        quiet=True,
    )
    seconds = time.monotonic() - started
    stdout = runner.stdout.read() if runner.stdout else ""
    result = Play(
        rc=runner.rc,
        status=runner.status,
        stats=runner.stats or {},
        events=list(runner.events),
        stdout=stdout,
        seconds=seconds,
    )
    print(f"\nplay: {result.status} rc={result.rc} in {seconds:.0f}s; stats {result.stats}")
    assert runner.status != "timeout", f"playbook run timed out\n{result.tail()}"
    return result


def stage_failure(npu_host: MockNpuHost, result: Play) -> str:
    """The play passed npu_env and failed exactly once in the provisioning plays, in the
    speculators_install stage (the stage role's log-tail task), and once more at the end in
    the report's gate, which names that stage; returns the message a user sees."""
    assert result.failed, f"expected the play to fail; stats {result.stats}\n{result.tail()}"
    assert npu_host.state_file.is_file(), "npu_env did not complete (no state file)"
    listed = [(f.get("play"), f.get("task")) for f in result.failures]
    gate = [f for f in result.failures if f.get("play") == REPORT_PLAY]
    stage = [f for f in result.failures if f.get("play") != REPORT_PLAY]
    assert len(stage) == 1 and len(gate) == 1, listed
    assert f"stage {STAGE} failed" in str(gate[0]["res"]["msg"]), gate[0]["res"]["msg"]
    failure = stage[0]
    assert failure.get("task") == f"Fail with the log tail: {STAGE}", failure.get("task")
    message = str(failure["res"]["msg"])
    print(f"failure message:\n{message}")
    assert message.startswith(f"stage {STAGE} failed on {HOST}: exit code "), message
    assert f"re-run by hand: bash {npu_host.root}/run/{STAGE}.sh" in message
    assert not (npu_host.root / "state" / f"{STAGE}.json").exists(), "a failed stage was stamped"
    return message


def assert_preinstalled_untouched(image: ImagePython) -> None:
    names = list(image.preinstalled)
    assert image.versions(names) == image.preinstalled
    for name in names:
        assert len(image.dist_infos(name)) == 1, (name, image.dist_infos(name))
    assert set(image.installers().values()) == {"specfleet-mock-npu"}, image.installers()


def assert_constraints_pin_the_image(npu_host: MockNpuHost, image: ImagePython) -> None:
    """<root>/run/speculators_install.constraints.txt pins exactly what the image has."""
    constraints = npu_host.root / "run" / f"{STAGE}.constraints.txt"
    assert constraints.is_file(), "the stage wrote no constraints file"
    lines = [
        line.strip()
        for line in constraints.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    expected = {f"{name}=={version}" for name, version in image.preinstalled.items()}
    assert set(lines) == expected, lines
    assert len(lines) == len(expected), lines
    # The role pins each of the image's distributions (the constraints come from its list).
    assert {n.replace("_", "-") for n in role_pinned()} == {
        n.replace("_", "-") for n in image.preinstalled
    }
    for line in ("torch==2.10.0+cpu", "torch_npu==2.10.0.post4", "vllm==0.23.0+empty"):
        assert line in lines


def test_conflict_fails_naming_it_and_changes_nothing(
    npu_host: MockNpuHost, image_python: Callable[[str], ImagePython]
) -> None:
    """(a) transformers 4.57.0 in the image; speculators 0.9.0 needs transformers>=5.0."""
    image = image_python("4.57.0")
    assert image.preinstalled["transformers"] == "4.57.0"
    assert image.preinstalled["torch"] == "2.10.0+cpu"

    result = play(npu_host, image, timeout_s=CONFLICT_TIMEOUT_S)
    message = stage_failure(npu_host, result)

    # The conflict, named: the script's line and pip's section, both sides of it.
    assert "conflict" in message.lower()
    assert "transformers" in message
    assert "pip cannot install without changing a pinned package" in message
    assert "Conflicting requirements:" in message
    assert "The conflict is caused by" in message
    assert "transformers==4.57.0" in message
    assert f"speculators {SPECULATORS_VERSION} depends on transformers" in message

    # Nothing preinstalled moved; speculators did not get in either.
    assert_preinstalled_untouched(image)
    assert image.versions(["transformers", "torch"]) == {
        "transformers": "4.57.0",
        "torch": "2.10.0+cpu",
    }
    assert image.versions(["speculators"]) == {"speculators": None}
    assert_constraints_pin_the_image(npu_host, image)

    # The npu_env state recorded the image's stack as the role saw it.
    state = json.loads(npu_host.state_file.read_text())
    assert state["profile"] == "npu"
    assert state["stack"]["versions"]["transformers"] == "4.57.0"
    assert state["stack"]["npu_available"] is True


def test_install_keeps_every_pinned_package(
    npu_host: MockNpuHost, image_python: Callable[[str], ImagePython]
) -> None:
    """(b) transformers 5.5.4 (the image's real version): pip installs speculators and its
    other dependencies without touching a pinned distribution. The stub torch cannot run
    speculators, so the stage then fails at its `speculators --version` step, after pip."""
    image = image_python("5.5.4")

    result = play(npu_host, image, timeout_s=INSTALL_TIMEOUT_S)
    message = stage_failure(npu_host, result)

    log = (npu_host.root / "logs" / f"{STAGE}.log").read_text()
    assert "Successfully installed" in log, log[-4000:]
    assert "Conflicting requirements" not in log
    assert "==> speculators --version" in log
    assert "during: speculators --version" in message
    # pip took the image's torch, torchvision, torchaudio and transformers as they are and
    # installed none of the pinned distributions.
    for name in ("torch", "torchvision", "torchaudio", "transformers"):
        version = image.preinstalled[name]
        assert f"Requirement already satisfied: {name}" in log, name
        assert f"({version})" in log, (name, version)
    installed = next(
        line for line in log.splitlines() if line.startswith("Successfully installed ")
    ).split()[2:]
    installed_names = {entry.rpartition("-")[0].lower().replace("_", "-") for entry in installed}
    assert f"speculators-{SPECULATORS_VERSION}" in installed
    pinned = {name.lower().replace("_", "-") for name in image.preinstalled}
    assert not installed_names & pinned, sorted(installed_names & pinned)
    for name in image.preinstalled:
        assert f"Uninstalling {name}" not in log, name
    # What comes next: the script's own `speculators --version` cannot import speculators
    # (torch and transformers are metadata only), so the play stops there, before verify.
    assert "Traceback" in message
    assert image.versions(["speculators", "modelscope"]) == {
        "speculators": SPECULATORS_VERSION,
        "modelscope": MODELSCOPE_VERSION,
    }
    assert_preinstalled_untouched(image)
    assert_constraints_pin_the_image(npu_host, image)
