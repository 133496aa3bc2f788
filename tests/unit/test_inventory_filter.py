"""plugins/filter/inventory.py: what the artifact suite is told of the hosts."""

from __future__ import annotations

from plugin_loader import load_plugin

inventory = load_plugin("plugins/filter/inventory.py")


def test_the_connection_variables_in_ansible_inventorys_shape() -> None:
    hostvars = {
        "a2-1": {"ansible_host": "10.0.0.5", "ansible_port": 2222, "specfleet_root": "/r", "x": 1},
        "local": {"ansible_connection": "local"},
        "other": {"ansible_host": "never asked"},
    }
    assert inventory.connection_inventory(["a2-1", "local"], hostvars) == {
        "all": {"hosts": ["a2-1", "local"]},
        "_meta": {
            "hostvars": {
                "a2-1": {"ansible_host": "10.0.0.5", "ansible_port": 2222},
                "local": {"ansible_connection": "local"},
            }
        },
    }


def test_a_host_reached_with_a_password_gets_none_and_no_password_is_written() -> None:
    hostvars = {"a": {"ansible_host": "h"}, "b": {"ansible_host": "h", "ansible_ssh_pass": "s"}}
    assert inventory.connection_inventory(["a", "b"], hostvars) is None
    assert inventory.connection_inventory(["a"], hostvars) is not None
    assert inventory.FilterModule().filters() == {
        "connection_inventory": inventory.connection_inventory
    }
