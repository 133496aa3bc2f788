"""plugins/plugin_utils/upstream.py and plugins/action/specfleet_stage_upstream.py: a stage's
upstream stages from the one declaration (needs, needs_if). The pure parts directly; the action
through a real ansible-playbook run on localhost (tests/integration/test_report_flow.py runs it
on the project's own stages.yml; the decision's first step, the same code, is in
test_stage_decide_action.py)."""

from __future__ import annotations

from typing import Any

import pytest
from playrun import run_cases
from plugin_loader import load_plugin

upstream = load_plugin("plugins/plugin_utils/upstream.py")


def test_needs_and_the_edges_whose_setting_is_on() -> None:
    runs = {"data": "d1", "convert": "c1"}
    off = upstream.upstream_of(["data"], {"convert": False}, runs)
    assert off == {"needs": ["data"], "run_ids": {"data": "d1"}, "missing": [], "pending": []}
    on = upstream.upstream_of(["data"], {"convert": True}, runs)
    assert on["needs"] == ["data", "convert"] and on["run_ids"] == runs


def test_an_upstream_stage_without_a_run_id_is_missing_and_a_pending_one_is_pending() -> None:
    found = upstream.upstream_of(["models", "data", "train"], {}, {"data": "pending"})
    assert found["missing"] == ["models", "train"]
    assert found["pending"] == ["data"] and found["run_ids"] == {"data": "pending"}


def test_the_missing_message_names_each_stage_what_it_provides_and_the_tags() -> None:
    provides = {"models": "the verifier and the draft", "train": "the trained draft"}
    one = upstream.missing_message("serve", ["train"], provides, "a2-node01")
    assert one == (
        "serve needs train (the trained draft): no stamp of it on a2-node01, and it does not"
        " run in this play; run site.yml, or add --tags train"
    )
    two = upstream.missing_message("serve", ["models", "train"], provides, "h")
    assert two.startswith(
        "serve needs models (the verifier and the draft), train (the trained draft): "
        "no stamps of them on h, and they do not run"
    )
    assert two.endswith("or add --tags models,train")


GRAPH = {
    "data": {"needs": [], "provides": "the dataset", "inputs": "{{ undefined_elsewhere }}"},
    "convert": {"needs": [], "provides": "the converted draft"},
    "train": {
        "needs": ["data"],
        "needs_if": {"convert": "train_from_converted_"},
        "provides": "the trained draft",
        # Another stage's keys name settings that this play does not have: never templated.
        "inputs": {"epochs": "{{ train_epochs_not_in_this_play }}"},
    },
}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    cases = {
        "plain": ({"train_from_converted_": False}, {"data": "d1"}, {}),
        "converted": ({"train_from_converted_": True}, {"data": "d1", "convert": "c1"}, {}),
        "missing": ({"train_from_converted_": True}, {"data": "d1"}, {}),
        "pending": ({"train_from_converted_": False}, {"data": "pending"}, {"check_mode": True}),
        "unknown_setting": ({}, {"data": "d1"}, {}),
    }
    # What the pending case left as facts, read by the next task (the stage's later ones).
    facts = {
        "name": "facts_after_pending",
        "ansible.builtin.debug": {
            "msg": "{{ {'runs': specfleet_stage_runs, 'results': specfleet_run_results} }}"
        },
    }
    tasks = [
        {
            "name": name,
            "specfleet.ascend.specfleet_stage_upstream": {
                "stage": "train",
                "stage_runs": runs,
                "run_results": {"data": {"status": "would_run"}},
            },
            "vars": task_vars,
            **keywords,
        }
        for name, (task_vars, runs, keywords) in cases.items()
    ]
    tasks.insert(list(cases).index("pending") + 1, facts)
    played = run_cases(tmp_path_factory.mktemp("upstream"), tasks, {"specfleet_stages": GRAPH})
    return {"results": played.results, "stdout": played.stdout}


def test_a_conditional_edge_follows_its_setting(results: dict[str, Any]) -> None:
    plain, converted = results["results"]["plain"], results["results"]["converted"]
    assert not plain.get("failed"), plain
    assert plain["run_ids"] == {"data": "d1"} and plain["missing"] == []
    assert converted["run_ids"] == {"data": "d1", "convert": "c1"}


def test_a_missing_upstream_stage_is_named_with_what_to_run(results: dict[str, Any]) -> None:
    missing = results["results"]["missing"]
    # The task fails, before any work: the stage role's rescue records it as the stage's failure.
    assert missing["failed"] is True, missing
    assert missing["missing"] == ["convert"]
    assert missing["msg"].startswith("train needs convert (the converted draft): no stamp of it")


def test_in_check_mode_a_pending_upstream_plans_the_stage_as_would_run(
    results: dict[str, Any],
) -> None:
    pending = results["results"]["pending"]
    assert pending["pending"] == ["data"]
    assert pending["msg"] == "train: would run: upstream would run: data"
    assert pending["stage_runs"] == {"data": "pending", "train": "pending"}
    assert pending["run_results"]["train"] == {
        "status": "would_run",
        "reason": "upstream would run: data",
        "duration_s": None,
    }
    assert pending["run_results"]["data"] == {"status": "would_run"}
    assert f"[localhost] {pending['msg']}" in results["stdout"]
    # Set as facts too, as set_fact would, for the tasks after it.
    facts = results["results"]["facts_after_pending"]["msg"]
    assert facts == {"runs": pending["stage_runs"], "results": pending["run_results"]}


def test_an_undefined_needs_if_setting_is_named(results: dict[str, Any]) -> None:
    bad = results["results"]["unknown_setting"]
    assert bad["failed"] and "train_from_converted_" in bad["msg"], bad
