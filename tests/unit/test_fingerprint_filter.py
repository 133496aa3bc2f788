"""plugins/filter/fingerprint.py: train's checkpoint directory is named by the stamps' own
recipe (plugin_utils/fingerprint.py), so the two cannot drift apart, and names what the Jinja
copy it replaced named (an interrupted run resumes in the directory an older run started)."""

from __future__ import annotations

import hashlib
import json

import pytest
from ansible.errors import AnsibleFilterError
from plugin_loader import load_plugin

filters = load_plugin("plugins/filter/fingerprint.py")
decide = load_plugin("plugins/action/specfleet_stage_decide.py")

INPUTS = {"epochs": 3, "output": "/srv/a/draft", "upstream": {"data": "r1"}, "lr": 6e-4}


def test_the_stamps_fingerprint_and_the_checkpoint_key_are_one_recipe() -> None:
    assert filters.fingerprint(INPUTS) == decide.fingerprint(INPUTS)
    without_output = {k: v for k, v in INPUTS.items() if k != "output"}
    assert filters.fingerprint(INPUTS, leave_out=["output"]) == decide.fingerprint(without_output)


def test_the_checkpoint_key_is_what_the_jinja_copy_gave() -> None:
    # `inputs | dict2items | rejectattr('key', 'equalto', 'output') | items2dict
    #  | to_json(sort_keys=true) | hash('sha256') | truncate(12, true, '', 0)`
    kept = {k: v for k, v in INPUTS.items() if k != "output"}
    old = hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:12]
    assert filters.fingerprint(INPUTS, leave_out=["output"], length=12) == old


def test_the_output_moves_nothing_but_any_other_input_does() -> None:
    key = filters.fingerprint(INPUTS, leave_out=["output"], length=12)
    assert filters.fingerprint({**INPUTS, "output": "/elsewhere"}, ["output"], 12) == key
    assert filters.fingerprint({**INPUTS, "epochs": 4}, ["output"], 12) != key


def test_not_a_mapping_is_named() -> None:
    with pytest.raises(AnsibleFilterError, match="expected a mapping of inputs, got list"):
        filters.fingerprint([1, 2])
