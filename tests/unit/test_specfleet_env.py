"""The stage env wrapper (roles/npu_env/templates/specfleet-env.j2), rendered by a real
ansible-playbook with the role's vars/main.yml and run by bash against a fake Ascend tree:

- the CANN scripts of specfleet_cann_env_files, whose default names the AscendNPU IR script by a
  pattern (its directory is cann-<version>/), resolved to the one file of the toolkit in use;
- jemalloc preloaded as the vllm-ascend image's ~/.bashrc does, which non-interactive stages
  never read.

The preflight's use of the same lines (tasks/npu.yml) is covered with the mock NPU host in
tests/integration/test_npu_env_variants.py."""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from playrun import REPO, run_cases

TEMPLATE = REPO / "roles" / "npu_env" / "templates" / "specfleet-env.j2"
ROLE_VARS = yaml.safe_load((REPO / "roles" / "npu_env" / "vars" / "main.yml").read_text())
ROLE_DEFAULTS = yaml.safe_load((REPO / "roles" / "npu_env" / "defaults" / "main.yml").read_text())
FLEET_DEFAULTS = yaml.safe_load(
    (REPO / "roles" / "specfleet" / "defaults" / "main.yml").read_text()
)
IR = Path("share") / "info" / "ascendnpu-ir" / "bin" / "set_env.sh"
# The IR script's directory in the official CANN images (cann-container-image Dockerfiles).
IMAGE_IR_SCRIPTS = [
    f"/usr/local/Ascend/{version}/{IR}"
    for version in ("cann-9.1.0", "cann-8.5.0", "cann-9.1.0-beta.3")
]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """{case: wrapper path}, plus the fake tree's roots: one playbook run for all cases."""
    work = tmp_path_factory.mktemp("specfleet-env")
    ascend, lib = work / "Ascend", work / "lib"
    npu_vars = {
        "specfleet_env": {"profile": "npu", "runtime": "host"},
        "specfleet_cann_env_files": [
            f"{ascend}/ascend-toolkit/set_env.sh",
            f"{ascend}/cann-*/{IR}",
            f"{ascend}/nnal/atb/set_env.sh --cxx_abi=1",
        ],
        # As the image's own list: the architecture directory spelled $(uname -m).
        "_npu_env_jemalloc_paths": [
            f"{lib}/$(uname -m)-linux-gnu/libjemalloc.so.2",
            f"{lib}/lib64/libjemalloc.so.2",
        ],
    }
    cases = {
        "npu": npu_vars,
        # The shipped defaults, as they render for a real host.
        "npu-default": {
            "specfleet_env": {"profile": "npu", "runtime": "host"},
            "specfleet_cann_env_files": FLEET_DEFAULTS["specfleet_cann_env_files"],
        },
        "cpu": {**npu_vars, "specfleet_env": {"profile": "cpu", "runtime": "host"}},
    }
    tasks = []
    for name, task_vars in cases.items():
        (work / name).mkdir()
        tasks.append(
            {
                "name": name,
                "ansible.builtin.template": {
                    "src": str(TEMPLATE),
                    "dest": str(work / name / "specfleet-env"),
                    "mode": "0755",
                },
                "vars": task_vars,
            }
        )
    play_vars = {
        **ROLE_VARS,
        "npu_env_cann_ld_library_paths": ROLE_DEFAULTS["npu_env_cann_ld_library_paths"],
        "specfleet_root": str(work / "root"),
        "specfleet_npu_devices": "all",
    }
    run = run_cases(work, tasks, play_vars=play_vars)
    for name in cases:
        assert not run.results[name].get("failed"), run.results[name]
    return {
        **{name: work / name / "specfleet-env" for name in cases},
        "ascend": ascend,
        "lib": lib,
    }


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def ascend(rendered: dict[str, Any]) -> Path:
    """A fresh fake /usr/local/Ascend with two CANN versions' IR scripts, the toolkit's
    set_env.sh exporting ASCEND_TOOLKIT_HOME=<Ascend>/ascend-toolkit/latest (as CANN's does)
    with `latest` -> cann-9.1.0, and ATB's."""
    root: Path = rendered["ascend"]
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(rendered["lib"], ignore_errors=True)
    for version in ("8.5.0", "9.1.0"):
        write(root / f"cann-{version}" / IR, f"export MOCK_IR={version}\n")
    write(
        root / "ascend-toolkit" / "set_env.sh",
        f"export ASCEND_TOOLKIT_HOME={root}/ascend-toolkit/latest\n",
    )
    (root / "ascend-toolkit" / "latest").symlink_to("../cann-9.1.0")
    write(root / "nnal" / "atb" / "set_env.sh", 'export MOCK_ATB_ARGS="$*"\n')
    return root


def source(wrapper: Path, then: str = "", env: dict[str, str] | None = None) -> tuple[str, str]:
    """stdout and stderr of a bash script that sources the wrapper and runs `then`
    (builtins only: a fake jemalloc on LD_PRELOAD would stop any program started after it)."""
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(wrapper.parent)}
    done = subprocess.run(
        ["bash", "-c", f". {wrapper}\n{then}"],
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout, done.stderr


# -- CANN ------------------------------------------------------------------------------------


def test_the_default_names_the_ir_script_of_any_cann_version() -> None:
    """The official images name the IR script's directory by their CANN version: a default
    naming one version fails preflight in every other CANN's image."""
    entries = [e.split()[0] for e in FLEET_DEFAULTS["specfleet_cann_env_files"]]
    ir = [e for e in entries if e.endswith("ascendnpu-ir/bin/set_env.sh")]
    assert len(ir) == 1, entries
    for script in IMAGE_IR_SCRIPTS:
        assert fnmatch.fnmatchcase(script, ir[0]), (script, ir[0])
    assert not [e for e in entries if "cann-9" in e or "cann-8" in e], entries


def test_a_pattern_sources_the_ir_of_the_toolkit_in_use(
    rendered: dict[str, Any], ascend: Path
) -> None:
    out, err = source(rendered["npu"], 'echo "ir=$MOCK_IR atb=$MOCK_ATB_ARGS"')
    assert out.strip() == "ir=9.1.0 atb=--cxx_abi=1", err
    assert err == ""
    # ascend-toolkit/latest moved to the other version: its IR script follows.
    (ascend / "ascend-toolkit" / "latest").unlink()
    (ascend / "ascend-toolkit" / "latest").symlink_to("../cann-8.5.0")
    out, err = source(rendered["npu"], 'echo "ir=$MOCK_IR"')
    assert out.strip() == "ir=8.5.0", err


def test_one_match_is_sourced_without_a_toolkit(rendered: dict[str, Any], ascend: Path) -> None:
    shutil.rmtree(ascend / "cann-8.5.0")
    (ascend / "ascend-toolkit" / "latest").unlink()
    out, err = source(rendered["npu"], 'echo "ir=$MOCK_IR"')
    assert out.strip() == "ir=9.1.0", err


def test_several_matches_outside_the_toolkit_are_named_not_guessed(
    rendered: dict[str, Any], ascend: Path
) -> None:
    (ascend / "ascend-toolkit" / "latest").unlink()
    out, err = source(rendered["npu"], 'echo "ir=${MOCK_IR:-none} atb=$MOCK_ATB_ARGS"')
    # The others are still sourced; the entry that names no one file is said, with its matches.
    assert out.strip() == "ir=none atb=--cxx_abi=1"
    assert f"{ascend}/cann-*/{IR}: 2 matches" in err, err
    assert f"{ascend}/cann-8.5.0/{IR}" in err and f"{ascend}/cann-9.1.0/{IR}" in err, err
    assert "none inside the toolkit in use" in err, err


def test_a_missing_script_is_said_and_the_helpers_leave_nothing_behind(
    rendered: dict[str, Any], ascend: Path
) -> None:
    (ascend / "nnal" / "atb" / "set_env.sh").unlink()
    out, err = source(
        rendered["npu"],
        'echo "ir=$MOCK_IR"; declare -F _specfleet_cann_pick || echo no-function;'
        ' echo "left=${_specfleet_cann_file-unset}${_specfleet_cann_missing-unset}"',
    )
    assert out.split() == ["ir=9.1.0", "no-function", "left=unsetunset"], (out, err)
    assert f"{ascend}/nnal/atb/set_env.sh: no such file" in err, err


def test_the_pattern_is_resolved_whatever_the_callers_glob_options(
    rendered: dict[str, Any], ascend: Path
) -> None:
    done = subprocess.run(
        ["bash", "-c", f'set -f; shopt -s failglob; . {rendered["npu"]}; echo "ir=$MOCK_IR"'],
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.strip() == "ir=9.1.0", done.stderr


# -- jemalloc --------------------------------------------------------------------------------


def jemalloc(lib: Path, where: str) -> Path:
    """A fake libjemalloc.so.2 at the image's place for Ubuntu (`arch`) or openEuler (lib64)."""
    arch = subprocess.run(["uname", "-m"], capture_output=True, text=True, check=True).stdout
    folder = f"{arch.strip()}-linux-gnu" if where == "arch" else "lib64"
    return write(lib / folder / "libjemalloc.so.2", "")


def test_jemalloc_is_preloaded_first_once_and_without_an_empty_entry(
    rendered: dict[str, Any], ascend: Path
) -> None:
    lib: Path = rendered["lib"]
    ubuntu = jemalloc(lib, "arch")
    openeuler = jemalloc(lib, "lib64")
    out, _ = source(rendered["npu"], 'printf "%s" "$LD_PRELOAD"')
    assert out == str(ubuntu)  # the first that exists; nothing after it: no empty entry
    out, _ = source(rendered["npu"], 'printf "%s" "$LD_PRELOAD"', {"LD_PRELOAD": "/x/other.so"})
    assert out == f"{ubuntu}:/x/other.so"
    # Sourced again (a stage script run through the wrapper): not added twice.
    out, _ = source(rendered["npu"], f'. {rendered["npu"]}; printf "%s" "$LD_PRELOAD"')
    assert out == str(ubuntu)
    ubuntu.unlink()
    out, _ = source(rendered["npu"], 'printf "%s" "$LD_PRELOAD"')
    assert out == str(openeuler)


def test_no_jemalloc_leaves_ld_preload_alone(rendered: dict[str, Any], ascend: Path) -> None:
    out, _ = source(rendered["npu"], 'printf "%s" "${LD_PRELOAD-unset}"')
    assert out == "unset"
    out, _ = source(rendered["npu"], 'printf "%s" "$LD_PRELOAD"', {"LD_PRELOAD": "/x/other.so"})
    assert out == "/x/other.so"


def test_the_shipped_wrapper_looks_where_the_images_install_jemalloc(
    rendered: dict[str, Any],
) -> None:
    text = rendered["npu-default"].read_text()
    assert '"/usr/lib/$(uname -m)-linux-gnu/libjemalloc.so.2" "/usr/lib64/libjemalloc.so.2"' in text
    assert "'/usr/local/Ascend/cann-*/share/info/ascendnpu-ir/bin/set_env.sh'" in text
    # This machine has neither file nor /usr/local/Ascend: it still sources cleanly.
    if not Path("/usr/local/Ascend").exists():
        out, err = source(rendered["npu-default"], 'printf "%s" "${LD_PRELOAD-unset}"')
        assert out == "unset" or Path("/usr/lib64/libjemalloc.so.2").exists(), out
        assert "cann-*" in err  # said, not fatal


def test_the_cpu_profile_has_neither(rendered: dict[str, Any], ascend: Path) -> None:
    jemalloc(rendered["lib"], "arch")
    text = rendered["cpu"].read_text()
    assert "LD_PRELOAD" not in text and "_specfleet_cann_pick" not in text
    out, _ = source(rendered["cpu"], 'printf "%s|%s" "${LD_PRELOAD-unset}" "${MOCK_IR-unset}"')
    assert out == "unset|unset"
