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
  c. a distribution outside the NPU stack (fake numpy 1.26.4; speculators needs numpy>=2):
     the image's whole package list is pinned, so the play fails naming numpy, unchanged.
  d. source wheelhouse, the image's Python 3.12: the controller downloads cp312 wheels for the
     host's architecture and none of what the image has (no torch), checks them against the
     host, pushes them, and the host installs them with --no-index.
  e. source wheelhouse downloaded for another Python (speculators_install_wheelhouse_target
     python 3.11): the check names a cp311 wheel and the host, and nothing is pushed.

Run explicitly:
    .venv/bin/python -m pytest -q tests/integration/test_speculators_install_npu.py
"""

from __future__ import annotations

import json
import os
import platform
import re
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
VERSIONS = yaml.safe_load(ROLE_DEFAULTS.read_text())
A2_IDLE = "a2_910b4_8npu_idle_25.0.rc1.1.txt"
HOST = "localhost"
STAGE = "speculators_install"
SPECULATORS_VERSION = VERSIONS["speculators_install_version"]
MODELSCOPE_VERSION = VERSIONS["speculators_install_modelscope_version"]
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


def role_required() -> list[str]:
    return yaml.safe_load(ROLE_DEFAULTS.read_text())["speculators_install_npu_required"]


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def find_python(version: str) -> str | None:
    """The executable of a working python<version> (pyenv shims answer for other versions too:
    each candidate is asked which interpreter it is)."""
    candidates = [os.environ.get(f"SPECFLEET_TEST_PYTHON{version.replace('.', '')}")]
    candidates += [shutil.which(f"python{version}")]
    probe = "import sys; print(sys.executable); print('%d.%d' % sys.version_info[:2])"
    envs: list[dict[str, str]] = [dict(os.environ)]
    if shutil.which("pyenv"):
        bare = subprocess.run(
            ["pyenv", "versions", "--bare"], capture_output=True, text=True, check=False
        ).stdout.split()
        envs += [{**os.environ, "PYENV_VERSION": v} for v in bare if v.startswith(version + ".")]
    for candidate in filter(None, candidates):
        for env in envs:
            proc = subprocess.run(
                [candidate, "-c", probe], capture_output=True, text=True, check=False, env=env
            )
            lines = proc.stdout.split()
            if proc.returncode == 0 and len(lines) == 2 and lines[1] == version:
                return lines[0]
    return None


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
def image_python(tmp_path: Path, stub_site: Path) -> Callable[..., ImagePython]:
    """Factory: the image's Python with the mock stack, transformers at the version given,
    further distributions (name -> version, metadata only) and the Python version given."""

    def make(
        transformers: str, extra: dict[str, str] | None = None, python: str = "3.11"
    ) -> ImagePython:
        base = find_python(python)
        if base is None:
            pytest.skip(
                f"no python{python} here (set SPECFLEET_TEST_PYTHON{python.replace('.', '')})"
            )
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
        for name, version in (extra or {}).items():
            target = site / f"{name.replace('-', '_')}-{version}.dist-info"
            target.mkdir()
            (target / "METADATA").write_text(
                f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                "Summary: MOCK of NPU hardware for tests (metadata only)\n"
            )
            (target / "INSTALLER").write_text("specfleet-mock-npu\n")
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
    npu_host: MockNpuHost,
    image: ImagePython,
    *,
    timeout_s: int,
    fixture: str = A2_IDLE,
    overrides: dict[str, Any] | None = None,
) -> Play:
    """site.yml --tags npu_env,speculators_install against localhost in group atlas-a2, on
    the mock NPU, with the image's Python as specfleet_npu_python and source pypi (unless
    overrides say otherwise)."""
    import ansible_runner

    fixture_path = NPU_SMI_FIXTURES / fixture
    assert fixture_path.is_file(), f"no npu-smi fixture {fixture_path}"
    inventory = npu_host.write_inventory(
        "atlas-a2",
        {
            "specfleet_npu_python": str(image.wrapper),
            "speculators_install_source": "pypi",
            **(overrides or {}),
        },
    )
    venv_bin = str(Path(sys.executable).parent)
    envvars = {
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
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


def constraint_lines(npu_host: MockNpuHost) -> list[str]:
    constraints = npu_host.root / "run" / f"{STAGE}.constraints.txt"
    assert constraints.is_file(), "the stage wrote no constraints file"
    return [
        line.strip()
        for line in constraints.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]


def assert_constraints_pin_the_image(npu_host: MockNpuHost, image: ImagePython) -> None:
    """<root>/run/speculators_install.constraints.txt pins the image's whole package list:
    the mock stack, and what else the image's Python holds (pip), as they were; not what the
    stage installs on purpose (speculators, modelscope) nor what it added."""
    lines = constraint_lines(npu_host)
    pins = {normalize(line.partition("==")[0]): line.partition("==")[2] for line in lines}
    assert len(pins) == len(lines), lines
    for name, version in image.preinstalled.items():
        assert pins.get(normalize(name)) == version, (name, version, lines)
    pip_version = image.versions(["pip"])["pip"]
    assert pins.get("pip") == pip_version, lines
    assert not {"speculators", "modelscope", "datasets", "hs-connectors"} & set(pins), lines
    # The stack the role requires is part of it.
    assert {normalize(n) for n in role_required()} <= set(pins)
    for line in ("torch==2.10.0+cpu", "torch_npu==2.10.0.post4", "vllm==0.23.0+empty"):
        assert line in lines


def test_conflict_fails_naming_it_and_changes_nothing(
    npu_host: MockNpuHost, image_python: Callable[..., ImagePython]
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


# test_container_npu_mock installs the same way (the image's constraints, up to
# `speculators --version`) in three NPU-shaped containers in every CI run; this host-side
# variant, with its line-by-line pip log checks, is in make test-reliability's budget.
@pytest.mark.slow
def test_install_keeps_every_pinned_package(
    npu_host: MockNpuHost, image_python: Callable[..., ImagePython]
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


# The conflict case above runs in CI; this second conflict (outside the NPU stack) is in
# make test-reliability's budget.
@pytest.mark.slow
def test_preinstalled_outside_the_stack_stays_pinned(
    npu_host: MockNpuHost, image_python: Callable[..., ImagePython]
) -> None:
    """(c) numpy 1.26.4 in the image, outside the NPU stack; speculators 0.9.0 needs
    numpy>=2.0.0. Pinning only the stack would let pip upgrade numpy and exit 0."""
    image = image_python("5.5.4", extra={"numpy": "1.26.4"})
    assert image.preinstalled["numpy"] == "1.26.4"

    result = play(npu_host, image, timeout_s=CONFLICT_TIMEOUT_S)
    message = stage_failure(npu_host, result)

    assert "pip cannot install without changing a pinned package" in message
    assert "numpy==1.26.4" in message
    assert f"speculators {SPECULATORS_VERSION} depends on numpy" in message
    assert image.versions(["numpy", "speculators"]) == {"numpy": "1.26.4", "speculators": None}
    assert_preinstalled_untouched(image)
    assert "numpy==1.26.4" in constraint_lines(npu_host)
    assert_constraints_pin_the_image(npu_host, image)


# -- wheelhouse: downloaded on the controller for the image's Python ----------------------------

# Files a wheel set for the image must never hold: what the image has, and CUDA builds.
NEVER_IN_THE_SET = ("torch", "torch-npu", "torchvision", "torchaudio", "transformers", "vllm")


@pytest.fixture(scope="module")
def wheel_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The controller's wheelhouse cache, shared by the wheelhouse cases (one download each)."""
    return tmp_path_factory.mktemp("controller-wheelhouse")


def wheel_sets(cache: Path) -> list[Path]:
    return sorted(p for p in cache.iterdir() if p.is_dir())


def wheelhouse_overrides(cache: Path, **more: Any) -> dict[str, Any]:
    return {
        "speculators_install_source": "wheelhouse",
        "speculators_install_wheelhouse_cache": str(cache),
        **more,
    }


def test_wheelhouse_downloads_for_the_image_python(
    npu_host: MockNpuHost, image_python: Callable[..., ImagePython], wheel_cache: Path
) -> None:
    """(d) The image's Python is 3.12 (the controller's downloader is python3.11): the set is
    cp312 wheels for this host's architecture, without torch or anything else the image has;
    the host installs it with --no-index, then `speculators --version` fails on the stub torch."""
    image = image_python("5.5.4", python="3.12")
    arch = platform.machine()

    result = play(
        npu_host, image, timeout_s=INSTALL_TIMEOUT_S, overrides=wheelhouse_overrides(wheel_cache)
    )
    message = stage_failure(npu_host, result)
    assert "during: speculators --version" in message

    sets = wheel_sets(wheel_cache)
    assert len(sets) == 1, sets
    request = json.loads(sets[0].with_name(sets[0].name + ".json").read_text())
    assert request["target"]["python"].startswith("3.12."), request["target"]
    assert (request["target"]["abi"], request["target"]["arch"]) == ("cp312", arch)
    assert request["snapshot"]["preinstalled"]["torch"] == "2.10.0+cpu"
    wheels = sorted(p.name for p in sets[0].iterdir())
    print(f"\nwheel set ({len(wheels)}): {' '.join(wheels)}")
    assert all(name.endswith(".whl") for name in wheels), wheels
    names = {normalize(name.split("-")[0]) for name in wheels}
    assert {"speculators", "modelscope", "numpy", "datasets"} <= names, names
    assert not names & set(NEVER_IN_THE_SET), sorted(names & set(NEVER_IN_THE_SET))
    assert not [n for n in names if n.startswith("nvidia-")], names
    binary = [w for w in wheels if not w.endswith("-none-any.whl")]
    assert binary, wheels
    for wheel in binary:
        pythons, _abis, platforms = wheel[: -len(".whl")].split("-")[-3:]
        assert "cp311" not in pythons.split("."), wheel
        assert arch in platforms, wheel
    numpy = [w for w in wheels if w.startswith("numpy-")]
    assert numpy and "-cp312-cp312-" in numpy[0], numpy

    # Pushed as downloaded, installed without an index.
    pushed = sorted(p.name for p in (npu_host.root / "wheelhouse").iterdir())
    assert pushed == wheels
    script = (npu_host.root / "run" / f"{STAGE}.sh").read_text()
    assert "--no-index" in script
    log = (npu_host.root / "logs" / f"{STAGE}.log").read_text()
    assert "Looking in indexes" not in log
    assert "preinstalled distributions unchanged" in log, log[-3000:]
    assert image.versions(["speculators", "modelscope"]) == {
        "speculators": SPECULATORS_VERSION,
        "modelscope": MODELSCOPE_VERSION,
    }
    assert_preinstalled_untouched(image)
    assert_constraints_pin_the_image(npu_host, image)


# A second whole download (for another target), so in the reliability suite, not CI's budget.
@pytest.mark.slow
def test_wheelhouse_wheel_that_does_not_fit_is_named_before_pushing(
    npu_host: MockNpuHost, image_python: Callable[..., ImagePython], wheel_cache: Path
) -> None:
    """(e) The set is downloaded for Python 3.11 (speculators_install_wheelhouse_target), the
    image's Python is 3.12: the play stops at the check, naming a cp311 wheel and the host,
    and pushes nothing."""
    image = image_python("5.5.4", python="3.12")
    before = set(wheel_sets(wheel_cache))

    result = play(
        npu_host,
        image,
        timeout_s=INSTALL_TIMEOUT_S,
        overrides=wheelhouse_overrides(
            wheel_cache, speculators_install_wheelhouse_target={"python": "3.11"}
        ),
    )
    assert result.failed, f"expected the play to fail; stats {result.stats}\n{result.tail()}"
    stage = [f for f in result.failures if f.get("play") != REPORT_PLAY]
    assert len(stage) == 1, [(f.get("play"), f.get("task")) for f in result.failures]
    assert stage[0]["task"] == "Require every wheel to fit the host", stage[0]["task"]
    message = str(stage[0]["res"]["msg"])
    print(f"failure message:\n{message}")
    assert "do not fit localhost (CPython 3.12." in message, message
    assert re.search(r"numpy-[0-9.]+-cp311-cp311-\S+\.whl \(tags cp311-cp311-", message), message
    assert "nothing was pushed to localhost" in message

    new = sorted(set(wheel_sets(wheel_cache)) - before)
    assert len(new) == 1, new
    assert json.loads(new[0].with_name(new[0].name + ".json").read_text())["target"]["abi"] == (
        "cp311"
    )
    assert not (npu_host.root / "wheelhouse.tar").exists()
    assert not (npu_host.root / "wheelhouse").exists()
    assert image.versions(["speculators"]) == {"speculators": None}
    assert_preinstalled_untouched(image)
