"""plugins/plugin_utils/setting_names.py: a setting no role declares is refused by name, with
the closest declared one; the project's own settings (every role's spec) are all known."""

from __future__ import annotations

import re

import yaml
from plugin_loader import REPO, load_plugin

names = load_plugin("plugins/plugin_utils/setting_names.py")
DECLARED = names.declared_settings(REPO / "roles")


def test_every_setting_the_project_ships_in_its_inventories_is_declared():
    given: set[str] = set()
    for path in [
        *(REPO / "inventory").glob("*.yml"),
        *(REPO / "inventory" / "group_vars").glob("*.yml"),
        *(REPO / "molecule").glob("*/host_vars/*"),
        *(REPO / "molecule").glob("*/group_vars/*"),
    ]:
        text = path.read_text() if path.is_file() else ""
        given |= _keys(yaml.safe_load(text))
    # the group_vars examples' settings, commented out until a user needs them
    for path in (REPO / "inventory" / "group_vars").glob("*.yml"):
        for line in path.read_text().splitlines():
            if re.match(r"^# [a-z0-9_]+: ", line):
                given.add(line[2:].split(":", 1)[0])
    assert "specfleet_job_shared_dir" in given
    assert names.unknown_settings(given, DECLARED) == []


def _keys(value) -> set[str]:
    if isinstance(value, dict):
        return set(map(str, value)) | {k for v in value.values() for k in _keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in _keys(v)}
    return set()


def test_an_unknown_name_under_a_prefix_is_refused_with_the_closest_name():
    unknown = names.unknown_settings(
        ["train_epoch", "train_epochs", "specfleet_acelerator", "my_own_var", "ansible_user"],
        DECLARED,
    )
    assert unknown == ["specfleet_acelerator", "train_epoch"]
    message = names.refusal(
        {"train_epoch": "extra vars", "data_zzz_qqq": "the inventory"}, DECLARED
    )
    assert message.startswith("unknown settings: data_zzz_qqq (from the inventory): no setting")
    assert "train_epoch (from extra vars): did you mean train_epochs?" in message


def test_the_prefixes_are_the_roles():
    roles = {
        p.name for p in (REPO / "roles").iterdir() if (p / "meta" / "argument_specs.yml").exists()
    }
    assert {prefix.rstrip("_") for prefix in names.PREFIXES} == roles
