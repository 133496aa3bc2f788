"""Record every playbook run with ARA (ARA Records Ansible) when a setting turns it on.

ARA's own callback (`ara_default`) lives in the ara package, not on specfleet's callback path,
and records whenever it is enabled. This callback is always enabled in ansible.cfg and costs
nothing until SPECFLEET_ARA (or `enabled` under `[specfleet_ara]` in ansible.cfg) is true:
then it loads ARA's callback and hands it every event, so the run (plays, hosts, tasks, results,
durations) lands in a local SQLite database under the reports directory, or on an ARA server
when ARA_API_CLIENT=http and ARA_API_SERVER say so (ARA's own settings, used as they are).

    SPECFLEET_ARA=1 ansible-playbook site.yml -l atlas-a2
    ARA_DATABASE_NAME=reports/ara/ansible.sqlite ara playbook list
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleError
from ansible.plugins.callback import CallbackBase
from ansible.plugins.loader import callback_loader

DOCUMENTATION = """
name: ara
type: notification
short_description: record the run with ARA when SPECFLEET_ARA is on
description:
  - Off by default. When on, loads ARA's callback (ara_default, from the ara package) and
    forwards every event to it.
  - ARA's offline client writes to a SQLite database, reports/ara/ansible.sqlite in the checkout
    (under the current directory where specfleet is an installed collection)
    unless `database` (or ARA_DATABASE_NAME) names another. With ARA_API_CLIENT=http the run
    goes to the ARA server at ARA_API_SERVER instead.
requirements:
  - the ara package with its server extra (requirements/controller.txt)
options:
  enabled:
    description: Record the run with ARA.
    type: bool
    default: false
    env:
      - name: SPECFLEET_ARA
    ini:
      - section: specfleet_ara
        key: enabled
  database:
    description:
      - The SQLite database of ARA's offline client. Empty, ARA_DATABASE_NAME when set, else
        reports/ara/ansible.sqlite in the checkout (or the current directory, installed).
    type: path
    default: ""
    env:
      - name: SPECFLEET_ARA_DATABASE
    ini:
      - section: specfleet_ara
        key: database
"""

# Where specfleet's files are: a checkout (it has galaxy.yml) or the installed collection.
CONTENT_DIR = Path(__file__).resolve().parents[2]


def default_database() -> Path:
    """reports/ara/ansible.sqlite in the checkout, or under the current directory when
    specfleet runs as an installed collection (as the fleet reports are)."""
    project = CONTENT_DIR if (CONTENT_DIR / "galaxy.yml").is_file() else Path.cwd()
    return project / "reports" / "ara" / "ansible.sqlite"


# The events ARA's callback records (ara/plugins/callback/ara_default.py).
FORWARDED = (
    "v2_playbook_on_start",
    "v2_playbook_on_play_start",
    "v2_playbook_on_handler_task_start",
    "v2_playbook_on_task_start",
    "v2_runner_on_start",
    "v2_runner_on_ok",
    "v2_runner_on_unreachable",
    "v2_runner_on_failed",
    "v2_runner_on_skipped",
    "v2_runner_item_on_ok",
    "v2_runner_item_on_failed",
    "v2_runner_item_on_skipped",
    "v2_playbook_on_include",
    "v2_playbook_on_stats",
)


def ara_environment(database: str, environ: dict[str, str]) -> dict[str, str]:
    """ARA's settings for this run: its offline client on `database` (or ARA_DATABASE_NAME, or
    the default under reports/), its server settings beside it; an http client as configured."""
    if environ.get("ARA_API_CLIENT", "offline") == "http":
        return {}
    path = Path(database or environ.get("ARA_DATABASE_NAME") or default_database())
    return {
        "ARA_DATABASE_NAME": str(path),
        # where ARA's server side keeps its settings.yaml and logs: beside the database
        "ARA_BASE_DIR": environ.get("ARA_BASE_DIR", str(path.parent)),
    }


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "notification"
    CALLBACK_NAME = "specfleet.ascend.ara"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ara: Any = None

    def set_options(self, task_keys=None, var_options=None, direct=None) -> None:
        super().set_options(task_keys=task_keys, var_options=var_options, direct=direct)
        if not self.get_option("enabled"):
            # the callback manager skips a disabled callback: no event reaches it
            self.disabled = True
            return
        settings = ara_environment(self.get_option("database") or "", dict(os.environ))
        if "ARA_DATABASE_NAME" in settings:
            Path(settings["ARA_DATABASE_NAME"]).parent.mkdir(parents=True, exist_ok=True)
        os.environ.update(settings)
        try:
            from ara import setup as ara_setup
        except ImportError as exc:
            raise AnsibleError(
                "SPECFLEET_ARA is on but the ara package is not installed on the controller "
                f"({exc}): run make setup (requirements/controller.txt has ara[server])"
            ) from exc
        callback_loader.add_directory(ara_setup.callback_plugins)
        self._ara = callback_loader.get("ara_default")
        if self._ara is None:
            raise AnsibleError(
                f"ARA's callback ara_default not found in {ara_setup.callback_plugins}"
            )
        self._ara.set_options()


def _forwarder(name: str) -> Any:
    def forward(self: CallbackModule, *args: Any, **kwargs: Any) -> Any:
        return getattr(self._ara, name)(*args, **kwargs)

    forward.__name__ = forward.__qualname__ = name
    return forward


# Defined on the class: Ansible hands a callback only the events its class implements.
for _name in FORWARDED:
    setattr(CallbackModule, _name, _forwarder(_name))
