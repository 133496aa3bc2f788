"""plugins/lookup/helpers_bundle.py: the zip session/helpers.yml ships, built in the
controller's Ansible process, with the sha1 a host's copy is compared with."""

from __future__ import annotations

import hashlib

import pytest
import yaml
from ansible.errors import AnsibleLookupError
from plugin_loader import load_plugin
from specfleet_helpers import bundle


def test_the_lookup_writes_the_bundle_and_returns_its_sha1(tmp_path):
    lookup = load_plugin("plugins/lookup/helpers_bundle.py").LookupModule()
    out = tmp_path / ".cache" / "specfleet_helpers.zip"
    [found] = lookup.run([str(out)])
    assert found == {"path": str(out), "sha1": hashlib.sha1(out.read_bytes()).hexdigest()}
    assert out.read_bytes() == bundle.build(tmp_path / "again.zip").read_bytes()


def test_the_lookup_wants_one_zip_path(tmp_path):
    lookup = load_plugin("plugins/lookup/helpers_bundle.py").LookupModule()
    with pytest.raises(AnsibleLookupError, match="expected one term"):
        lookup.run([])


def test_the_documentation_is_yaml_ansible_can_load():
    module = load_plugin("plugins/lookup/helpers_bundle.py")
    doc = yaml.safe_load(module.DOCUMENTATION)
    assert doc["name"] == "helpers_bundle" and doc["options"]["_terms"]["required"]
