"""specfleet.ascend.setting: another stage role's setting, as that role's own tasks see it.

The stages play includes a stage role only when its stage runs (playbooks/stages.yml), so a
role's defaults are not in every other role's scope. A role that reads a setting of another
stage's role reads it through this lookup: the inventory's or -e's value when one is given,
else the owning role's default (its defaults and vars read as plugin_utils/role_scope.py reads
them, under the task's variables), templated there.

    _nodes_share: "{{ lookup('specfleet.ascend.setting', 'train_nproc_per_node') }}"
    _job: "{{ query('specfleet.ascend.setting', *specfleet_job_agreed_settings) }}"

The owning role is the stage role whose name prefixes the setting (data_seq_length: data); a
fleet-wide setting (specfleet_*) is read from the task's variables, where every play has it.
"""

from __future__ import annotations

from collections import ChainMap
from typing import Any

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase
from ansible_collections.specfleet.ascend.plugins.plugin_utils.role_scope import ROLES, role_scope

DOCUMENTATION = """
name: setting
short_description: a stage role's setting as that role's tasks see it
description:
  - The value given (inventory, -e, play vars), else the owning stage role's default, templated
    in that role's scope. The owning role is the one whose name prefixes the setting.
options:
  _terms:
    description: the settings' names
    required: true
"""


def owning_role(name: str) -> str | None:
    """The role whose name prefixes `name` (the longest, so speculators_install_* is its own)."""
    owners = [
        role.name
        for role in ROLES.iterdir()
        if role.is_dir() and name.startswith(role.name + "_") and role.name != "specfleet"
    ]
    return max(owners, key=len) if owners else None


class LookupModule(LookupBase):
    def run(self, terms: list[Any], variables: Any = None, **kwargs: Any) -> list[Any]:
        if kwargs:
            raise AnsibleLookupError(
                f"specfleet.ascend.setting: takes no options, got {', '.join(sorted(kwargs))}"
            )
        seen = variables or {}
        values = []
        scopes: dict[str, ChainMap] = {}
        for term in terms:
            name = str(term)
            role = owning_role(name)
            if role is None:
                # A fleet-wide setting (specfleet_*): in every play's scope already.
                if name not in seen:
                    raise AnsibleLookupError(
                        f"specfleet.ascend.setting: {name} is neither given nor a stage role's "
                        "setting (expected <role>_<name>, e.g. data_seq_length)"
                    )
                values.append(
                    self._templar.copy_with_new_env(available_variables=seen).template(seen[name])
                )
                continue
            if role not in scopes:
                scopes[role] = role_scope(self._loader, role, seen)
            scope = scopes[role]
            if name not in scope:
                raise AnsibleLookupError(
                    f"specfleet.ascend.setting: role {role} has no setting {name} "
                    f"(see roles/{role}/defaults/main.yml)"
                )
            templar = self._templar.copy_with_new_env(available_variables=scope)
            values.append(templar.template(scope[name]))
        return values
