"""This scenario's history, checked from the stamps: its side_effect step changed train_epochs
alone after the idempotence run, so exactly train and serve were redone.

It judges what this scenario did, not what any real run may do (a run that changes a serve
setting with the epochs redoes serve for both): it is the scenario's verify, beside the
artifact suite (tests/artifacts), which holds for every run.
"""

from __future__ import annotations

import json
import os

import pytest

UPSTREAM_OF_TRAIN = ["speculators_install", "models", "convert", "data", "hidden_states"]
ROOT = os.environ.get("SPECFLEET_ROOT", "/tmp/specfleet-molecule/default")


@pytest.fixture(scope="module")
def stamp(host):
    def load(stage: str) -> dict:
        return json.loads(host.file(f"{ROOT}/state/{stage}.json").content_string)

    return load


def test_changed_epochs_redid_exactly_train_and_serve(host, stamp):
    """side_effect.yml changed train_epochs alone: nothing upstream of train ran again, and
    serve was redone for the new draft only."""
    train = stamp("train")
    changed = set(train["reason"].removeprefix("inputs changed: ").split(", "))
    assert train["reason"].startswith("inputs changed: "), train["reason"]
    assert "epochs" in changed and changed <= {"epochs", "script_sha256"}, train["reason"]
    serve = stamp("serve")
    # Redone for the new train run: its run id is an input, and so is the draft's release for
    # serving, named after it (with the script that names it); nothing else changed.
    changed = set(serve["reason"].removeprefix("inputs changed: ").split(", "))
    assert changed <= {"upstream", "speculative_config", "script_sha256"}, serve["reason"]
    assert "upstream" in changed, serve["reason"]
    assert serve["inputs"]["upstream"]["train"] == train["run_id"]
    assert serve["inputs"]["speculative_config"]["model"].endswith("/" + train["run_id"])
    if serve["inputs"]["lossless"] is not None:
        # Same verifier, vLLM and prompts: the plain verifier's greedy outputs were kept.
        result = json.loads(host.file(serve["artifacts"]["result"]).content_string)
        assert result["lossless"]["plain"] == "kept", result["lossless"]
    for name in UPSTREAM_OF_TRAIN:
        earlier = stamp(name)
        assert earlier["ended"] <= train["started"], (
            f"{name} ran again (ended {earlier['ended']}) although only train_epochs changed"
        )
