"""What the hardware groups (specfleet_hardware_groups in roles/specfleet/defaults/main.yml)
promise about the vllm-ascend image.

The image tags are the ones v0.23.0's image build publishes (its
schedule_image_build_and_push.yaml: plain for A2, -a3, -a5 for 950, each also -openeuler);
quick_start.md's -950dt is not published. The speculative tokens stay in vllm-ascend's range
(its attention backends assert num_speculative_tokens + 1 <= 16).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

DEFAULTS = Path(__file__).resolve().parents[2] / "roles" / "specfleet" / "defaults" / "main.yml"
PUBLISHED_SUFFIXES = {"atlas-a2": "", "atlas-a3": "-a3", "ascend-950": "-a5"}


def groups() -> dict:
    return yaml.safe_load(DEFAULTS.read_text())["specfleet_hardware_groups"]


def group(name: str) -> dict:
    return groups()[name]


def test_every_hardware_group_is_covered() -> None:
    assert set(groups()) == set(PUBLISHED_SUFFIXES)


@pytest.mark.parametrize("name", sorted(PUBLISHED_SUFFIXES))
def test_image_tag_suffix_is_one_the_image_build_publishes(name: str) -> None:
    settings = group(name)
    assert settings["image_tag_suffix"] == PUBLISHED_SUFFIXES[name]


@pytest.mark.parametrize("name", sorted(PUBLISHED_SUFFIXES))
def test_speculative_tokens_within_vllm_ascend_limit(name: str) -> None:
    tokens = group(name)["num_speculative_tokens"]
    assert 1 <= tokens <= 15
