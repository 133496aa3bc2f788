"""Every run of site.yml writes a fleet report that is never older than the truth, and the stage
graph is written once.

Each case is one real `ansible-playbook site.yml` on this machine, against a fresh work root and
reports directory under tmp_path; none needs a pipeline, so each takes seconds:

  refused setting      serve_gpu_memory_utilization=1.5: the run exits non-zero, writes a
                       report, `latest` points at it, and localhost is red with the settings
                       message; no work root is created.
  every host unreachable  two inventory hosts whose ssh port nothing listens on: the report is
                       written (Ansible would otherwise end the run before it: "NO MORE HOSTS
                       LEFT"), both hosts red "unreachable" with the connection error.
  host lost mid-run    after a refused run's report, a host that answers the provision play and
                       is unreachable from the pipeline play on: Ansible ends the playbook
                       before validate.yml, the report_net callback writes the report
                       (ended_early says where), `latest` moves to it, npu_env is shown passed.
  --check              on a reports directory that already holds a report: the check report
                       goes to <reports>/check/<id> with check/latest; `latest` is unchanged.
  --tags serve         on a fresh root: serve stops before any work (no venv, no models, no
                       serve script), naming train and the other missing upstream stages.

and the graph: roles/stage/tasks/upstream.yml, run on its own against the one declaration
(roles/specfleet/vars/main/stages.yml: specfleet_stages), gives train an upstream with convert
exactly when train_from_converted is set; no stage role lists its upstream stages itself.

Run explicitly:
    .venv/bin/python -m pytest -q tests/integration/test_report_flow.py
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from siteruns import LOW_HOST_FLOORS, free_port, playbook_env

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = REPO / ".venv" / "bin" / "ansible-playbook"
SITE = REPO / "site.yml"
INVENTORY = REPO / "inventory" / "local.yml"
HOST = "localhost"
RUN_TIMEOUT_S = 600
# The one declaration of the stages ({} when there is none: the graph tests then fail).
STAGES_FILE = REPO / "roles" / "specfleet" / "vars" / "main" / "stages.yml"
STAGE_GRAPH: dict[str, Any] = (
    yaml.safe_load(STAGES_FILE.read_text()).get("specfleet_stages") if STAGES_FILE.is_file() else {}
) or {}
REFUSED_MESSAGE = "serve_gpu_memory_utilization (specfleet_serve_gpu_memory_utilization) is 1.5"


@dataclass
class Run:
    label: str
    argv: list[str]
    rc: int
    stdout: str
    stderr: str
    seconds: float
    root: Path
    reports: Path

    def tail(self, lines: int = 80) -> str:
        out = "\n".join(self.stdout.splitlines()[-lines:])
        err = "\n".join(self.stderr.splitlines()[-20:])
        return f"$ {' '.join(self.argv)}\n--- stdout (tail)\n{out}\n--- stderr (tail)\n{err}"

    def flat(self) -> str:
        return " ".join(f"{self.stdout}\n{self.stderr}".split())


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    return free_port()


def play(
    work: Path,
    label: str,
    extravars: tuple[str, ...],
    *options: str,
    inventory: Path = INVENTORY,
    env: dict[str, str] | None = None,
) -> Run:
    root, reports = work / "root", work / "reports"
    argv = [str(ANSIBLE_PLAYBOOK), str(SITE), "-i", str(inventory), *options]
    for value in (f"specfleet_root={root}", f"specfleet_reports_dir={reports}", *extravars):
        argv += ["-e", value]
    started = time.monotonic()
    try:
        proc = subprocess.run(
            argv,
            cwd=REPO,
            env={**playbook_env(), **(env or {})},
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
        rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc = -1
        stdout, stderr = (
            out.decode(errors="replace") if isinstance(out, bytes) else (out or "")
            for out in (exc.stdout, exc.stderr)
        )
    return Run(label, argv, rc, stdout, stderr, time.monotonic() - started, root, reports)


def relaxed() -> tuple[str, ...]:
    """Free ports and low disk/RAM floors: what this machine is busy with must not fail
    npu_env's host checks."""
    return (
        f"specfleet_hidden_states_port={free_port()}",
        f"specfleet_serve_port={free_port()}",
        f"specfleet_data_port={free_port()}",
        json.dumps(LOW_HOST_FLOORS),
    )


def refused(tmp: Path) -> Run:
    return play(tmp / "refused", "refused", ("serve_gpu_memory_utilization=1.5",))


def unreachable(tmp: Path) -> Run:
    work = tmp / "unreachable"
    work.mkdir(parents=True)
    port = closed_port()
    host = {
        "ansible_connection": "ssh",
        "ansible_host": "127.0.0.1",
        "ansible_port": port,
        "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
        "specfleet_accelerator": "cpu",
    }
    inventory = work / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"gone-a": host, "gone-b": host}}}))
    return play(work, "unreachable", (), inventory=inventory)


def lost_mid_run(tmp: Path) -> tuple[Run, str, Run]:
    """A refused run leaves a report; then a run whose host is lost once the stages are
    planned: its connection is local until then and ssh to a closed port from then on, so the
    host answers npu_env and the plan, and is unreachable at speculators_install's first
    command, and Ansible ends the playbook there, before validate.yml."""
    work = tmp / "lost"
    work.mkdir(parents=True)
    first = play(work, "lost-first", ("serve_gpu_memory_utilization=1.5",))
    older = os.readlink(first.reports / "latest") if (first.reports / "latest").is_symlink() else ""
    host = {
        "ansible_connection": "{{ 'ssh' if specfleet_stage_plan is defined else 'local' }}",
        "ansible_host": "127.0.0.1",
        "ansible_port": closed_port(),
        "ansible_python_interpreter": str(REPO / ".venv" / "bin" / "python"),
        "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
        "specfleet_accelerator": "cpu",
    }
    inventory = work / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"lost-a": host}}}))
    lost = play(
        work, "lost", relaxed(), "--tags", "npu_env,speculators_install", inventory=inventory
    )
    return first, older, lost


def check_after_report(tmp: Path) -> tuple[Run, Run]:
    """A refused run leaves a report; then --check (good settings; npu_env, the one stage with
    no upstream that every run checks)."""
    work = tmp / "check"
    first = play(work, "check-first", ("serve_gpu_memory_utilization=1.5",))
    second = play(work, "check", relaxed(), "--check", "--tags", "npu_env")
    return first, second


def serve_only(tmp: Path) -> Run:
    return play(tmp / "serve-only", "serve-only", relaxed(), "--tags", "serve")


def recorded_by_ara(tmp: Path) -> Run:
    """npu_env on a fresh root with ARA on, its database under the run's directory."""
    work = tmp / "ara"
    settings = {
        "SPECFLEET_ARA": "1",
        "SPECFLEET_ARA_DATABASE": str(work / "ara" / "ansible.sqlite"),
    }
    return play(work, "ara", relaxed(), "--tags", "npu_env", env=settings)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Future[Any]]]:
    if not os.access(ANSIBLE_PLAYBOOK, os.X_OK):
        pytest.skip(f"no controller venv: {ANSIBLE_PLAYBOOK} (make setup)")
    tmp = tmp_path_factory.mktemp("report_flow")
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures: dict[str, Future[Any]] = {
            "serve-only": pool.submit(serve_only, tmp),
            "check": pool.submit(check_after_report, tmp),
            "refused": pool.submit(refused, tmp),
            "unreachable": pool.submit(unreachable, tmp),
            "lost": pool.submit(lost_mid_run, tmp),
            "ara": pool.submit(recorded_by_ara, tmp),
        }
        yield futures


def report(reports: Path, link: str = "latest") -> dict[str, Any]:
    path = reports / link / "fleet.json"
    assert path.is_file(), f"no report at {path}: {sorted(p.name for p in reports.glob('*'))}"
    return json.loads(path.read_text())


def host_of(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(h for h in doc["hosts"] if h["name"] == name)


def finished(runs: dict[str, Future[Any]], key: str) -> Any:
    return runs[key].result()


def test_a_refused_setting_is_reported_red_and_latest_points_at_it(
    runs: dict[str, Future[Any]],
) -> None:
    run = finished(runs, "refused")
    assert run.rc not in (0, -1), run.tail()
    assert not run.root.exists(), f"host work happened: {run.root} exists\n{run.tail()}"
    latest = run.reports / "latest"
    assert latest.is_symlink(), run.tail()
    ids = [p.name for p in run.reports.iterdir() if p.is_dir() and not p.is_symlink()]
    assert ids == [os.readlink(latest)], (ids, run.tail())
    doc = report(run.reports)
    assert not doc["green"], doc
    host = host_of(doc, HOST)
    assert host["failed_stage"] == "serve", host
    assert REFUSED_MESSAGE in host["error"], host["error"]
    assert host["reachable"], host
    assert host["refused"]["stage"] == "serve", host
    # The gate fails the host with the message, said once on the console: no excerpt of the
    # task file, no second copy where the check refused it.
    assert f"{HOST} is not green: settings refused (serve): " in run.flat(), run.tail()
    assert run.stdout.count(REFUSED_MESSAGE) == 1, run.stdout
    assert "Origin:" not in run.stdout and "no hosts matched" not in run.stdout, run.stdout
    md = (latest / "fleet.md").read_text()
    assert REFUSED_MESSAGE in md, md
    # Nothing ran, and every view says why, not "up to date".
    summary = run.stdout.split("SUMMARY", 1)[1]
    assert f"refused ({HOST}: serve settings)" in summary, summary
    assert "redone: nothing (the settings were refused before any host work)" in summary, summary
    assert "up to date" not in (latest / "fleet.html").read_text()
    assert "the settings were refused" in (run.reports / "index.html").read_text()


def test_every_host_unreachable_is_reported_red(runs: dict[str, Future[Any]]) -> None:
    run = finished(runs, "unreachable")
    assert run.rc not in (0, -1), run.tail()
    assert "NO MORE HOSTS LEFT" not in run.stdout, run.tail()
    doc = report(run.reports)
    assert not doc["green"] and doc["totals"]["unreachable"] == 2, doc["totals"]
    # validate wrote it; the report_net callback, which stands in only when validate never
    # started, wrote none
    ids = [p.name for p in run.reports.iterdir() if p.is_dir() and not p.is_symlink()]
    assert ids == [os.readlink(run.reports / "latest")], (ids, run.tail())
    for name in ("gone-a", "gone-b"):
        host = host_of(doc, name)
        assert not host["reachable"] and not host["green"], host
        assert host["not_green_reason"] == "unreachable", host
        assert "Connection refused" in (host["error"] or ""), host
        assert all(s["status"] == "unreachable" for s in host["stages"].values()), host
        assert host["stages"]["npu_env"]["detail"].startswith("host unreachable: "), host
        assert f"{name} is not green: unreachable: " in run.flat(), run.tail()
        # Ansible's own stats count it unreachable, as the report does (AWX reads those).
        recap = next(line for line in run.stdout.splitlines() if line.startswith(f"{name} "))
        assert "unreachable=1" in recap and "failed=0" in recap, recap
    assert "redone: nothing (no host could be reached)" in run.stdout, run.tail()


def test_a_host_lost_mid_run_still_gets_a_report_and_latest_moves(
    runs: dict[str, Future[Any]],
) -> None:
    first, older, run = finished(runs, "lost")
    assert first.rc not in (0, -1) and older, first.tail()
    assert run.rc not in (0, -1), run.tail()
    # Ansible ended the playbook in the stages play: validate.yml never started.
    assert "PLAY [Validate the fleet" not in run.stdout, run.tail()
    assert "specfleet: the run ended before its report" in run.flat(), run.tail()
    latest = os.readlink(run.reports / "latest")
    assert latest != older and (run.reports / older / "fleet.json").is_file(), (latest, older)
    doc = report(run.reports)
    assert doc["report_id"] == latest, doc["report_id"]
    assert not doc["green"], doc
    assert "Run the stages" in (doc["ended_early"] or ""), doc["ended_early"]
    host = host_of(doc, "lost-a")
    assert not host["reachable"] and host["not_green_reason"] == "unreachable", host
    assert "Connection refused" in (host["error"] or ""), host
    # what the run did before it lost the host is kept: npu_env ran before the plan
    assert host["stages"]["npu_env"]["status"] == "passed", host["stages"]["npu_env"]
    lost_at = host["stages"]["speculators_install"]
    assert lost_at["status"] == "unreachable", lost_at
    md = (run.reports / latest / "fleet.md").read_text()
    assert "The run ended before its report" in md, md


def test_check_mode_writes_its_report_apart_and_keeps_latest(
    runs: dict[str, Future[Any]],
) -> None:
    first, check = finished(runs, "check")
    assert first.rc not in (0, -1), first.tail()
    assert check.rc == 0, check.tail()
    reports = first.reports
    latest_before = os.readlink(reports / "latest")
    assert os.readlink(reports / "latest") == latest_before
    assert report(reports)["check_mode"] is False
    plan = report(reports / "check")
    assert plan["check_mode"] is True, plan
    assert (reports / "check" / plan["report_id"] / "fleet.md").is_file()
    assert os.readlink(reports / "check" / "latest") == plan["report_id"]
    assert latest_before != plan["report_id"]
    assert not check.root.exists() or not any((check.root / "state").glob("*.json")), check.tail()
    # npu_env's checks ran, and check mode redoes nothing: the summary says what would run.
    summary = check.stdout.split("SUMMARY", 1)[1]
    assert "redone:" not in summary and "would run: " in summary, summary


def test_serve_alone_on_a_fresh_root_names_the_missing_upstream_stages(
    runs: dict[str, Future[Any]],
) -> None:
    run = finished(runs, "serve-only")
    assert run.rc not in (0, -1), run.tail()
    text = run.flat()
    # convert too: the yardstick (serve_yardstick, on by default) is the converted draft.
    expected = (
        "serve needs speculators_install (the speculators environment), models (the verifier "
        "and the draft), train (the trained draft), convert (the converted draft): no stamps of "
        "them on localhost, and they do not run in this play; run site.yml, or add --tags "
        "speculators_install,models,train,convert"
    )
    assert expected in text, run.tail()
    # Before any work: no venv, no models, not even the serve script.
    for path in ("venv", "models", "run/serve.sh", "state/serve.json"):
        assert not (run.root / path).exists(), f"{path} exists\n{run.tail()}"
    assert "TASK [stage : Start: serve]" not in run.stdout, run.tail()
    host = host_of(report(run.reports), HOST)
    assert host["failed_stage"] == "serve", host
    assert "serve needs " in host["error"], host
    record = json.loads((run.root / "state" / "serve.failed.json").read_text())
    assert "add --tags speculators_install,models,train" in record["error"], record


# --- the graph, once -----------------------------------------------------------------------

GRAPH_PLAY = """
- name: Derive stages' upstream from the stage graph
  hosts: localhost
  connection: local
  gather_facts: false
  roles:
    - role: specfleet  # the stage declarations
  tasks:
    - name: Derive each stage's upstream
      ansible.builtin.include_tasks: graph_stage.yml
      loop: "{{ graph_stages }}"
      loop_control:
        loop_var: graph_stage
"""
GRAPH_STAGE = """
- name: Find the upstream stages (a missing one fails the task, as it fails the stage)
  block:
    - name: Find the upstream stages
      ansible.builtin.include_role:
        name: stage
        tasks_from: upstream
      vars:
        stage_name: "{{ graph_stage }}"
  rescue:
    - name: Keep the failure's message
      ansible.builtin.set_fact:
        graph_failed: "{{ ansible_failed_result.msg }}"
- name: Write what was derived
  ansible.builtin.copy:
    dest: "{{ graph_out }}/{{ graph_stage }}.json"
    content: >-
      {{ {'upstream': stage_upstream.run_ids, 'missing': stage_upstream.missing} | to_json }}
    mode: "0644"
"""


def derive(tmp: Path, stages: list[str], **extravars: Any) -> dict[str, dict[str, Any]]:
    """{stage: {upstream, missing}} from one run of stage/tasks/upstream.yml per stage, every
    stage having a run id unless specfleet_stage_runs says otherwise."""
    (tmp / "graph.yml").write_text(GRAPH_PLAY)
    (tmp / "graph_stage.yml").write_text(GRAPH_STAGE)
    out = tmp / f"derived-{len(list(tmp.glob('derived-*')))}"
    out.mkdir()
    values = {
        "graph_stages": stages,
        "graph_out": str(out),
        "specfleet_stage_runs": {s: f"run-{s}" for s in STAGE_GRAPH},
        # a missing upstream is recorded like a stage failure, under the work root
        "specfleet_root": str(tmp / "root"),
        "specfleet_defer_failures": True,
    }
    (tmp / "root" / "state").mkdir(parents=True, exist_ok=True)
    argv = [
        str(ANSIBLE_PLAYBOOK),
        str(tmp / "graph.yml"),
        "-i",
        "localhost,",
        "-e",
        json.dumps({**values, **extravars}),
    ]
    proc = subprocess.run(
        argv, cwd=REPO, env=playbook_env(), capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return {stage: json.loads((out / f"{stage}.json").read_text()) for stage in stages}


def test_train_depends_on_convert_exactly_when_it_trains_from_the_converted_draft(
    tmp_path: Path,
) -> None:
    assert "train" in STAGE_GRAPH, f"{STAGES_FILE} declares no specfleet_stages"
    declared = STAGE_GRAPH["train"]
    assert declared["needs_if"] == {"convert": "train_from_converted"}, declared
    assert "convert" not in declared["needs"], declared
    plain = derive(tmp_path, ["train"], train_from_converted=False)["train"]
    converted = derive(tmp_path, ["train"], train_from_converted=True)["train"]
    assert sorted(plain["upstream"]) == sorted(declared["needs"]), plain
    assert sorted(converted["upstream"]) == sorted([*declared["needs"], "convert"]), converted
    assert converted["upstream"]["convert"] == "run-convert"
    assert plain["missing"] == converted["missing"] == []


def test_every_stage_takes_its_upstream_from_the_one_declaration(tmp_path: Path) -> None:
    """No role lists upstream stages itself; each stage's derived upstream is its declaration."""
    assert STAGE_GRAPH, f"{STAGES_FILE} declares no specfleet_stages"
    literal = re.compile(r"selectattr\('key', 'in', \[")
    for path in sorted((REPO / "roles").glob("*/tasks/*.yml")):
        assert not literal.search(path.read_text()), f"{path} lists upstream stages itself"
    plain = [stage for stage, declared in STAGE_GRAPH.items() if not declared.get("needs_if")]
    for stage, got in derive(tmp_path, plain).items():
        assert sorted(got["upstream"]) == sorted(STAGE_GRAPH[stage]["needs"]), (stage, got)
    # A stage whose upstream has no run id in this play is named missing.
    # (The play loads no stage role: serve's needs_if setting is given.)
    got = derive(
        tmp_path, ["serve"], specfleet_stage_runs={"speculators_install": "x"}, serve_yardstick=True
    )["serve"]
    assert got["missing"] == ["models", "train", "convert"], got
    # Without the yardstick serve does not need the converted draft.
    got = derive(
        tmp_path,
        ["serve"],
        specfleet_stage_runs={"speculators_install": "x"},
        serve_yardstick=False,
    )["serve"]
    assert got["missing"] == ["models", "train"], got


def ara(database: Path, *args: str) -> Any:
    """ARA's own CLI (`ara ... -f json`) on the offline database the run wrote."""
    env = {**os.environ, "ARA_DATABASE_NAME": str(database), "ARA_BASE_DIR": str(database.parent)}
    done = subprocess.run(
        [str(REPO / ".venv" / "bin" / "ara"), *args, "-f", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"ara {' '.join(args)}: {done.stderr[-2000:]}"
    return json.loads(done.stdout)


def test_ara_records_the_run_and_its_cli_reads_it_back(runs: dict[str, Future[Any]]) -> None:
    run = runs["ara"].result()
    database = run.root.parent / "ara" / "ansible.sqlite"
    assert database.is_file(), run.tail()
    playbooks = ara(database, "playbook", "list")
    assert len(playbooks) == 1, playbooks
    recorded = playbooks[0]
    assert recorded["path"] == str(SITE)
    assert recorded["status"] == ("completed" if run.rc == 0 else "failed"), run.tail()
    hosts = ara(database, "host", "list", "--playbook", str(recorded["id"]))
    assert [h["name"] for h in hosts] == [HOST]
    tasks = ara(database, "task", "list", "--playbook", str(recorded["id"]), "--limit", "1000")
    names = {t["name"] for t in tasks}
    # the plays' own tasks, from npu_env's checks to the report
    assert any("the CPU profile's Python and CPU flags" in n for n in names), sorted(names)
    assert any("fleet report" in n for n in names), sorted(names)
    results = ara(database, "result", "list", "--playbook", str(recorded["id"]), "--limit", "1000")
    assert len(results) >= len(tasks) - 5 and all(r["duration"] is not None for r in results)
