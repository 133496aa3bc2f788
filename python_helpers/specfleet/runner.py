"""specfleet.run(): ansible-runner over one of specfleet's playbooks, its result read back."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Union

# This package sits in python_helpers/ of a checkout or of the installed collection.
CONTENT_DIR = Path(__file__).resolve().parents[2]
# The validate role's last task hands its summary over as a debug `var` of this name.
SUMMARY_KEY = "specfleet_summary"
STAT_KEYS = {
    "ok": "ok",
    "changed": "changed",
    "failures": "failed",
    "dark": "unreachable",
    "skipped": "skipped",
    "rescued": "rescued",
    "ignored": "ignored",
}


@dataclass
class HostResult:
    """One host's counters from the play recap."""

    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0
    rescued: int = 0
    ignored: int = 0


@dataclass
class RunResult:
    """What a run did: Ansible's exit status, each host's recap, and the fleet report."""

    rc: int
    status: str
    hosts: dict[str, HostResult] = field(default_factory=dict)
    # The report directory (fleet.json, fleet.md, fleet.html, junit.xml); None when the run
    # ended before its report.
    report_dir: Optional[Path] = None
    # The summary lines the console ends with: verdict, hosts per group, what was redone, where.
    summary: list[str] = field(default_factory=list)

    @property
    def green(self) -> bool:
        """Every host passed every stage, by the report (and Ansible agrees)."""
        report = self.report
        return self.rc == 0 and bool(report and report.get("green"))

    @property
    def report(self) -> Optional[dict[str, Any]]:
        """fleet.json, parsed (docs/fleet-report.md), or None when there is no report."""
        if self.report_dir is None:
            return None
        path = self.report_dir / "fleet.json"
        return json.loads(path.read_text()) if path.is_file() else None


def _playbook(name: str) -> Path:
    """site, validate, ... or a path: the playbook file to run."""
    given = Path(name)
    if given.suffix in (".yml", ".yaml") and given.is_file():
        return given.resolve()
    candidate = CONTENT_DIR / "playbooks" / f"{name.removesuffix('.yml')}.yml"
    if not candidate.is_file():
        known = sorted(p.stem for p in (CONTENT_DIR / "playbooks").glob("*.yml"))
        raise ValueError(f"playbook {name!r}: expected a playbook file or one of {known}")
    return candidate


def _callers_path(source: Union[str, os.PathLike[str]]) -> Union[str, Path]:
    """An inventory source as the caller meant it: an existing path made absolute (relative
    to the caller's directory), anything else (such as "host1,host2,") as given."""
    path = Path(source).expanduser()
    return path.resolve() if path.exists() else str(source)


def host_results(stats: Optional[Mapping[str, Mapping[str, int]]]) -> dict[str, HostResult]:
    """ansible-runner's stats ({counter: {host: n}}) as {host: HostResult}."""
    hosts: dict[str, HostResult] = {}
    for key, attribute in STAT_KEYS.items():
        for host, count in ((stats or {}).get(key) or {}).items():
            setattr(hosts.setdefault(host, HostResult()), attribute, int(count))
    return hosts


def run(
    inventory: Union[str, os.PathLike[str], Sequence[str], None] = None,
    limit: Optional[str] = None,
    extravars: Optional[Mapping[str, Any]] = None,
    *,
    playbook: str = "site",
    tags: Optional[str] = None,
    skip_tags: Optional[str] = None,
    check: bool = False,
    verbosity: int = 0,
    quiet: bool = False,
    envvars: Optional[Mapping[str, str]] = None,
    private_data_dir: Union[str, os.PathLike[str], None] = None,
    event_handler: Optional[Callable[[dict[str, Any]], Any]] = None,
) -> RunResult:
    """Run one of specfleet's playbooks (site by default) as `ansible-playbook` would.

    inventory: a path, a list of paths or an inline host list (None: ansible.cfg's, the local
    CPU-profile host); limit, tags, skip_tags, check, verbosity: as on the command line;
    extravars: like -e. The console streams to stdout unless quiet. ansible-runner keeps the
    run's events in private_data_dir, a temporary directory removed afterwards when not given
    (extra vars may hold secrets: a directory you give keeps them in env/extravars).
    """
    import ansible_runner

    book = _playbook(playbook)
    # ansible-runner works in the checkout: paths the caller gave are the caller's
    sources = [inventory] if isinstance(inventory, (str, os.PathLike)) else list(inventory or [])
    inventories = [str(_callers_path(source)) for source in sources]
    python_bin = str(Path(sys.executable).parent)
    env = {
        "ANSIBLE_CONFIG": str(CONTENT_DIR / "ansible.cfg"),
        # ansible-runner's own stdout callback wraps this one: the same console as a shell's,
        # with the console's defaults (the wrapper's documentation says otherwise)
        "ANSIBLE_STDOUT_CALLBACK": "specfleet.ascend.console",
        "ANSIBLE_DISPLAY_OK_HOSTS": os.environ.get("ANSIBLE_DISPLAY_OK_HOSTS", "false"),
        "ANSIBLE_DISPLAY_SKIPPED_HOSTS": os.environ.get("ANSIBLE_DISPLAY_SKIPPED_HOSTS", "false"),
        # reports of the installed collection go under the caller's directory, as from a shell
        "PWD": os.getcwd(),
        # ansible-playbook, ansible-inventory and pytest of this Python, whatever PATH says
        "PATH": os.pathsep.join([python_bin, os.environ.get("PATH", "/usr/bin:/bin")]),
        **({} if sys.stdout.isatty() else {"ANSIBLE_NOCOLOR": "1"}),
        **(envvars or {}),
    }
    cmdline = ["--check"] if check else []
    summary: dict[str, Any] = {}

    def on_event(event: dict[str, Any]) -> Any:
        res = (event.get("event_data") or {}).get("res") or {}
        if event.get("event") == "runner_on_ok" and isinstance(res.get(SUMMARY_KEY), dict):
            summary.update(res[SUMMARY_KEY])
        return event_handler(event) if event_handler else True

    with tempfile.TemporaryDirectory(prefix="specfleet-runner-") as scratch:
        runner = ansible_runner.run(
            private_data_dir=str(private_data_dir or scratch),
            project_dir=str(CONTENT_DIR),
            playbook=str(book),
            inventory=inventories or None,
            limit=limit,
            extravars=dict(extravars or {}),
            tags=tags,
            skip_tags=skip_tags,
            cmdline=" ".join(cmdline) or None,
            verbosity=verbosity or None,
            envvars=env,
            quiet=quiet,
            event_handler=on_event,
        )
        rc = int(runner.rc if runner.rc is not None else -1)
        hosts = host_results(runner.stats)
        status = str(runner.status)
    report_dir = summary.get("report_dir")
    return RunResult(
        rc=rc,
        status=status,
        hosts=hosts,
        report_dir=Path(report_dir) if report_dir else None,
        summary=[str(line) for line in summary.get("summary") or []],
    )
