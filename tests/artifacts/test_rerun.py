"""Re-run behaviour, checked from the stamps (molecule's side_effect step changes train_epochs
after the idempotence run): a changed input redoes exactly its stage and the ones after it.
Skipped on hosts where train ran with the default single epoch.
"""

from __future__ import annotations

import json

import pytest

UPSTREAM_OF_TRAIN = ["speculators_install", "models", "convert", "data", "hidden_states"]


def test_changed_epochs_redid_exactly_train_and_serve(host, stamp):
    """When train's last run was for a change of train_epochs alone, nothing upstream of it ran
    again and serve was redone for the new draft only. Any other reason for train's last run (a
    first run, a resumed or forced one, other inputs) promises nothing of the kind."""
    train = stamp("train")
    changed = set(train["reason"].removeprefix("inputs changed: ").split(", "))
    if not train["reason"].startswith("inputs changed: ") or not (
        "epochs" in changed and changed <= {"epochs", "script_sha256"}
    ):
        pytest.skip(f"train's last run was not for train_epochs alone: {train['reason']}")
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
