"""A job across hosts (specfleet_job), its pure parts: the filters the roles use
(plugins/filter/job.py), the plan every host of a job agrees on
(plugins/action/specfleet_job_plan.py), the hidden-state check of one host's share
(checks/hs_check.py --first/--links), and job_probe's cards and ports on real sockets and a
real directory. The job itself runs on two real hosts in the fleet scenario (tests/fleet)."""

from __future__ import annotations

import json
import socket
import struct
import time
from pathlib import Path

import pytest
from plugin_loader import load_plugin
from procutil import run_helper
from specfleet_helpers.checks import hs_check
from specfleet_helpers.host import job_probe
from specfleet_helpers.host.procs import process_alive

job = load_plugin("plugins/filter/job.py")
plan = load_plugin("plugins/action/specfleet_job_plan.py")


# ----------------------------------------------------------------------------- filters


@pytest.mark.parametrize(
    ("rows", "world", "expected"),
    [
        (913, 2, [(0, 457), (457, 456)]),
        (10, 3, [(0, 4), (4, 3), (7, 3)]),
        (2, 4, [(0, 1), (1, 1), (2, 0), (2, 0)]),
        (9, 1, [(0, 9)]),
    ],
)
def test_shard_rows_split_as_speculators_does(rows, world, expected) -> None:
    shards = [job.shard_rows(rows, world, r) for r in range(world)]
    assert [(s["first"], s["count"]) for s in shards] == expected
    # contiguous, every row once
    covered = [i for s in shards for i in range(s["first"], s["first"] + s["count"])]
    assert covered == list(range(rows))


def test_speculators_own_split_agrees(tmp_path) -> None:
    """The same shares as speculators' get_indices_to_process, when the CPU venv has it."""
    python = Path(__file__).resolve().parents[2] / ".work/local/venv/bin/python"
    if not python.exists():
        pytest.skip("no CPU venv")
    code = (
        "import json, sys\n"
        "from speculators.data_generation.offline import get_indices_to_process as f\n"
        "print(json.dumps([[f(913, None, [], w, r) for r in range(w)] for w in (1, 2, 3, 5)]))\n"
    )
    import subprocess

    out = json.loads(
        subprocess.run(
            [str(python), "-c", code], capture_output=True, text=True, check=True, timeout=120
        ).stdout
    )
    for world, ranks in zip((1, 2, 3, 5), out):
        for rank, indices in enumerate(ranks):
            share = job.shard_rows(913, world, rank)
            assert indices == list(range(share["first"], share["first"] + share["count"]))


def test_shard_rows_refuses_a_rank_outside_the_world() -> None:
    with pytest.raises(ValueError, match=r"rank 2 is not in 0\.\.1"):
        job.shard_rows(10, 2, 2)


def test_job_runs_are_every_hosts_run_ids() -> None:
    hostvars = {
        "a": {"specfleet_stage_runs": {"data": "d1", "hidden_states": "h-a", "serve": "x"}},
        "b": {"specfleet_stage_runs": {"data": "d2", "hidden_states": "h-b"}},
        "c": {},
    }
    assert job.job_runs(["a", "b", "c"], hostvars, ["data", "hidden_states"]) == {
        "a": {"data": "d1", "hidden_states": "h-a"},
        "b": {"data": "d2", "hidden_states": "h-b"},
        "c": {"data": None, "hidden_states": None},
    }


def test_job_absent_says_why_and_job_ports_lists_the_others() -> None:
    card = {"failed": False, "json": {"address": "10.0.0.1", "listening": [29400]}}
    hostvars = {
        "a": {"_announced": card},
        "b": {"specfleet_host_stopped": {"why": "unreachable", "error": "ssh: refused"}},
        "c": {"specfleet_failed_stage": "npu_env", "_announced": {"failed": True, "msg": "x"}},
        "d": {"_announced": {"failed": True, "stderr": "job_probe: port 29400 is taken"}},
    }
    assert job.job_absent(["a", "b", "c", "d"], hostvars, "_announced") == [
        "b (unreachable: ssh: refused)",
        "c (its npu_env stage failed)",
        "d (job_probe: port 29400 is taken)",
    ]
    assert job.job_ports(["a", "b"], hostvars, "_announced", "b") == ["a=10.0.0.1:29400"]
    assert job.job_ports(["a", "b"], hostvars, "_announced", "a") == []


# ----------------------------------------------------------------------------- the job's plan


def decision(stage="train", redo=False, reason="", **inputs):
    return {"stage": stage, "redo": redo, "reason": reason, "inputs": {"epochs": 1, **inputs}}


def test_a_host_that_must_train_takes_the_others_along() -> None:
    decisions = {
        "a": decision(),
        "b": decision(redo=True, reason="artifacts no longer valid: no draft"),
    }
    agreed = plan.agree("train", "a", ["a", "b"], decisions, {})
    assert agreed == {
        "redo": True,
        "reason": "the job's host b runs it: artifacts no longer valid: no draft",
    }
    assert plan.agree("train", "b", ["a", "b"], decisions, {})["redo"] is True
    both_up = {"a": decision(), "b": decision()}
    assert plan.agree("train", "a", ["a", "b"], both_up, {}) == {"redo": False, "reason": ""}


def test_a_host_without_a_decision_stops_the_job_everywhere() -> None:
    decisions = {"a": decision(), "b": {"stage": "hidden_states"}}
    agreed = plan.agree(
        "train", "a", ["a", "b"], decisions, {"b": "its hidden_states stage failed"}
    )
    assert agreed == {
        "error": "train runs on every host of the job at once, and b (its hidden_states stage "
        "failed) cannot take part: train does not start on a either"
    }


def test_hosts_that_disagree_on_the_inputs_are_named_their_own_ones_aside() -> None:
    decisions = {
        "a": {
            **decision(),
            "inputs": {"epochs": 1, "output": "/srv/a/draft", "script_sha256": "x"},
        },
        "b": {
            **decision(),
            "inputs": {"epochs": 2, "output": "/srv/b/draft", "script_sha256": "y"},
        },
    }
    own = ["script_sha256", "output"]
    assert "inputs (epochs)" in plan.agree("train", "a", ["a", "b"], decisions, {}, own)["error"]
    decisions["b"]["inputs"]["epochs"] = 1
    assert "error" not in plan.agree("train", "a", ["a", "b"], decisions, {}, own)
    # without naming its own inputs, each host's script and draft directory would be differences
    error = plan.agree("train", "a", ["a", "b"], decisions, {})["error"]
    assert "different inputs (output, script_sha256)" in error, error


# ----------------------------------------------------------------------------- hs_check shares


def write_hs(path: Path, tokens: int = 3, layers: int = 4, hidden: int = 8) -> None:
    header = {
        "token_ids": {"dtype": "I64", "shape": [tokens], "data_offsets": [0, tokens * 8]},
        "hidden_states": {
            "dtype": "BF16",
            "shape": [tokens, layers, hidden],
            "data_offsets": [tokens * 8, tokens * 8 + tokens * layers * hidden * 2],
        },
    }
    raw = json.dumps(header).encode()
    path.write_bytes(
        struct.pack("<Q", len(raw)) + raw + bytes(tokens * 8 + tokens * layers * hidden * 2)
    )


def test_hs_check_checks_exactly_a_hosts_share_and_its_links(tmp_path) -> None:
    shard, rows = tmp_path / "shard-1-of-2", tmp_path / "rows"
    shard.mkdir()
    rows.mkdir()
    for i in range(5, 9):
        write_hs(shard / f"hs_{i}.safetensors")
        (rows / f"hs_{i}.safetensors").symlink_to(f"../shard-1-of-2/hs_{i}.safetensors")
    facts = hs_check.check(shard, 4, 4, 8, first=5, links=rows)
    assert (facts["first"], facts["files"], facts["tokens"]) == (5, 4, 12)
    with pytest.raises(ValueError, match=r"lacks 1 of rows 5\.\.9"):
        hs_check.check(shard, 5, 4, 8, first=5)
    (rows / "hs_7.safetensors").unlink()
    with pytest.raises(ValueError, match=r"hs_7\.safetensors does not lead to"):
        hs_check.check(shard, 4, 4, 8, first=5, links=rows)
    # alone (no --first), the directory holds exactly the rows
    with pytest.raises(ValueError, match=r"has 4 hs_\*\.safetensors files, expected 9"):
        hs_check.check(shard, 9, 4, 8)


# ----------------------------------------------------------------------------- job_probe


LOOPBACK = "127.0.0.1"


def test_the_address_is_the_source_of_the_route_to_the_others_and_its_interface() -> None:
    own = {n: a for n, a in job_probe.interface_addresses().items() if not a.startswith("127.")}
    if not own:
        pytest.skip("no interface with an address other than loopback here")
    name, address = next(iter(own.items()))
    # A route to one of this host's own addresses leaves from that address.
    assert job_probe.find_network([address]) == (address, name, [])
    assert job_probe.find_network([], address, "") == (address, name, [])
    assert job_probe.find_network([], "", name) == (address, name, [])
    _, _, problems = job_probe.find_network([LOOPBACK])
    assert problems == [
        "this host reaches 127.0.0.1 over loopback only: set specfleet_job_address to the "
        "address the other hosts reach it at"
    ]
    assert job_probe.find_network(["no-such-host.invalid"])[2] == [
        "no route from this host to no-such-host.invalid: set specfleet_job_address"
    ]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_cards_prove_one_storage_and_name_the_host_that_does_not_see_it(tmp_path) -> None:
    shared, elsewhere = tmp_path / "nfs", tmp_path / "local-disk"
    settings = {"train_epochs": 1}
    a = job_probe.announce(shared, "a", "tok-a", settings, [], address=LOOPBACK)
    assert a["address"] == LOOPBACK and a["ifname"] == "lo" and a["problems"] == []
    job_probe.announce(shared, "b", "tok-b", settings, [], address=LOOPBACK)
    assert job_probe.check(shared, "a", {"a": "tok-a", "b": "tok-b"}, [])["problems"] == []
    # c wrote to a directory that is not the one a and b share
    job_probe.announce(elsewhere, "c", "tok-c", settings, [], address=LOOPBACK)
    found = job_probe.check(shared, "a", {"a": "tok-a", "c": "tok-c"}, [])
    assert found["problems"] == [
        f"a does not see the card c wrote to {shared}: {shared}/.specfleet/hosts/c.json is "
        f"missing here, so {shared} is not one storage shared by a and c (specfleet_job_shared_dir)"
    ]
    # a card of an earlier run (another token) is not this run's
    found = job_probe.check(shared, "a", {"a": "tok-a", "b": "tok-b-next-run"}, [])
    assert "a reads another run's card for b" in found["problems"][0]


def test_settings_that_differ_are_named_with_both_values(tmp_path) -> None:
    job_probe.announce(tmp_path, "a", "ta", {"train_epochs": 1, "train_lr": 0.1}, [], LOOPBACK)
    job_probe.announce(tmp_path, "b", "tb", {"train_epochs": 3, "train_lr": 0.1}, [], LOOPBACK)
    (problem,) = job_probe.check(tmp_path, "a", {"a": "ta", "b": "tb"}, [])["problems"]
    assert "the job's settings differ between a and b: train_epochs 1 here, 3 there" in problem


def test_the_first_host_listens_until_every_other_host_connected(tmp_path) -> None:
    port = free_port()
    # one other host of the job, which will connect
    card = job_probe.announce(
        tmp_path, "a", "ta", {}, ["b"], address=LOOPBACK, listen=[port], listen_for=30
    )
    assert card["listening"] == [port]
    listener = json.loads((tmp_path / ".specfleet/hosts/a.json").read_text())["listener_pid"]
    job_probe.announce(tmp_path, "b", "tb", {}, [], address=LOOPBACK)
    reached = job_probe.check(tmp_path, "b", {}, [("a", "127.0.0.1", port)], timeout_s=5)
    assert reached["reached"] == [f"a=127.0.0.1:{port}"] and reached["problems"] == []
    # its one peer connected: the listener is gone (a zombie of this test process, which is
    # its parent here; on a host its parent has exited), the port free again
    deadline = time.monotonic() + 10
    while process_alive(listener) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not process_alive(listener)


def test_an_unreachable_port_and_a_taken_one_are_named(tmp_path) -> None:
    port = free_port()
    job_probe.announce(tmp_path, "b", "tb", {}, [], address=LOOPBACK)
    found = job_probe.check(tmp_path, "b", {}, [("a", "127.0.0.1", port)], timeout_s=1)
    assert found["problems"] == [
        f"b cannot reach port {port} of a at 127.0.0.1 within 1s (a firewall, or a route the"
        " job's collectives would not have)"
    ]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen(1)
        with pytest.raises(job_probe.PortBusy, match=f"port {port} on a \\(127.0.0.1\\)"):
            job_probe.announce(tmp_path, "a", "ta", {}, [], address=LOOPBACK, listen=[port])


def test_a_listener_an_earlier_announce_left_is_ended_by_the_next(tmp_path) -> None:
    port = free_port()
    job_probe.announce(tmp_path, "a", "t1", {}, [], address=LOOPBACK, listen=[port], listen_for=60)
    first = json.loads((tmp_path / ".specfleet/hosts/a.json").read_text())["listener_pid"]
    again = job_probe.announce(
        tmp_path, "a", "t2", {}, [], address=LOOPBACK, listen=[port], listen_for=1
    )
    assert again["listening"] == [port]
    assert not process_alive(first)


def test_the_cli_prints_one_json_line_and_names_bad_pairs(tmp_path) -> None:
    out = run_helper(
        "specfleet_helpers.host.job_probe",
        "announce",
        f"--dir={tmp_path}",
        "--host=a",
        "--token=t",
        "--address=127.0.0.1",
        '--settings-json={"x": 1}',
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["ifname"] == "lo"
    bad = run_helper(
        "specfleet_helpers.host.job_probe", "check", f"--dir={tmp_path}", "--host=a", "--expect=a"
    )
    assert bad.returncode != 0 and "--expect 'a' is not HOST=VALUE" in bad.stderr
    helped = run_helper("specfleet_helpers.host.job_probe", "--help")
    assert helped.returncode == 0 and "announce" in helped.stdout
