"""What each stage gives the stages after it: its declared `outputs`, read from its stamp.

A stage declares its outputs once, in roles/specfleet/vars/main/stages.yml, as paths into its
stamp (the JSON stage_verify publishes: inputs, artifacts, metrics, run_id):

    models:
      outputs:
        verifier: artifacts.verifier
        verifier_config: metrics.verifier

Every reader finds them in one fact per host, `specfleet_outputs`, keyed by stage
(`specfleet_outputs.models.verifier`), set in two places only, both with these filters: when
the session reads the stamps earlier runs left (plugins/action/specfleet_session.py:
stamps_outputs), and when a stage that ran publishes its new stamp (roles/stage/tasks/
finish.yml: stage_outputs). A stage that is up to date keeps what its stamp gave at the
session's start.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleFilterError


def _walk(stamp: Mapping[str, Any], path: str) -> Any:
    value: Any = stamp
    for key in path.split("."):
        if not isinstance(value, Mapping) or key not in value:
            return None
        value = value[key]
    return value


def stage_outputs(stamp: Any, paths: Any) -> dict[str, Any]:
    """{name: the value at its path in `stamp`} for a stage's declared outputs (`paths`, name ->
    dotted path); a path the stamp lacks gives None (an older stamp, an artifact not made)."""
    if not paths:
        return {}
    if not isinstance(paths, Mapping) or not all(isinstance(p, str) for p in paths.values()):
        raise AnsibleFilterError(
            "stage_outputs: the outputs must map names to dotted paths into the stamp, "
            f"got {paths!r}"
        )
    stamp = stamp if isinstance(stamp, Mapping) else {}
    return {str(name): _walk(stamp, path) for name, path in paths.items()}


def stamps_outputs(stamps: Any, stages: Any) -> dict[str, dict[str, Any]]:
    """{stage: its outputs} for every declared stage (`stages`: specfleet_stages) that declares
    outputs, from its stamp in `stamps` ({stage: stamp}); a stage without a stamp gives each
    output as None (what a reader checks for, e.g. the yardstick without a converted draft)."""
    if not isinstance(stamps, Mapping) or not isinstance(stages, Mapping):
        raise AnsibleFilterError(
            "stamps_outputs: expected the stamps and specfleet_stages, mappings"
        )
    return {
        str(stage): stage_outputs(stamps.get(stage), declared.get("outputs"))
        for stage, declared in stages.items()
        if isinstance(declared, Mapping) and declared.get("outputs")
    }


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"stage_outputs": stage_outputs, "stamps_outputs": stamps_outputs}
