"""specfleet for Python callers: run a playbook of this checkout (or installed collection)
through ansible-runner and get each host's result and the fleet report back.

    import specfleet
    result = specfleet.run(inventory="inventory/fleet.yml", limit="atlas-a2")
    print(result.green, result.report_dir)

The console shows what `ansible-playbook` would (specfleet.ascend.console): the plans, the
progress lines and the summary, as they come. Nothing needs to be on PATH: the Ansible of the
Python that imports this module is used.
"""

from specfleet.runner import HostResult, RunResult, run

__all__ = ["HostResult", "RunResult", "run"]
