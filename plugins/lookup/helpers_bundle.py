"""The lookup that packs python_helpers for the hosts (roles/session/tasks/helpers.yml).

Builds the reproducible zip with specfleet_helpers.bundle inside the controller's Ansible
process: a command task for it cost a module run and an interpreter start on every run.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

DOCUMENTATION = """
name: helpers_bundle
short_description: pack python_helpers into the zip shipped to hosts; return its path and sha1
description:
  - Writes the reproducible zip of specfleet_helpers (specfleet_helpers.bundle) to the path
    given, from the checkout this plugin belongs to, and returns a dict of its path and sha1
    (the checksum ansible.builtin.stat reports for the copy on a host).
options:
  _terms:
    description: the zip file to write
    required: true
"""

HELPERS = Path(__file__).resolve().parents[2] / "python_helpers"


class LookupModule(LookupBase):
    def run(self, terms: list[Any], variables: Any = None, **kwargs: Any) -> list[dict[str, str]]:
        if len(terms) != 1:
            raise AnsibleLookupError("helpers_bundle: expected one term, the zip to write")
        if str(HELPERS) not in sys.path:
            sys.path.append(str(HELPERS))
        from specfleet_helpers import bundle

        try:
            out = bundle.build(Path(str(terms[0])))
        except OSError as exc:
            raise AnsibleLookupError(f"helpers_bundle: cannot write {terms[0]}: {exc}") from exc
        return [{"path": str(out), "sha1": bundle.sha1(out)}]
