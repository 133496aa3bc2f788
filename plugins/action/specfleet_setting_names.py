"""specfleet_setting_names: refuse a setting the project does not declare, before any work.

Reads the names the host was given from the inventory (its host and group variables, with
host_vars/ and group_vars/ beside the inventory or the playbook) and from extra vars (-e),
keeps those under the project's prefixes (plugin_utils/setting_names.py) and fails naming each
one no role's meta/argument_specs.yml declares, with the closest declared name:

    unknown setting: train_epoch (from extra vars): did you mean train_epochs? ...

    - name: Check that every setting given is one the project declares
      specfleet.ascend.specfleet_setting_names:

Facts set earlier in the run are not settings and are left out. Runs in --check mode too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ansible.plugins.action import ActionBase
from ansible_collections.specfleet.ascend.plugins.plugin_utils.setting_names import (
    declared_settings,
    refusal,
    unknown_settings,
)

ROLES = Path(__file__).resolve().parents[2] / "roles"


class ActionModule(ActionBase):
    _requires_connection = False
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        manager = self._task.get_variable_manager()
        name = (task_vars or {}).get("inventory_hostname")
        host = manager._inventory.get_host(name)
        extra = set(manager.extra_vars)
        # The inventory's view of the host, without a play: inventory files and vars plugins,
        # facts and extra vars. The facts are this run's, not settings.
        try:
            cached = manager._fact_cache.get(host.name) or {}
        except KeyError:  # nothing cached for the host yet
            cached = {}
        facts = set(cached) | set(manager._nonpersistent_fact_cache.get(host.name) or {})
        given = set(manager.get_vars(host=host, include_hostvars=False)) - (facts - extra)
        declared = declared_settings(ROLES)
        unknown = unknown_settings(given, declared)
        result["changed"] = False
        if unknown:
            where = {n: "extra vars" if n in extra else "the inventory" for n in unknown}
            result.update(failed=True, msg=refusal(where, declared), unknown=unknown)
        else:
            result["msg"] = (
                f"{len(given)} variables given, none unknown under the project's prefixes"
            )
        return result
