"""specfleet as Ansible content is shared: the collection specfleet.ascend built from this
checkout and installed elsewhere, its roles and playbooks called by their full names from
another project; the execution environment's build context (ansible-builder create); and
specfleet.run() for Python callers.

Each run is real: ansible-galaxy builds and installs the collection, ansible-playbook runs
npu_env (CPU profile) on localhost with a fresh work root, ansible-builder writes the context.
Building the execution environment's image needs a base image this machine cannot pull, so
that step is left to `ansible-builder build` where a registry is reachable.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from siteruns import LOW_HOST_FLOORS, free_port

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / ".venv" / "bin"
GALAXY = yaml.safe_load((REPO / "galaxy.yml").read_text())
TARBALL = f"{GALAXY['namespace']}-{GALAXY['name']}-{GALAXY['version']}.tar.gz"
RUN_TIMEOUT_S = 600
# The ansible.cfg docs/usage.md gives a project that uses the installed collection.
PROJECT_CFG = """[defaults]
collections_path = {collections}
callbacks_enabled = specfleet.ascend.progress, specfleet.ascend.report_net
stdout_callback = specfleet.ascend.console
force_valid_group_names = ignore
"""
# docs/usage.md's example of calling the roles by their full names.
CHECK_HOST = [
    {
        "name": "Check the hosts with specfleet's npu_env role",
        "hosts": "all",
        "gather_facts": True,
        "roles": [{"role": "specfleet.ascend.specfleet"}],
        "tasks": [
            {
                "name": "Open specfleet's session on the host",
                "ansible.builtin.import_role": {
                    "name": "specfleet.ascend.session",
                    "tasks_from": "open",
                },
            },
            {
                "name": "Check the host",
                "ansible.builtin.import_role": {"name": "specfleet.ascend.npu_env"},
            },
            {
                "name": "Close the session",
                "ansible.builtin.import_role": {
                    "name": "specfleet.ascend.session",
                    "tasks_from": "close",
                },
            },
        ],
    }
]


def run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    """argv's output; fails the test with it when argv fails. Nothing of this checkout's
    Ansible settings is inherited (make exports ANSIBLE_CONFIG): the other project has its own."""
    inherited = {
        k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "SPECFLEET_"))
    }
    done = subprocess.run(
        argv,
        cwd=cwd,
        env={**inherited, "PATH": f"{BIN}{os.pathsep}/usr/bin:/bin", **(env or {})},
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"$ {' '.join(argv)}\n{output[-6000:]}"
    return output


def host_vars(root: Path) -> dict[str, Any]:
    return {
        "ansible_connection": "local",
        "ansible_python_interpreter": "{{ ansible_playbook_python }}",
        "specfleet_accelerator": "cpu",
        "specfleet_root": str(root),
        "specfleet_hidden_states_port": free_port(),
        "specfleet_serve_port": free_port(),
        "specfleet_data_port": free_port(),
        **LOW_HOST_FLOORS,
    }


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not (BIN / "ansible-galaxy").exists():
        pytest.skip("no controller venv (make setup)")
    dist = tmp_path_factory.mktemp("dist")
    run([str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(dist), "."], REPO)
    tarball = dist / TARBALL
    assert tarball.is_file(), sorted(p.name for p in dist.iterdir())
    return tarball


@pytest.fixture(scope="module")
def project(built: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project of its own, far from the checkout, with the collection installed beside it."""
    base = tmp_path_factory.mktemp("elsewhere")
    collections = base / "collections"
    project = base / "project"
    project.mkdir()
    (project / "ansible.cfg").write_text(PROJECT_CFG.format(collections=collections))
    run(
        [str(BIN / "ansible-galaxy"), "collection", "install", str(built), "-p", str(collections)],
        project,
        {"ANSIBLE_CONFIG": str(project / "ansible.cfg")},
    )
    installed = collections / "ansible_collections" / "specfleet" / "ascend" / "MANIFEST.json"
    assert installed.is_file(), f"not installed: {installed}"
    return project


def test_the_collection_holds_what_runs_and_nothing_of_development(built: Path) -> None:
    with tarfile.open(built) as tar:
        names = set(tar.getnames())
        manifest = json.load(tar.extractfile("MANIFEST.json"))  # type: ignore[arg-type]
    info = manifest["collection_info"]
    assert (info["namespace"], info["name"]) == ("specfleet", "ascend")
    for needed in (
        "meta/runtime.yml",
        "playbooks/site.yml",
        "roles/npu_env/tasks/main.yml",
        "roles/stage/tasks/run.yml",
        "plugins/callback/console.py",
        "plugins/action/specfleet_stage_decide.py",
        "plugins/filter/settings.py",
        "plugins/action/specfleet_session.py",
        # shipped to the hosts, run by validate on the controller, read by the report
        "python_helpers/specfleet_helpers/bundle.py",
        "python_helpers/specfleet/runner.py",
        "tests/artifacts/test_pipeline.py",
        "docs/fleet-report.schema.json",
    ):
        assert needed in names, needed
    assert info["repository"] and info["documentation"] and info["issues"], info
    for name in names:
        top = name.split("/", 1)[0]
        assert top not in {".venv", ".collections", ".work", "reports", "molecule", "scripts"}, name
        # a checkout's own, not content: its config, inventories and the site.yml wrapper
        assert top not in {"ansible.cfg", "inventory", "site.yml"}, name
        assert not name.startswith(("tests/unit", "tests/integration", "tests/fleet")), name
        assert "__pycache__" not in name, name


def test_a_role_by_its_full_name_from_another_project(project: Path) -> None:
    root = project / "root-role"
    inventory = project / "role-inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"localhost": host_vars(root)}}}))
    (project / "check-host.yml").write_text(yaml.safe_dump(CHECK_HOST, sort_keys=False))
    out = run(
        [str(BIN / "ansible-playbook"), "-i", str(inventory), "check-host.yml"],
        project,
        {"PWD": str(project), "ANSIBLE_CONFIG": str(project / "ansible.cfg")},
    )
    written = "Write the environment state file and the stage environment wrapper"
    assert f"TASK [specfleet.ascend.npu_env : {written}]" in out, out
    record = json.loads((root / "state" / "npu_env.json").read_text())
    assert record["profile"] == "cpu", record
    # the helpers the hosts run came from the installed collection
    assert list((root / "lib").glob("specfleet_helpers*.zip")), sorted((root / "lib").iterdir())


def test_the_site_playbook_by_its_full_name_reports_into_the_project(project: Path) -> None:
    root = project / "root-site"
    inventory = project / "site-inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"localhost": host_vars(root)}}}))
    out = run(
        [
            str(BIN / "ansible-playbook"),
            "-i",
            str(inventory),
            "specfleet.ascend.site",
            "--tags",
            "npu_env",
        ],
        project,
        {"PWD": str(project), "ANSIBLE_CONFIG": str(project / "ansible.cfg")},
    )
    report = json.loads((project / "reports" / "latest" / "fleet.json").read_text())
    host = report["hosts"][0]
    assert host["stages"]["npu_env"]["status"] == "passed", host
    summary = out[out.index("SUMMARY") :]
    assert f"report: {project / 'reports'}/" in summary, summary
    assert "FAILED - RETRYING" not in out


def test_the_callback_is_documented_where_installed(project: Path) -> None:
    out = run(
        [str(BIN / "ansible-doc"), "-t", "callback", "specfleet.ascend.console"],
        project,
        {"ANSIBLE_CONFIG": str(project / "ansible.cfg")},
    )
    assert "task_timings" in out and "SPECFLEET_TASK_TIMINGS" in out, out


def pins(path: Path) -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.\-\[\]]+)==(\S+)", line.strip())
        if match:
            found[match.group(1)] = match.group(2)
    return found


def test_the_execution_environment_build_context(built: Path, tmp_path: Path) -> None:
    """ansible-builder create on a copy of the definition with the built collection in dist/:
    the Containerfile and _build/ hold the pinned Ansible, specfleet's Python and system
    requirements and the collection. (ansible-builder build would need the base image.)"""
    for name in ("execution-environment.yml", "bindep.txt", "requirements/runtime.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, tmp_path / name)
    (tmp_path / "dist").mkdir()
    shutil.copy(built, tmp_path / "dist" / built.name)
    run(
        [
            str(BIN / "ansible-builder"),
            "create",
            "--file",
            "execution-environment.yml",
            "--context",
            "context",
        ],
        tmp_path,
    )
    context = tmp_path / "context"
    # Containerfile where podman is installed, Dockerfile where it is not (ansible-builder's
    # default runtime is podman, and create names the file for the runtime it finds).
    written = [
        context / name for name in ("Containerfile", "Dockerfile") if (context / name).is_file()
    ]
    assert len(written) == 1, sorted(context.iterdir())
    containerfile = written[0].read_text()
    controller = pins(REPO / "requirements" / "controller.txt")
    for package in ("ansible-core", "ansible-runner"):
        assert f"{package}=={controller[package]}" in containerfile, (package, containerfile)
    assert re.search(r'^ARG EE_BASE_IMAGE="?fedora:42"?$', containerfile, re.M), containerfile
    assert "ansible-galaxy collection install --offline" in containerfile, containerfile
    build = context / "_build"
    assert pins(build / "requirements.txt") == pins(REPO / "requirements" / "runtime.txt")
    assert "openssh-clients [platform:rpm]" in (build / "bindep.txt").read_text()
    assert (build / "collections" / built.name).is_file(), sorted(build.rglob("*"))
    # what the execution environment installs is what the controller venv has
    runtime = pins(REPO / "requirements" / "runtime.txt")
    assert all(controller.get(name, version) == version for name, version in runtime.items())


ENTRY_POINT = """
import json, sys
import specfleet
result = specfleet.run(inventory=sys.argv[1], extravars=json.loads(sys.argv[2]), tags="npu_env")
print("RESULT " + json.dumps({
    "rc": result.rc,
    "status": result.status,
    "hosts": {name: vars(h) for name, h in result.hosts.items()},
    "report_dir": str(result.report_dir),
    "summary": result.summary,
    "npu_env": result.report["hosts"][0]["stages"]["npu_env"]["status"],
}))
"""


def test_the_python_entry_point(tmp_path: Path) -> None:
    """specfleet.run() from the controller venv's Python with nothing of it on PATH: the
    console streams as it would in a shell, and the result names each host's recap and the
    report."""
    root, reports = tmp_path / "root", tmp_path / "reports"
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"localhost": host_vars(root)}}}))
    done = subprocess.run(
        [
            str(BIN / "python"),
            "-c",
            ENTRY_POINT,
            str(inventory),
            json.dumps({"specfleet_reports_dir": str(reports)}),
        ],
        cwd=tmp_path,
        env={
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("ANSIBLE_", "SPECFLEET_", "VIRTUAL_ENV"))
        }
        | {"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-4000:]
    result = json.loads(out.rsplit("RESULT ", 1)[1])
    assert result["rc"] == 0 and result["status"] == "successful", result
    assert result["hosts"]["localhost"]["failed"] == 0, result
    assert result["hosts"]["localhost"]["ok"] > 0, result
    assert result["npu_env"] == "passed", result
    assert Path(result["report_dir"]).parent == reports, result
    assert (Path(result["report_dir"]) / "fleet.html").is_file()
    assert result["summary"][-1].startswith(f"report: {result['report_dir']}/fleet.html"), result
    # the console streamed: plays, recap and summary, without the poll noise
    assert "PLAY [Run the stages" in out and "PLAY RECAP" in out and "SUMMARY" in out, out
    assert "FAILED - RETRYING" not in out
