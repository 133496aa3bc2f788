"""plugins/action/specfleet_stage_decide.py: a stage's inputs against its stamp, then the one
verifier on its artifacts (roles/stage/tasks/begin.yml). The pure parts directly; the action
through a real ansible-playbook run on localhost against a stamp stage_verify published."""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any

import pytest
from jinja2 import Environment
from jinja2.filters import do_truncate
from playrun import REPO, run_cases
from plugin_loader import load_plugin
from specfleet_helpers.checks import stage_verify

decide = load_plugin("plugins/action/specfleet_stage_decide.py")

INPUTS = {
    "epochs": 1,
    "lr": 0.0003,
    "upstream": {"data": "abc"},
    "script_sha256": "f" * 64,
    "name": "Qwen/Qwen3-8B",
}


def stamp_of(inputs: dict) -> dict:
    return {"fingerprint": decide.fingerprint(inputs), "inputs": inputs, "run_id": "r1"}


def test_the_fingerprint_is_what_the_stamps_hold() -> None:
    """Stamps hold `inputs | to_json(sort_keys=true) | hash('sha256')`: the same bytes, or
    every stage would redo once after an upgrade."""
    expected = hashlib.sha256(json.dumps(INPUTS, sort_keys=True).encode()).hexdigest()
    assert decide.fingerprint(INPUTS) == expected
    assert decide.fingerprint(dict(reversed(list(INPUTS.items())))) == expected


def test_an_unchanged_stage_has_no_reason() -> None:
    assert decide.plan(INPUTS, stamp_of(INPUTS), False) == {
        "inputs": INPUTS,
        "fingerprint": decide.fingerprint(INPUTS),
        "reason": "",
    }


def test_a_rendered_script_is_an_input_by_its_sha256() -> None:
    """What `lookup('template', ...) | hash('sha256')` put into the inputs before: the same
    script_sha256, so a stamp from before still matches."""
    script = "#!/usr/bin/env bash\necho '==> train'\n"
    inputs = {k: v for k, v in INPUTS.items() if k != "script_sha256"}
    expected = {**inputs, "script_sha256": hashlib.sha256(script.encode()).hexdigest()}
    planned = decide.plan(inputs, stamp_of(expected), False, script)
    assert planned["reason"] == "" and planned["inputs"] == expected
    edited = decide.plan(inputs, stamp_of(expected), False, script + "exit 1\n")
    assert edited["reason"] == "inputs changed: script_sha256"


def test_forced_and_unstamped_stages_say_why() -> None:
    assert (
        decide.plan(INPUTS, stamp_of(INPUTS), True)["reason"] == "forced by specfleet_force_stages"
    )
    assert decide.plan(INPUTS, {}, False)["reason"] == "no stamp from an earlier run"


def test_changed_inputs_are_named_whether_changed_added_or_removed() -> None:
    old = {**INPUTS, "removed": 1}
    new = {**INPUTS, "epochs": 2, "added": True}
    del new["name"]
    planned = decide.plan(new, stamp_of(old), False)
    assert planned["reason"] == "inputs changed: added, epochs, name, removed"
    assert planned["fingerprint"] == decide.fingerprint(new)


def test_a_stamp_without_inputs_still_compares_by_fingerprint() -> None:
    planned = decide.plan(INPUTS, {"fingerprint": "0" * 64}, False)
    assert planned["reason"].startswith("inputs changed: ") and "epochs" in planned["reason"]


def test_the_sessions_verification_stands_only_for_the_same_checker() -> None:
    checker = ["python3", "-m", "check"]
    stamp = {"manifest": {"files": []}, "verify_argv": checker}
    pre = {"status": "ok"}
    assert decide.usable_precheck(pre, stamp, checker) is pre
    assert decide.usable_precheck(pre, stamp, [*checker, "--new-flag"]) is None
    assert decide.usable_precheck(pre, {"verify_argv": checker}, checker) is None  # no file list
    assert decide.usable_precheck(None, stamp, checker) is None


def test_the_reason_is_cut_as_jinjas_truncate_cut_it() -> None:
    """begin.yml showed `truncate(300)` of the checker's output: the same text in stamps."""
    env = Environment()
    for text in ["short", "word " * 61, "x" * 304, "x" * 306, "a " * 200, "y" * 400]:
        assert decide.truncated(text) == do_truncate(env, text, 300), text


# --- the action in a real run -----------------------------------------------------------------

SCRIPT = "#!/usr/bin/env bash\necho '==> decide'\n"
CHECKER = [sys.executable, "-c", "print('{\"rows\": 3}')"]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One play, each case a task with ignore_errors; the registered results read back."""
    work = tmp_path_factory.mktemp("decide")
    state = work / "state"
    state.mkdir()
    artifact = work / "out.txt"
    artifact.write_text("rows\n")
    inputs = {"epochs": 1}
    planned = decide.plan(inputs, {}, False, SCRIPT)
    stamp = {
        "stage": "train",
        "fingerprint": planned["fingerprint"],
        "inputs": planned["inputs"],
        "ended": "2026-01-01T00:00:00Z",
        "artifacts": {"out": str(artifact)},
        "verify_argv": CHECKER,
        "specfleet_stamp_version": 2,
    }
    published = stage_verify.publish(state, stamp, [artifact], checker=CHECKER)
    assert published["ok"], published
    stamp_now = json.loads((state / "train.json").read_text())
    (state / "train.failed.json").write_text("{}\n")
    # A script template as the stage templates are: variables, an include beside it, quoting
    # filters, backslashes and trailing newlines.
    templates = work / "templates"
    templates.mkdir()
    (templates / "part.sh.j2").write_text("echo part {{ demo_epochs }}\n")
    (templates / "stage.sh.j2").write_text(
        "#!/usr/bin/env bash\n{% include 'part.sh.j2' %}\n"
        "printf '%s\\n' {{ demo_name | quote }} \\\n  --flag\n"
        "{% for i in range(2) %}\necho {{ i }}\n{% endfor %}\n\n"
    )

    common = {
        "stage": "train",
        "inputs": inputs,
        "script": SCRIPT,
        "stamp": stamp_now,
        "verifier": CHECKER,
        "state_dir": str(state),
        "python": sys.executable,
        "env": {"PYTHONPATH": str(REPO / "python_helpers")},
        "stage_runs": {"data": "d1"},
        "run_results": {},
    }

    def case(name: str, keywords: dict[str, Any] | None = None, **args: Any) -> dict[str, Any]:
        return {
            "name": name,
            "specfleet.ascend.specfleet_stage_decide": {**common, **args},
            **(keywords or {}),
        }

    played = run_cases(
        work,
        [
            case("up_to_date", failure_recorded=True),
            {
                "name": "facts_after_up_to_date",
                "ansible.builtin.debug": {
                    "msg": "{{ {'runs': specfleet_stage_runs, 'results': specfleet_run_results,"
                    " 'upstream': stage_upstream} }}"
                },
            },
            # A refused precondition: its message, and nothing it guards is templated.
            case(
                "precondition_refused",
                {"vars": {"demo_layers": 2}},
                inputs="{{ undefined_until_the_preconditions_hold }}",
            ),
            case("changed_input", inputs={"epochs": 2}),
            # Its upstream stages come first: the run ids are stage_upstream for the inputs.
            case(
                "upstream_input", inputs={"epochs": 1, "upstream": "{{ stage_upstream.run_ids }}"}
            ),
            # None of its other options is templated when one is missing or would run.
            case("missing_upstream", stage_runs={}, inputs="{{ undefined_variable.x }}"),
            case(
                "pending_upstream",
                {"check_mode": True},
                stage_runs={"data": "pending"},
                inputs="{{ undefined_variable.x }}",
            ),
            {"name": "facts_after_pending", "ansible.builtin.debug": {"var": "stage_upstream"}},
            case("changed_input_check", {"check_mode": True}, inputs={"epochs": 2}),
            case("prechecked_bad", prechecked={"status": "failed", "output": "boom"}),
            case("unknown_option", epoch=3),
            {
                "name": "break the artifact",
                "ansible.builtin.copy": {"dest": str(artifact), "content": "rows, edited\n"},
            },
            case("damaged"),
            case("script_template", script=None, script_template=str(templates / "stage.sh.j2")),
            {
                "name": "script_by_specfleet_lookup",
                "ansible.builtin.debug": {
                    "msg": "{{ lookup('specfleet.ascend.template', '"
                    + str(templates / "stage.sh.j2")
                    + "') }}"
                },
            },
            {
                "name": "script_by_lookup",
                "ansible.builtin.debug": {
                    "msg": "{{ lookup('ansible.builtin.template', '"
                    + str(templates / "stage.sh.j2")
                    + "') }}"
                },
            },
        ],
        play_vars={
            "demo_layers": 4,
            "demo_epochs": 7,
            "demo_name": "it's",
            # The stage's declaration: its preconditions are read as written.
            "specfleet_stages": {
                "data": {"needs": [], "provides": "the dataset"},
                "train": {
                    "needs": ["data"],
                    "preconditions": [
                        {
                            "name": "demo_layers >= 3",
                            "that": "_layers | int >= 3",
                            "msg": "demo_layers is {{ _layers }}, expected at least 3",
                            "vars": {"_layers": "{{ demo_layers }}"},
                        }
                    ],
                },
            },
        },
    )
    return {
        "results": played.results,
        "stdout": played.stdout,
        "stamp": stamp_now,
        "state": state,
    }


def test_an_up_to_date_stage_is_verified_on_the_host_and_skipped(run: dict[str, Any]) -> None:
    r = run["results"]["up_to_date"]
    assert not r.get("failed"), r
    assert r["redo"] is False and r["reason"] == ""
    assert r["msg"] == f"train: up to date, skipping (stamp {r['fingerprint'][:12]})"
    assert r["stage_runs"] == {"data": "d1", "train": run["stamp"]["run_id"]}
    assert r["run_results"] == {"train": {"status": "up_to_date", "reason": "", "duration_s": None}}
    assert r["previous"] == run["stamp"] and r["script"] == SCRIPT
    assert r["checker"] == CHECKER
    # The earlier failure record no longer stands: removed, and that is the task's change.
    assert r["changed"] is True and not (run["state"] / "train.failed.json").exists()
    # The progress callback prints the plan line.
    assert r["specfleet_plan"] == r["msg"] and f"[localhost] {r['msg']}" in run["stdout"]
    # The facts every later stage reads, set as set_fact would (no task of their own).
    facts = run["results"]["facts_after_up_to_date"]["msg"]
    assert facts["runs"] == r["stage_runs"] and facts["results"] == r["run_results"]
    assert facts["upstream"]["run_ids"] == {"data": "d1"}, facts


def test_a_refused_precondition_fails_the_stage_with_its_message(run: dict[str, Any]) -> None:
    r = run["results"]["precondition_refused"]
    assert r["failed"] is True and r["msg"] == "demo_layers is 2, expected at least 3"
    assert r["rule"] == "demo_layers >= 3" and "redo" not in r


def test_a_changed_input_redoes_the_stage_and_names_the_input(run: dict[str, Any]) -> None:
    r = run["results"]["changed_input"]
    assert r["redo"] is True and r["reason"] == "inputs changed: epochs"
    assert r["msg"] == "train: running: inputs changed: epochs"
    assert r["stage_runs"]["train"] == "pending"
    # A stage that runs is noted when it ends (finish.yml), not here.
    assert r["run_results"] == {}
    check = run["results"]["changed_input_check"]
    assert check["msg"] == "train: would run: inputs changed: epochs"
    assert check["run_results"]["train"]["status"] == "would_run"


def test_the_sessions_failed_verification_is_the_reason(run: dict[str, Any]) -> None:
    r = run["results"]["prechecked_bad"]
    assert r["redo"] is True and r["reason"] == "artifacts no longer valid: boom"


def test_a_damaged_artifact_redoes_the_stage_naming_the_file(run: dict[str, Any]) -> None:
    r = run["results"]["damaged"]
    assert r["redo"] is True, r
    assert r["reason"].startswith("artifacts no longer valid: ") and "out.txt" in r["reason"]


def test_an_unknown_option_is_named(run: dict[str, Any]) -> None:
    r = run["results"]["unknown_option"]
    assert r["failed"] and "unknown option(s) epoch" in r["msg"]


def test_scripts_render_as_the_builtin_template_lookup_renders_them(run: dict[str, Any]) -> None:
    """The same text, byte for byte: its sha256 is an input of every stamp."""
    rendered = run["results"]["script_template"]["script"]
    assert rendered == run["results"]["script_by_lookup"]["msg"]
    # The same renderer as a lookup (plugins/lookup/template.py), for the other templates.
    assert run["results"]["script_by_specfleet_lookup"]["msg"] == rendered
    assert "echo part 7" in rendered and "'it'\"'\"'s'" in rendered and "\\n" in rendered
    assert rendered.endswith("echo 1\n\n")


def test_the_upstream_run_ids_are_an_input(run: dict[str, Any]) -> None:
    r = run["results"]["upstream_input"]
    assert not r.get("failed"), r
    assert r["inputs"]["upstream"] == {"data": "d1"} and r["pending"] == []
    assert r["reason"] == "inputs changed: upstream"


def test_a_missing_upstream_stage_fails_before_anything_is_templated(run: dict[str, Any]) -> None:
    r = run["results"]["missing_upstream"]
    assert r["failed"] is True and r["missing"] == ["data"] and "redo" not in r
    assert r["msg"] == (
        "train needs data (the dataset): no stamp of it on localhost, and it does not run in "
        "this play; run site.yml, or add --tags data"
    )


def test_in_check_mode_a_pending_upstream_plans_the_stage_as_would_run(run: dict[str, Any]) -> None:
    r = run["results"]["pending_upstream"]
    assert not r.get("failed"), r
    assert r["redo"] is False and r["pending"] == ["data"]
    assert r["msg"] == "train: would run: upstream would run: data" == r["specfleet_plan"]
    assert r["stage_runs"] == {"data": "pending", "train": "pending"}
    assert r["run_results"]["train"]["status"] == "would_run"
    assert run["results"]["facts_after_pending"]["stage_upstream"]["pending"] == ["data"]
