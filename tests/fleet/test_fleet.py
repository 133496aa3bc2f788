"""The fleet scenario's checks (molecule/fleet): four real hosts, one per hardware group and a
second in ascend-950, ran the CPU pipeline through controller sources (a950-node1 in a work root
with a space); ascend-950's two hosts are one job (specfleet_job): the data once, the hidden
states half each, one torchrun world, the checkpoints on their shared storage. The side effect
then ran the fleet once more with train broken on ascend-950 on purpose, the trained draft's
weights deleted on a3-node1 and a serve API key set there. Checked here:
- the reports: the converge run's is green on every host, the broken run's shows ascend-950's
  hosts failed at train (with the error, log tail and a quoted re-run command) while a2-node1
  and a3-node1 passed;
- the job (in container runtime: each host's stages and checks in its stage container, the
  job's shared directory mounted there): each host dumped its share of the hidden states
  (counted), its ranks were its share of one torchrun world of 2 x 2 ranks (their logs), both
  hosts publish the same draft (the
  checksum); a950-node2 crashed mid-training: a950-node1's train failed within seconds, the
  report names a950-node2 as lost, and the next run resumed from the shared checkpoints, green;
- the damaged host redid exactly train and serve, and its serve proved a request without the
  key is refused (HTTP 401); a2-node1, where nothing changed, redid nothing;
- the key is in no file of any host's work root and in no report;
- per-group settings (specfleet_hardware_groups, roles/specfleet/defaults) landed on the hosts
  of that group, and no other;
- controller sources: models and wheels came from the controller;
- each host is its own machine (hostname, filesystem);
- serve_mode service (a2-node1, a3-node1): the endpoint is left serving what its last passing
  serve run checked (same launcher, same draft release); a3-node1's redeployed by the broken
  run (with the key, which reaches the server and no file of the work root);
- a failed rollout (the side effect's last run: a new draft for both, one host per batch,
  a2-node1's new endpoint broken): a2-node1 fails its checks and serves its previous draft
  again, the rollout stops, a3-node1 is held with its previous draft and the report says why;
- last, a3-node1's server process is killed: its supervisor brings the endpoint back.
Run by `molecule test -s fleet` (verify), with the hosts of the scenario's inventory.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import markupsafe
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
REPORTS = Path(os.environ.get("SPECFLEET_REPORTS_DIR", "/tmp/specfleet-molecule/fleet/reports"))
API_KEY_FILE = Path("/tmp/specfleet-molecule/fleet/serve-api-key.yml")
FLEET_GROUPS = ("atlas-a2", "atlas-a3", "ascend-950")
BROKEN_HOST, BROKEN_STAGE = "a950-node1", "train"
# ascend-950's two hosts train one draft (molecule/fleet/group_vars/ascend-950.yml); the broken
# run broke train on both (a job's settings are its group's).
JOB, JOB_HOSTS = "ascend-950", ("a950-node1", "a950-node2")
ALL_HOSTS = {"a2-node1", "a3-node1", *JOB_HOSTS}
# From a host's crash to the failure of the job on the other (with the stage poll's delay).
JOB_FAILS_WITHIN_S = 60
JOB_LOST = Path("/tmp/specfleet-molecule/fleet/job-lost.json")
# Its trained draft's weights deleted before the side effect's run, which set a serve API key
# there (molecule/fleet).
DAMAGED_HOST = "a3-node1"
# serve_mode service there (molecule/fleet/host_vars); a950-node1 keeps smoke.
SERVICE_HOSTS = ("a2-node1", "a3-node1")
# The first batch of the side effect's failed rollout: its new endpoint broken on purpose.
ROLLOUT_FAILED_HOST = "a2-node1"
STAGES = [
    "npu_env",
    "speculators_install",
    "models",
    "convert",
    "data",
    "hidden_states",
    "train",
    "serve",
]


def reports() -> list[dict[str, Any]]:
    """Every fleet report of the scenario, oldest first."""
    found = []
    for path in sorted(REPORTS.glob("*/fleet.json")):
        if path.parent.is_symlink():
            continue  # latest -> the newest of them
        found.append(json.loads(path.read_text()) | {"_dir": str(path.parent)})
    assert found, f"no fleet report under {REPORTS}"
    return found


def by_host(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {h["name"]: h for h in report["hosts"]}


def group_vars(group: str) -> dict[str, Any]:
    """The group's entry of specfleet_hardware_groups, by the specfleet_* names hosts see."""
    defaults = (REPO / "roles" / "specfleet" / "defaults" / "main.yml").read_text()
    entry = yaml.safe_load(defaults)["specfleet_hardware_groups"][group]
    return {"specfleet_hardware_family": group, **{f"specfleet_{k}": v for k, v in entry.items()}}


def host_group(host) -> str:
    groups = [g for g in host.ansible.get_variables()["group_names"] if g in FLEET_GROUPS]
    assert len(groups) == 1, groups
    return groups[0]


def root_of(host) -> str:
    """The host's work root, from the scenario's host_vars (a950-node1's has a space)."""
    return host.ansible.get_variables()["specfleet_root"]


def api_key() -> str:
    key = yaml.safe_load(API_KEY_FILE.read_text())["fleet_scenario_serve_api_key"]
    assert isinstance(key, str) and key.startswith("sfkey-") and len(key) > 20
    return key


def latest() -> dict[str, Any]:
    """The broken run's report (the side effect's first run: molecule/fleet/side_effect.yml)."""
    return reports()[2]


def rollout_report() -> dict[str, Any]:
    """The side effect's third run: the failed rollout to a2-node1 and a3-node1."""
    found = reports()
    assert len(found) == 6, [r["_dir"] for r in found]
    return found[3]


def job_lost_report() -> dict[str, Any]:
    """The side effect's fourth run: ascend-950's job, a950-node2 crashed mid-training."""
    return reports()[4]


def job_resumed_report() -> dict[str, Any]:
    """The side effect's last run: ascend-950's job again, resumed."""
    return reports()[5]


def read_json(host, path: str) -> dict[str, Any]:
    f = host.file(path)
    assert f.exists, f"{path} missing on {host.backend.get_hostname()}"
    return json.loads(f.content_string)


# --- reports --------------------------------------------------------------------------------


def test_first_report_is_green_on_every_host():
    first = reports()[0]
    assert first["schema"] == "specfleet.fleet/1"
    assert first["green"], first["totals"]
    hosts = by_host(first)
    assert set(hosts) == ALL_HOSTS
    assert {h["group"] for h in hosts.values()} == set(FLEET_GROUPS)
    for name, h in hosts.items():
        assert all(s["status"] == "passed" for s in h["stages"].values()), (name, h["stages"])
        assert h["artifact_tests"]["failed"] == 0 and h["artifact_tests"]["passed"] > 10, h[
            "artifact_tests"
        ]


def test_idempotent_report_says_up_to_date_everywhere():
    second = reports()[1]
    first_id = reports()[0]["report_id"]
    for name, h in by_host(second).items():
        details = {stage: s["detail"] for stage, s in h["stages"].items()}
        assert all(d == "up to date" for d in details.values()), (name, details)
        # Nothing the artifact suite reads changed on any host (every file under the work root
        # by its stat facts, the stamps, the versions): the converge run's pass stands, named.
        tests = h["artifact_tests"]
        assert tests["reused_from"] == first_id and tests["passed"] > 10, (name, tests)


def test_broken_run_reports_the_failed_host_and_passes_the_others():
    report = latest()
    assert not report["green"]
    hosts = by_host(report)
    broken = hosts[BROKEN_HOST]
    assert broken["failed_stage"] == BROKEN_STAGE
    assert broken["stages"][BROKEN_STAGE]["status"] == "failed"
    assert broken["stages"]["serve"]["status"] == "not reached"
    assert "--specfleet-broken-on-purpose" in "\n".join(broken["log_tail"]), broken["log_tail"]
    # its work root has a space: the command a user pastes must quote it
    assert broken["rerun"] == "bash " + shlex.quote("/srv/spec fleet/run/train.sh"), broken
    for name in ("a2-node1", "a3-node1"):
        assert hosts[name]["green"], hosts[name]
    # the job's other host failed at train too, with the same broken argument
    other = hosts["a950-node2"]
    assert other["failed_stage"] == BROKEN_STAGE, other["stages"]
    assert "--specfleet-broken-on-purpose" in "\n".join(other["log_tail"]), other["log_tail"]
    assert report["totals"]["not_green"] == 2
    # The artifact suite ran again where a stage was redone, and only there.
    assert hosts["a2-node1"]["artifact_tests"]["reused_from"] == reports()[0]["report_id"]
    assert hosts[DAMAGED_HOST]["artifact_tests"]["reused_from"] is None
    assert hosts[DAMAGED_HOST]["artifact_tests"]["passed"] > 10


def ran(stage: dict[str, Any]) -> bool:
    return stage["status"] == "passed" and stage["detail"].startswith("ran: ")


def test_broken_run_redid_exactly_what_changed_on_the_green_hosts():
    hosts = by_host(latest())
    # a2-node1: nothing changed, nothing was redone
    a2 = hosts["a2-node1"]["stages"]
    assert [s for s in STAGES if ran(a2[s])] == [], a2
    # a3-node1: train's output was damaged; train and serve (which it feeds, and which takes
    # the key) were redone
    a3 = hosts[DAMAGED_HOST]["stages"]
    assert [s for s in STAGES if ran(a3[s])] == ["train", "serve"], a3
    assert a3["train"]["detail"].startswith("ran: artifacts no longer valid"), a3["train"]
    assert "api_key_set" in a3["serve"]["detail"], a3["serve"]
    for name, stages in (("a2-node1", a2), (DAMAGED_HOST, a3)):
        for stage in STAGES:
            if not ran(stages[stage]):
                assert stages[stage]["detail"] == "up to date", (name, stage, stages[stage])


def test_broken_run_markdown_and_junit():
    latest = Path(reports()[2]["_dir"])
    md = (latest / "fleet.md").read_text()
    assert "**NOT GREEN**" in md and BROKEN_HOST in md
    row = next(line for line in md.splitlines() if line.startswith(f"| {BROKEN_HOST} "))
    assert "FAILED" in row and "not reached" in row, row
    assert "--specfleet-broken-on-purpose" in md  # the log tail
    suites = ET.parse(latest / "junit.xml").getroot()
    failures = [
        (suite.get("name"), case.get("name"))
        for suite in suites.iter("testsuite")
        for case in suite.iter("testcase")
        if case.find("failure") is not None
    ]
    assert sorted(failures) == [(h, BROKEN_STAGE) for h in JOB_HOSTS], failures


def test_reports_hold_no_secrets():
    key = api_key()
    leaks = [
        str(path)
        for path in REPORTS.rglob("*")
        if path.is_file() and not path.is_symlink() and key in path.read_text(errors="replace")
    ]
    assert leaks == [], f"the serve API key is in {leaks}"
    for report in reports():
        for name in ("fleet.json", "fleet.md", "fleet.html", "junit.xml", "hosts.json"):
            text = (Path(report["_dir"]) / name).read_text()
            assert "VLLM_API_KEY=" not in text and "MODELSCOPE_API_TOKEN=" not in text


def test_every_report_has_its_page_and_the_index_lists_them_newest_first():
    dirs = [Path(r["_dir"]).name for r in reports()]
    assert all((REPORTS / d / "fleet.html").is_file() for d in dirs)
    index = (REPORTS / "index.html").read_text()
    listed = re.findall(r'data-report="([^"]+)"', index)
    assert listed == sorted(dirs, reverse=True)
    # the failed run's page shows the broken host failed, with its re-run command
    failed = next(r for r in reports() if not by_host(r).get(BROKEN_HOST, {}).get("green", True))
    page = (Path(failed["_dir"]) / "fleet.html").read_text()
    assert f'data-host="{BROKEN_HOST}"' in page and 'data-green="no"' in page
    rerun = by_host(failed)[BROKEN_HOST]["rerun"]
    assert str(markupsafe.escape(rerun)) in page


# --- per host -----------------------------------------------------------------------------


def test_host_is_its_own_machine(host):
    name = host.backend.get_hostname()
    root = root_of(host)
    assert host.check_output("hostname") == name
    assert host.file(f"{root}/state/npu_env.json").exists
    # /srv is the host's own: another host's work root is not visible here
    others = ALL_HOSTS - {name}
    stamps = {read_json(host, f"{root}/state/npu_env.json").get("host"), name}
    assert not others & stamps


def test_group_settings_landed_on_this_host(host):
    group = host_group(host)
    expected = group_vars(group)
    root = root_of(host)
    env = read_json(host, f"{root}/state/npu_env.json")
    assert env["hardware_family"] == expected["specfleet_hardware_family"] == group
    settings = env["group_settings"]
    assert settings["npu_devices_per_host"] == expected["specfleet_npu_devices_per_host"]
    assert settings["npu_hbm_mb_per_device"] == expected["specfleet_npu_hbm_mb_per_device"]
    assert settings["image_tag_suffix"] == expected["specfleet_image_tag_suffix"]
    if host.backend.get_hostname() == ROLLOUT_FAILED_HOST:
        # Its serve stamp went with the failed rollout; the endpoint it went back to says it.
        config = served_config(host, root)
        assert config["num_speculative_tokens"] == expected["specfleet_num_speculative_tokens"]
        return
    serve = read_json(host, f"{root}/state/serve.json")["inputs"]
    assert serve["gpu_memory_utilization"] == expected["specfleet_serve_gpu_memory_utilization"]
    assert (
        serve["speculative_config"]["num_speculative_tokens"]
        == expected["specfleet_num_speculative_tokens"]
    )


def test_models_and_wheels_came_from_the_controller(host):
    root = root_of(host)
    models = read_json(host, f"{root}/state/models.json")
    assert models["inputs"]["source"] == "controller", models["inputs"]
    install = read_json(host, f"{root}/state/speculators_install.json")
    assert install["inputs"]["source"] == "wheelhouse", install["inputs"]
    wheelhouse = install["metrics"]["wheelhouse"]
    assert wheelhouse["wheels"] > 100 and wheelhouse["bytes"] > 500_000_000, wheelhouse
    # pushed once, as one tar of the whole set
    assert wheelhouse["pushed_bytes"] >= wheelhouse["bytes"], wheelhouse


@pytest.mark.parametrize("stage", STAGES[1:])
def test_stage_stamp_present(host, stage):
    name = host.backend.get_hostname()
    root = root_of(host)
    if (name, stage) == (ROLLOUT_FAILED_HOST, "serve"):
        # withdrawn when the failed rollout started the stage; the failure record says why
        # (ascend-950's train, broken and then lost, passed in the side effect's last run)
        assert not host.file(f"{root}/state/{stage}.json").exists
        failure = read_json(host, f"{root}/state/{stage}.failed.json")
        assert failure["stage"] == stage and failure["host"] == name
        assert failure["rerun"] == "bash " + shlex.quote(f"{root}/run/{stage}.sh"), failure
        return
    stamp = read_json(host, f"{root}/state/{stage}.json")
    assert stamp["host"] == name
    assert not host.file(f"{root}/state/{stage}.failed.json").exists


def test_serve_refused_requests_without_the_key(host):
    name = host.backend.get_hostname()
    root = root_of(host)
    if name == ROLLOUT_FAILED_HOST:
        # its stamp went with the failed rollout; the result it still serves had no key
        assert "auth" not in read_json(host, f"{root}/serve/result.json")
        return
    serve = read_json(host, f"{root}/state/serve.json")
    if name != DAMAGED_HOST:
        # no key was set there: serve kept its unkeyed stamp
        assert serve["inputs"]["api_key_set"] is False, serve["inputs"]
        return
    assert serve["inputs"]["api_key_set"] is True
    assert serve["inputs"]["host"] == "127.0.0.1"
    assert serve["metrics"]["api_key_enforced"] is True, serve["metrics"]
    auth = read_json(host, f"{root}/serve/result.json")["auth"]
    assert (auth["without_key"], auth["wrong_key"], auth["ok"]) == (401, 401, True), auth


def test_api_key_is_in_no_file_of_the_work_root(host):
    root = root_of(host)
    # grep's own command line holds the key on the host for a moment; a test may.
    found = host.run("grep -rlF -e %s -- %s", api_key(), root)
    assert found.rc == 1 and found.stdout == "", f"key found: {found.stdout}{found.stderr}"


def served_config(host, root: str) -> dict[str, Any]:
    """The speculative config of the server the service runs now, from its command line."""
    running = read_json(host, f"{root}/run/serve.service.main.json")
    cmdline = host.file(f"/proc/{running['main_pid']}/cmdline").content_string.split("\0")
    return json.loads(cmdline[cmdline.index("--speculative-config") + 1])


def test_the_endpoint_left_serving_is_the_one_last_deployed_and_checked(host):
    name = host.backend.get_hostname()
    root = root_of(host)
    if name not in SERVICE_HOSTS:
        serve = read_json(host, f"{root}/state/serve.json")
        assert serve["inputs"]["mode"] == "smoke"
        assert not host.file(f"{root}/run/serve.service.json").exists
        return
    record = read_json(host, f"{root}/run/serve.service.json")
    assert record["manager"] == "specfleet"  # no systemd as init on these hosts
    running = read_json(host, f"{root}/run/serve.service.main.json")
    # The result of the host's last passing serve run (a failed one leaves it in place).
    checked = read_json(host, f"{root}/serve/result.json")["service"]
    # Whatever the rollout did, each host serves exactly what that run checked: the same
    # launcher, the same draft release, which is still there.
    assert record["launcher_sha256"] == checked["launcher_sha256"], (record, checked)
    assert host.file(record["launcher"]).sha256sum == checked["launcher_sha256"]
    config = served_config(host, root)
    assert config["method"] == "dflash" and config["model"].startswith(f"{root}/drafts/"), config
    assert host.file(config["model"]).is_directory, config
    assert running["restarts"] == 0, running
    if name == ROLLOUT_FAILED_HOST:
        # Deployed by the converge, kept by the no-op run and the broken run, then redeployed
        # with its previous launcher when the rollout's new endpoint failed its checks.
        log = host.file(f"{root}/logs/serve.log").content_string
        assert "back to the draft served before" in log, log[-2000:]
        assert "serving the previous draft again" in log, log[-2000:]
    else:
        # Deployed by the broken run (a new draft and the key), held by the rollout: the same
        # server process since that deploy checked it.
        assert running["main_pid"] == checked["main_pid"], (running, checked)
        serve = read_json(host, f"{root}/state/serve.json")
        assert serve["inputs"]["mode"] == "service"
        assert serve["inputs"]["speculative_config"]["model"] == config["model"]
        assert ran(by_host(latest())[name]["stages"]["serve"])


def test_the_failed_rollout_stopped_after_its_first_batch():
    report = rollout_report()
    hosts = by_host(report)
    assert set(hosts) == set(SERVICE_HOSTS)
    assert not report["green"]
    # a2-node1, the first batch: its new endpoint failed (the broken flag), named with its error.
    first = hosts["a2-node1"]
    assert first["failed_stage"] == "serve", first["stages"]["serve"]
    assert "--specfleet-broken-on-purpose" in "\n".join(first["log_tail"]), first["log_tail"]
    assert first["stages"]["train"]["detail"].startswith("ran: "), first["stages"]["train"]
    # a3-node1, the next batch: retrained like the first, but its endpoint held.
    held = hosts[DAMAGED_HOST]
    assert held["stages"]["train"]["detail"].startswith("ran: "), held["stages"]["train"]
    serve = held["stages"]["serve"]
    assert serve["status"] == "skipped", serve
    assert serve["detail"].startswith("held: rollout stopped after a2-node1 failed its checks"), (
        serve
    )
    assert "still serving its previous draft" in serve["detail"], serve
    assert "serve held" in held["not_green_reason"], held["not_green_reason"]


def test_a_killed_server_comes_back_under_its_supervisor(host):
    """Last (it changes the host): a3-node1's endpoint, held by the rollout, loses its server
    process; its supervisor starts it again after serve_service_restart_delay_s, and the
    endpoint answers /health again, with no specfleet run."""
    if host.backend.get_hostname() != DAMAGED_HOST:
        pytest.skip(f"one serving host is enough: {DAMAGED_HOST}")
    root = root_of(host)
    record = read_json(host, f"{root}/run/serve.service.json")
    before = read_json(host, f"{root}/run/serve.service.main.json")
    assert host.run(f"kill -9 {int(before['main_pid'])}").rc == 0
    health = (
        "import sys, urllib.request as u; o = u.build_opener(u.ProxyHandler({}));"
        " print(o.open(sys.argv[1], timeout=5).status)"
    )
    url = f"http://{record['host']}:{record['port']}/health"
    deadline = time.monotonic() + 600
    while True:
        now = read_json(host, f"{root}/run/serve.service.main.json")
        probe = host.run("python3 -c %s %s", health, url)
        if now["main_pid"] != before["main_pid"] and probe.stdout.strip() == "200":
            break
        assert time.monotonic() < deadline, f"the endpoint did not come back: {now}"
        time.sleep(2)
    assert now["restarts"] == before["restarts"] + 1, (before, now)
    assert now["supervisor_pid"] == before["supervisor_pid"], (before, now)
    log = host.file(f"{root}/logs/serve.service.log").content_string
    assert f"restart {now['restarts']} in" in log, log[-2000:]


# --- the job (ascend-950) -------------------------------------------------------------------


def job_of(report: dict[str, Any]) -> dict[str, Any]:
    (job,) = report["jobs"]
    assert job["name"] == JOB and job["hosts"] == list(JOB_HOSTS), job
    return job


def test_the_job_prepared_its_data_once_and_split_the_hidden_states():
    job = job_of(reports()[0])
    assert (job["nodes"], job["nproc_per_node"], job["ranks"]) == (2, 2, 4), job
    rows = job["rows"]
    first, second = job["per_host"]
    # speculators' generate-offline-data --world-size 2 --rank r: contiguous halves
    assert first["rows_first"] == 0 and first["hidden_state_files"] == (rows + 1) // 2, job
    assert second["rows_first"] == (rows + 1) // 2, job
    assert first["hidden_state_files"] + second["hidden_state_files"] == rows, job
    hosts = by_host(reports()[0])
    # The data ran once, on the job's first host; its second host checked and recorded it.
    assert hosts["a950-node1"]["stages"]["data"]["detail"].startswith("ran: "), hosts
    assert hosts["a950-node2"]["stages"]["data"]["detail"].startswith("ran: "), hosts


def test_the_job_trains_one_draft_on_every_host():
    for report in (reports()[0], job_resumed_report()):
        job = job_of(report)
        assert job["green"] and job["same_draft"] and job["draft_sha256"], job
        assert job["lost"] == [], job


def test_the_job_lost_a_host_within_seconds_and_named_it():
    lost = json.loads(JOB_LOST.read_text())
    assert 0 <= lost["failed_after_s"] < JOB_FAILS_WITHIN_S, lost
    report = job_lost_report()
    job = job_of(report)
    assert job["lost"] == ["a950-node2"] and not job["green"], job
    hosts = by_host(report)
    survivor = hosts["a950-node1"]
    assert survivor["failed_stage"] == "train", survivor["stages"]
    assert not hosts["a950-node2"]["reachable"], hosts["a950-node2"]
    # What a user reads: the lost peer's address in the collective's error. gloo says "reset"
    # or "closed" by peer, depending on where its read was when the connection went.
    address = by_host(job_resumed_report())["a950-node2"]["settings"]["job"]["address"]
    read = "\n".join(survivor["log_tail"]) + (survivor["error"] or "")
    assert re.search(r"Connection (reset|closed) by peer", read), read
    assert f"[{address}]" in read, (address, read)


def test_the_job_resumed_from_the_shared_checkpoints():
    report = job_resumed_report()
    assert report["green"], report["totals"]
    for name in JOB_HOSTS:
        train = by_host(report)[name]["stages"]["train"]
        assert train["detail"].startswith("ran: "), train


def test_this_hosts_ranks_were_its_share_of_one_world(host):
    """The resumed run's ranks on this host (its train log): node r of the job ran global
    ranks 2r and 2r + 1 of one world of 4; the job's first host, which has rank 0, resumed
    from the epoch the lost run had saved."""
    name = host.backend.get_hostname()
    if name not in JOB_HOSTS:
        pytest.skip("not a host of the job")
    log = host.file(f"{root_of(host)}/logs/train.log").content_string
    started = set(re.findall(r"backend gloo, rank (\d+) of (\d+)\)", log))
    node = JOB_HOSTS.index(name)
    assert started == {(str(2 * node), "4"), (str(2 * node + 1), "4")}, started
    if node == 0:
        resumed = re.search(r"Resuming training on epoch (\d+)", log)
        assert resumed and int(resumed.group(1)) >= 1, log[-3000:]
    stamp = read_json(host, f"{root_of(host)}/state/train.json")
    sha = next(f["sha256"] for f in stamp["metrics"]["files"] if f["name"] == "model.safetensors")
    assert host.file(f"{stamp['artifacts']['draft']}/model.safetensors").sha256sum == sha
    assert sha == job_of(job_resumed_report())["draft_sha256"]


def test_the_jobs_stages_ran_in_this_hosts_stage_container(host):
    """ascend-950's job in container runtime, the npu default (group_vars/ascend-950.yml): each
    host's stage container mounts the job's shared directory at the same path, beside its work
    root; the stage scripts and the job's checks ran in it (its wrapper execs into it); after
    a950-node2's crash its container was recreated, not left as the engine recorded it."""
    name = host.backend.get_hostname()
    if name not in JOB_HOSTS:
        pytest.skip("not a host of the job")
    root = root_of(host)
    env = read_json(host, f"{root}/state/npu_env.json")
    assert env["runtime"] == "container", env
    container = env["container"]
    assert container["engine"] == "podman" and container["name"] == f"specfleet-{name}", container
    inspected = json.loads(host.check_output("podman container inspect %s", container["name"]))[0]
    assert inspected["State"]["Running"], inspected["State"]
    mounts = {m["Destination"]: m["Source"] for m in inspected["Mounts"]}
    assert mounts.get("/srv/nfs") == "/srv/nfs" and mounts.get(root) == root, mounts
    # What the stages see there: the job's shared data, through the container's own view.
    seen = host.run(
        "%s sh -c 'ls /srv/nfs/ascend-950/.specfleet/hosts; cat /proc/1/cgroup'",
        f"{root}/run/specfleet-env",
    )
    assert seen.rc == 0, seen.stderr
    assert {"a950-node1.json", "a950-node2.json"} <= set(seen.stdout.split()), seen.stdout
    # The crash killed a950-node2's container with its host while podman still recorded it
    # running: the next run recreated it (podman refuses exec and start on such a container).
    if name == "a950-node2":
        created = host.check_output(
            "podman container inspect --format '{{.Created}}' %s", container["name"]
        )
        crashed = json.loads(JOB_LOST.read_text())["crashed"]
        assert created[:19] > crashed[:19], (created, crashed)
    # speculators went into the image's Python: its stamp is the container image's.
    install = read_json(host, f"{root}/state/speculators_install.json")
    assert install["inputs"]["image_id"] == container["image_id"], install["inputs"]
    assert install["inputs"]["python"] == f"{root}/venv/bin/python", install["inputs"]
