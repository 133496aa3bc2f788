"""plugins/action/specfleet_session.py's decision that needs no host: whose lock is a dead
run's (taken over at once) rather than a live one's (waited for). The action itself runs in
every real run: the no-op and lock tests of tests/integration go through it."""

from __future__ import annotations

import os

from plugin_loader import load_plugin

session = load_plugin("plugins/action/specfleet_session.py")


def holder(token: str, controller: str, pid: object) -> dict:
    return {"token": token, "owner": {"controller": controller, "pid": pid}}


def test_a_lock_of_a_gone_process_on_this_controller_is_a_dead_runs():
    assert session.dead_owner(holder("other", "here", 2**22 + 7), "mine", "here")


def test_a_live_process_another_controller_or_this_run_is_not_dead():
    assert not session.dead_owner(holder("other", "here", os.getpid()), "mine", "here")
    assert not session.dead_owner(holder("other", "elsewhere", 2**22 + 7), "mine", "here")
    assert not session.dead_owner(holder("mine", "here", 2**22 + 7), "mine", "here")
    assert not session.dead_owner(holder("other", "here", ""), "mine", "here")
    assert not session.dead_owner({}, "mine", "here")


STAGES = ["models", "data", "train"]


def test_the_stamps_verified_ahead_are_the_stages_tags_let_run():
    """The plan's tag rule (plugin_utils/tags.py), not a copy of it: `--tags tagged` runs every
    stage, so their stamps are verified ahead; a Jinja copy once verified none."""
    assert session.to_verify(STAGES, {"ansible_run_tags": ["all"]}) == STAGES
    assert session.to_verify(STAGES, {"ansible_run_tags": ["data"]}) == ["data"]
    assert session.to_verify(STAGES, {"ansible_run_tags": ["validate"]}) == []
    assert session.to_verify(STAGES, {"ansible_run_tags": ["tagged"]}) == STAGES
    skipped = {"ansible_run_tags": ["all"], "ansible_skip_tags": ["data"]}
    assert session.to_verify(STAGES, skipped) == ["models", "train"]
    assert (
        session.to_verify(STAGES, {"ansible_run_tags": ["all"], "ansible_skip_tags": ["all"]}) == []
    )
