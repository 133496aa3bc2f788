"""plugins/filter/outputs.py: a stage's outputs are the values at its declared paths in its
stamp, None where the stamp has none; every declared stage gets an entry."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from plugin_loader import load_plugin

outputs = load_plugin("plugins/filter/outputs.py")
stage_outputs = outputs.stage_outputs
stamps_outputs = outputs.stamps_outputs

STAMP = {
    "inputs": {"seq_length": 512},
    "artifacts": {"prepared": "/srv/data/prepared"},
    "metrics": {"rows": 913, "verifier": {"hidden_size": 64}},
}


def test_outputs_are_read_at_their_paths() -> None:
    paths = {"prepared": "artifacts.prepared", "rows": "metrics.rows", "seq": "inputs.seq_length"}
    assert stage_outputs(STAMP, paths) == {
        "prepared": "/srv/data/prepared",
        "rows": 913,
        "seq": 512,
    }
    assert stage_outputs(STAMP, {"size": "metrics.verifier.hidden_size"}) == {"size": 64}


def test_a_path_the_stamp_lacks_is_none() -> None:
    assert stage_outputs(STAMP, {"x": "metrics.rows.deeper", "y": "artifacts.rows"}) == {
        "x": None,
        "y": None,
    }
    assert stage_outputs(None, {"x": "metrics.rows"}) == {"x": None}


def test_outputs_must_be_paths() -> None:
    with pytest.raises(AnsibleFilterError, match="dotted paths"):
        stage_outputs(STAMP, {"x": ["metrics"]})


def test_every_declared_stage_with_outputs_gets_an_entry() -> None:
    stages = {
        "npu_env": {"needs": []},
        "data": {"outputs": {"rows": "metrics.rows"}},
        "train": {"outputs": {"draft": "artifacts.draft"}},
    }
    assert stamps_outputs({"data": STAMP}, stages) == {
        "data": {"rows": 913},
        "train": {"draft": None},
    }
