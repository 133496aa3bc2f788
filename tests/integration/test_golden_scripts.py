"""The NPU stage scripts of one host of each hardware group, and of both hosts of a two-host A3
job, kept as reviewed golden files.

tests/golden/render.yml renders them the way a run does: one real `ansible-playbook --check
--diff` against tests/golden/inventory.yml (a2-node01 in atlas-a2, the runbook's one-card host
on the host runtime; a3-node01 in atlas-a3; a950-node01 in ascend-950; a3-pair01 and a3-pair02,
an A3 job of 2 x 16 ranks: tests/golden/npu/atlas-a3-job-node<n>/ holds the stages a job
changes; its convert and serve must render as a3-node01's), with the repo's
specfleet role (the fleet-wide defaults), the roles' defaults and settings checks, and each
stage role's own task file, whose
stage/run.yml "Template the stage script" task would write the script; --diff gives its
content. Only what npu_env and the upstream stages would find on an NPU host is mocked (MOCK
facts in render.yml and the inventory: there is no NPU here).

The scripts are compared with tests/golden/npu/<group>/<stage>.sh, so any change to an NPU
command line shows up as a diff. Review the diff; when it is what you meant, regenerate all of
them with one command and commit the result:

    SPECFLEET_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/integration/test_golden_scripts.py -q

A second test asserts what each group must get in its scripts (devices, torchrun processes,
image, context and batch sizes), so a regenerated golden set cannot quietly lose them.
The render takes ~15-25 s on 2 idle cores.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = REPO / ".venv" / "bin" / "ansible-playbook"
GOLDEN = REPO / "tests" / "golden"
PLAYBOOK = GOLDEN / "render.yml"
INVENTORY = GOLDEN / "inventory.yml"
GOLDEN_NPU = GOLDEN / "npu"
UPDATE = os.environ.get("SPECFLEET_UPDATE_GOLDEN") == "1"
REGENERATE = (
    "SPECFLEET_UPDATE_GOLDEN=1 .venv/bin/python -m pytest "
    "tests/integration/test_golden_scripts.py -q"
)
RUN_TIMEOUT_S = 600
# host -> its golden folder (tests/golden/inventory.yml): one host per group, and the two hosts
# of an A3 job
HOSTS = {
    "a2-node01": "atlas-a2",
    "a3-node01": "atlas-a3",
    "a950-node01": "ascend-950",
    "a3-pair01": "atlas-a3-job-node1",
    "a3-pair02": "atlas-a3-job-node2",
}
STAGES = ("convert", "data", "hidden_states", "train", "serve")
# The job's second host prepares no data: it checks and records what its first host made.
FOLLOWER_STAGES = tuple(s for s in STAGES if s != "data")
# The job hosts' stages that a job leaves alone: no golden file of their own, they must render
# byte for byte as the A3 host's (test_a_job_changes_only_its_stages).
JOB_HOSTS = ("atlas-a3-job-node1", "atlas-a3-job-node2")
NOT_JOB_STAGES = ("convert", "serve")
TEMPLATE_TASK = re.compile(r"^(?:stage : )?Template the stage script: (\w+)$")
_VERSIONS = yaml.safe_load((REPO / "roles" / "specfleet" / "defaults" / "main.yml").read_text())
# The image repository and release the groups' tag suffixes are added to.
IMAGE = (
    f"{_VERSIONS['specfleet_vllm_ascend_image_repo']}:"
    f"{_VERSIONS['specfleet_vllm_ascend_image_version']}"
)


def render(run_dir: Path, private: Path) -> dict[str, dict[str, str]]:
    """{group: {stage: script}} from one --check --diff run of render.yml, read from
    ansible-runner's events. The scripts would be templated into run_dir (absent: the diff
    then holds each whole script), whatever a real work root on this machine holds; their
    content keeps the default work root's paths."""
    import ansible_runner

    private.mkdir(parents=True, exist_ok=True)
    envvars = {
        "PATH": f"{ANSIBLE_PLAYBOOK.parent}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
    }
    runner = ansible_runner.run(
        private_data_dir=str(private),
        project_dir=str(REPO),
        playbook=str(PLAYBOOK),
        inventory=str(INVENTORY),
        cmdline=f"--check --diff -e specfleet_run_dir={run_dir}",
        envvars=envvars,
        quiet=True,
        timeout=RUN_TIMEOUT_S,
    )
    scripts: dict[str, dict[str, str]] = {group: {} for group in HOSTS.values()}
    errors = []
    for event in runner.events:
        data = event.get("event_data") or {}
        res = data.get("res") or {}
        name = data.get("task") or ""
        if event.get("event") == "runner_on_failed":
            errors.append(f"{data.get('host')}: {name}: {res.get('msg')}")
        found = TEMPLATE_TASK.match(name)
        if found and event.get("event") == "runner_on_ok" and res.get("diff"):
            scripts[HOSTS[data["host"]]][found.group(1)] = res["diff"][0]["after"]
    stats = runner.stats or {}
    failed = sorted(set(stats.get("failures") or {}) | set(stats.get("dark") or {}))
    assert not failed and runner.rc == 0, (
        f"render.yml failed (rc {runner.rc}, {runner.status}) on {failed}:\n"
        + "\n".join(errors)
        + f"\n{runner.stdout.read()[-3000:]}"
    )
    return scripts


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    if not os.access(ANSIBLE_PLAYBOOK, os.X_OK):
        pytest.skip(f"no controller venv: {ANSIBLE_PLAYBOOK} (make setup)")
    base = tmp_path_factory.mktemp("golden")
    scripts = render(base / "run", base / "runner")
    for group, stages in scripts.items():
        wanted = FOLLOWER_STAGES if group == "atlas-a3-job-node2" else STAGES
        assert sorted(stages) == sorted(wanted), f"{group}: rendered {sorted(stages)}"
    return scripts


def golden_scripts(rendered: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """What has a golden file: every script but the job hosts' stages a job leaves alone."""
    return {
        group: {
            stage: script
            for stage, script in stages.items()
            if not (group in JOB_HOSTS and stage in NOT_JOB_STAGES)
        }
        for group, stages in rendered.items()
    }


def test_npu_scripts_match_the_golden_files(rendered: dict[str, dict[str, str]]) -> None:
    rendered = golden_scripts(rendered)
    if UPDATE:
        for group, stages in rendered.items():
            folder = GOLDEN_NPU / group
            folder.mkdir(parents=True, exist_ok=True)
            for stale in set(p.name for p in folder.glob("*.sh")) - {f"{s}.sh" for s in stages}:
                (folder / stale).unlink()
            for stage, script in stages.items():
                (folder / f"{stage}.sh").write_text(script)
    problems = []
    for group, stages in rendered.items():
        for stage, script in sorted(stages.items()):
            path = GOLDEN_NPU / group / f"{stage}.sh"
            golden = path.read_text() if path.is_file() else ""
            if script != golden:
                diff = difflib.unified_diff(
                    golden.splitlines(keepends=True),
                    script.splitlines(keepends=True),
                    fromfile=f"{path.relative_to(REPO)} (golden)",
                    tofile=f"{group}/{stage}.sh (rendered now)",
                )
                problems.append("".join(diff) if golden else f"{path.relative_to(REPO)} is missing")
    extra = sorted(
        str(p.relative_to(REPO))
        for p in GOLDEN_NPU.glob("*/*.sh")
        if p.stem not in rendered.get(p.parent.name, {})
    )
    problems += [f"{p}: golden file of a script that is no longer rendered" for p in extra]
    assert not problems, (
        f"the NPU scripts changed; review the diff, then regenerate with\n  {REGENERATE}\n\n"
        + "\n".join(problems)
    )


def lines(script: str, pattern: str) -> list[str]:
    """The script's lines matching pattern, indentation removed."""
    return [line.strip() for line in script.splitlines() if re.search(pattern, line.strip())]


# group -> (image tag suffix, devices made available, ASCEND_RT_VISIBLE_DEVICES exported or
# None = unset)
EXPECTED = {
    "atlas-a2": ("", 1, "0"),
    "atlas-a3": ("-a3", 16, None),
    "ascend-950": ("-a5", 3, None),
}


@pytest.mark.parametrize("group", sorted(EXPECTED))
def test_group_facts_reach_the_npu_scripts(rendered: dict[str, dict[str, str]], group: str) -> None:
    suffix, devices, visible = EXPECTED[group]
    scripts = rendered[group]
    for stage, script in scripts.items():
        assert f"# Expects the vllm-ascend image {IMAGE}{suffix}\n" in script, (group, stage)
        assert f"# NPU host of {group}" in script, (group, stage)
    for stage in ("hidden_states", "train", "serve"):
        script = scripts[stage]
        exported = lines(script, r"^export ASCEND_RT_VISIBLE_DEVICES=")
        unset = lines(script, r"^unset ASCEND_RT_VISIBLE_DEVICES$")
        # serve_mode service (the npu default): the serve script's own environment, and the same
        # in the launcher it writes for the service's supervisor.
        times = 2 if stage == "serve" else 1
        if visible is None:
            assert not exported and unset == ["unset ASCEND_RT_VISIBLE_DEVICES"] * times, (
                group,
                stage,
                exported,
            )
        else:
            expected = [f"export ASCEND_RT_VISIBLE_DEVICES={visible}"] * times
            assert exported == expected and not unset, (group, stage)
        assert f"using {devices} device" in script, (group, stage)
    train = scripts["train"]
    # The runbook's one card per host (train_nproc_per_node's npu default), whatever the devices:
    # the smoke set's 10 rows split 9 / 1, one validation row for one rank.
    torchrun = '"$PY" -m torch.distributed.run --standalone --nproc_per_node=1'
    assert lines(train, r"torch\.distributed\.run") == [
        f'{torchrun} -m speculators.train "${{ARGS[@]}}" || status=$?'
    ]
    assert lines(train, r"^--train-data-ratio ") == ["--train-data-ratio 0.9"]
    assert not lines(train, r"^\s*torchrun\b"), "a bare torchrun from PATH"
    # A training run's kernels launch asynchronously (ASCEND_LAUNCH_BLOCKING is a debugging
    # switch, train_launch_blocking); HCCL binds the ports npu_env reserved, one host or a job.
    assert "ASCEND_LAUNCH_BLOCKING" not in train, group
    assert lines(train, r"^export HCCL_IF_BASE_PORT=") == ["export HCCL_IF_BASE_PORT=60000"]
    hidden = scripts["hidden_states"]
    # data_seq_length 8192 + the one token generate-offline-data asks for
    assert lines(hidden, r"^--max-model-len ") == ["--max-model-len 8193 \\"]
    assert lines(hidden, r"^--max-num-batched-tokens ") == ["--max-num-batched-tokens 8193 \\"]
    assert lines(hidden, r"^--max-num-seqs ") == ["--max-num-seqs 256 \\"]
    # The memory settings follow the HBM npu-smi reports (recorded outputs, tests/golden/
    # inventory.yml): an idle 910B4 (32 GB, 2871 MB held) cannot give the group's 0.9, and its
    # context and batch are cut to fit; 64 GB A3 dies keep the defaults.
    hidden_share, serve_args = {
        "atlas-a2": ("0.88", ["--max-model-len 8192", "--max-num-batched-tokens 4096",
                              "--max-num-seqs 128", "--gpu-memory-utilization 0.85"]),
        "atlas-a3": ("0.9", ["--max-num-batched-tokens 8192", "--max-num-seqs 256",
                             "--gpu-memory-utilization 0.85"]),
        "ascend-950": ("0.9", ["--max-num-batched-tokens 8192", "--max-num-seqs 256",
                               "--gpu-memory-utilization 0.85"]),
    }[group]  # fmt: skip
    assert lines(hidden, r"^--gpu-memory-utilization ") == [
        f"--gpu-memory-utilization {hidden_share} \\"
    ]
    serve = scripts["serve"]
    # the verifier's arguments are one bash array (VERIFIER_ARGS), one argument per line
    assert (
        lines(
            serve, r"^--(gpu-memory-utilization|max-model-len|max-num-batched-tokens|max-num-seqs) "
        )
        == serve_args
    )
    # Every vLLM start on npu waits for the memory a stopped server held, with the share that
    # server asks for (vllm_server start --npu-memory, the launcher's NPU_MEMORY_WAIT devices).
    for stage, share in (("hidden_states", hidden_share), ("serve", "0.85")):
        starts = [line for line in lines(scripts[stage], r"--npu-memory ") if line[0] != "#"]
        assert starts and all(f"--npu-memory {share} " in line for line in starts), (group, stage)
        assert all('"${NPU_MEMORY_WAIT[@]}"' in line for line in starts), (group, stage)
    # A serve deploy (not vllm_server's start) waits on its own, with the same share.
    assert "wait_npu_memory 0.85" in scripts["serve"], group
    # A reduced draft vocabulary only where the image's vllm-ascend keeps the draft's lm_head
    # (the 950 host's MOCK image lacks the d2t gate, vllm-ascend #11374).
    vocab = lines(train, r"--draft-vocab-size")
    assert vocab == ([] if group == "ascend-950" else ["--draft-vocab-size 32000"]), (group, vocab)
    # Every prompt goes to the chat endpoint as the user message, templated once (serve_bench
    # builds vllm bench serve's arguments, with --skip-chat-template).
    assert "BENCH_OPTS=(--model Qwen/Qwen3-8B --tokenizer " in serve, group
    assert "--backend" not in serve and "--dataset-name" not in serve, group
    # The measurement: the plain verifier, the trained draft and the yardstick, 3 rounds; each
    # on a device of its own where the host has one per server (the runbook's one-card A2 host
    # measures them one at a time).
    assert "ARMS=(plain trained yardstick)" in serve and "ROUNDS=3" in serve
    together = group != "atlas-a2"
    pinned = "plain) opts+=(--env ASCEND_RT_VISIBLE_DEVICES=1 --npu-devices 1) ;;"
    assert (pinned in serve) is together, group
    assert ('bench --round "$round" "$arm"' in serve) is not together, group


@pytest.mark.parametrize("group", sorted(EXPECTED))
def test_each_server_waits_on_its_own_device_as_named_where_it_runs(
    rendered: dict[str, dict[str, str]], group: str
) -> None:
    """Every vLLM server is TP 1 on the first device the stages use: its memory wait watches
    that device alone, not every device of the host. Its id is the one where the stages run:
    the host's on the host runtime (a2: device 0), the container's on the container runtime,
    which numbers the devices mounted into it from 0 (a3: all 16; 950: devices 4-6 of the
    host, tests/golden/inventory.yml, are 0-2 in its container)."""
    scripts = rendered[group]
    # (data: the npu default, data_source smoke, starts no server)
    for stage in ("hidden_states", "serve"):
        assert lines(scripts[stage], r"^NPU_MEMORY_WAIT=") == [
            "NPU_MEMORY_WAIT=(--npu-devices 0 --npu-memory-timeout 180)"
        ], (group, stage)
        waits = lines(scripts[stage], r"npu_memory wait ")
        assert waits and all("--devices 0 " in line for line in waits), (group, stage)
    # serve's servers measured together: one device each, the first three the stages use
    arms = lines(scripts["serve"], r"^\w+\) opts\+=\(--env ASCEND_RT_VISIBLE_DEVICES=")
    if group != "atlas-a2":
        assert arms == [
            f"{arm}) opts+=(--env ASCEND_RT_VISIBLE_DEVICES={i} --npu-devices {i}) ;;"
            for i, arm in enumerate(("trained", "plain", "yardstick"))
        ], (group, arms)
    else:
        assert arms == [], arms


def test_the_groups_scripts_differ(rendered: dict[str, dict[str, str]]) -> None:
    for stage in STAGES:
        texts = {group: rendered[group][stage] for group in EXPECTED}
        assert len(set(texts.values())) == len(texts), (
            f"{stage}.sh renders the same for {sorted(texts)}"
        )


def test_a_job_changes_only_its_stages(rendered: dict[str, dict[str, str]]) -> None:
    for group in JOB_HOSTS:
        for stage in NOT_JOB_STAGES:
            assert rendered[group][stage] == rendered["atlas-a3"][stage], (
                f"{group}/{stage}.sh differs from atlas-a3's: a job changed a stage it should not"
            )


def test_the_a3_job_hosts_start_one_world_and_dump_their_halves(
    rendered: dict[str, dict[str, str]],
) -> None:
    """tests/golden/inventory.yml's a3-pair: two A3 hosts, one job (specfleet_job)."""
    first, second = rendered["atlas-a3-job-node1"], rendered["atlas-a3-job-node2"]
    assert "data" not in second  # the job's first host prepares the data for both
    shared = "/mnt/nfs/specfleet/a3-pair"
    assert f"OUT={shared}/data/prepared" in first["data"]
    for node, scripts, address, is_host in (
        (0, first, "192.168.100.11", 1),
        (1, second, "192.168.100.12", 0),
    ):
        train = scripts["train"]
        (torchrun,) = lines(train, r"torch\.distributed\.run")
        assert torchrun.startswith(
            '"$PY" -m torch.distributed.run --nnodes=2 --nproc_per_node=16 --rdzv-backend=c10d'
            " --rdzv-endpoint=192.168.100.11:29400 --rdzv-id="
        ), torchrun
        assert f"is_host={is_host} --local-addr={address} --max-restarts=0" in torchrun
        assert torchrun.endswith('-m speculators.train "${ARGS[@]}" || status=$?'), torchrun
        for exported in (
            f"HCCL_IF_IP={address}",
            "HCCL_SOCKET_IFNAME=enp189s0f0",
            "GLOO_SOCKET_IFNAME=enp189s0f0",
            "HCCL_IF_BASE_PORT=60000",
        ):
            assert lines(train, rf"^export {exported}$"), exported
        assert lines(train, r"^SAVE=") == [lines(first["train"], r"^SAVE=")[0]]
        assert lines(train, r"^SAVE=")[0].startswith(f"SAVE={shared}/train/checkpoints/")
        assert lines(train, r"^--hidden-states-path ") == [
            f"--hidden-states-path {shared}/hidden_states/rows"
        ]
        hidden = scripts["hidden_states"]
        assert lines(hidden, r"^--world-size ") == ["--world-size 2 \\"]
        assert lines(hidden, r"^--rank ") == [f"--rank {node} \\"]
        assert lines(hidden, r"^OUT=") == [f"OUT={shared}/hidden_states/shard-{node}-of-2"]
    # only the first host clears the checkpoints of other inputs off the shared storage
    assert lines(first["train"], r"^find .*checkpoints") and not lines(
        second["train"], r"^find .*checkpoints"
    )
    # the same rendezvous id on both: the directory both name after the job's inputs
    ids = {re.search(r"--rdzv-id=(\S+)", s["train"]).group(1) for s in (first, second)}
    assert len(ids) == 1, ids
