"""plugins/action/specfleet_command.py through a real ansible-playbook run on localhost (one
play, each case a task run with ignore_errors, its registered result read back), and its
command line built for the host's shell."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from playrun import run_cases
from plugin_loader import load_plugin

command_action = load_plugin("plugins/action/specfleet_command.py")
PY = sys.executable

CASES: dict[str, dict[str, Any]] = {
    "json_with_env": {
        "specfleet.ascend.specfleet_command": {
            "argv": [PY, "-c", "import json, os; print(json.dumps({'v': os.environ['SF_V']}))"],
            "env": {"SF_V": "a b'c"},
            "json": True,
        }
    },
    "quoted_argv": {
        "specfleet.ascend.specfleet_command": {"argv": ["printf", "%s|", "one two", "$HOME", "'q'"]}
    },
    "stdout_and_stderr_apart": {
        "specfleet.ascend.specfleet_command": {
            "argv": [PY, "-c", "import sys; print('out'); print('err', file=sys.stderr)"]
        }
    },
    "nonzero_fails": {
        "specfleet.ascend.specfleet_command": {
            "argv": [PY, "-c", "import sys; print('why', file=sys.stderr); sys.exit(4)"]
        }
    },
    "nonzero_says_stdout": {
        "specfleet.ascend.specfleet_command": {
            "argv": [PY, "-c", "import sys; print('held by x'); sys.exit(4)"]
        }
    },
    "nonzero_allowed": {
        "specfleet.ascend.specfleet_command": {"argv": [PY, "-c", "import sys; sys.exit(4)"]},
        "failed_when": False,
    },
    "not_json": {"specfleet.ascend.specfleet_command": {"argv": ["echo", "plain"], "json": True}},
    "json_warnings": {
        "specfleet.ascend.specfleet_command": {
            "argv": [PY, "-c", "import json; print(json.dumps({'warnings': ['set again: /x']}))"],
            "json": True,
        }
    },
    "stdin_and_chdir": {
        "specfleet.ascend.specfleet_command": {
            "argv": [PY, "-c", "import os, sys; print(os.getcwd(), sys.stdin.read())"],
            "stdin": "fed",
            "chdir": "/",
        }
    },
    "unknown_option": {"specfleet.ascend.specfleet_command": {"argv": ["true"], "environment": {}}},
    "task_environment_refused": {
        "specfleet.ascend.specfleet_command": {"argv": ["true"]},
        "environment": {"X": "1"},
    },
    "empty_argv": {"specfleet.ascend.specfleet_command": {"argv": []}},
}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    cases = [{"name": name, **body} for name, body in CASES.items()]
    return run_cases(tmp_path_factory.mktemp("command"), cases).results


def test_env_reaches_the_command_and_json_is_parsed(results: dict[str, dict[str, Any]]) -> None:
    result = results["json_with_env"]
    assert not result.get("failed") and not result["changed"], result
    assert result["rc"] == 0 and result["json"] == {"v": "a b'c"}


def test_arguments_reach_the_command_unexpanded(results: dict[str, dict[str, Any]]) -> None:
    assert results["quoted_argv"]["stdout"] == "one two|$HOME|'q'|"


def test_stdout_and_stderr_stay_apart(results: dict[str, dict[str, Any]]) -> None:
    result = results["stdout_and_stderr_apart"]
    assert result["stdout_lines"] == ["out"] and result["stderr_lines"] == ["err"]


def test_a_nonzero_exit_fails_naming_the_code_and_stderr(
    results: dict[str, dict[str, Any]],
) -> None:
    result = results["nonzero_fails"]
    assert result["failed"] and result["rc"] == 4 and result["msg"] == "non-zero return code 4: why"
    assert results["nonzero_says_stdout"]["msg"] == "non-zero return code 4: held by x"
    allowed = results["nonzero_allowed"]
    assert not allowed.get("failed") and allowed["rc"] == 4


def test_output_that_is_not_json_fails_when_json_is_asked(
    results: dict[str, dict[str, Any]],
) -> None:
    result = results["not_json"]
    assert (
        result["failed"] and "echo printed no JSON" in result["msg"] and "'plain'" in result["msg"]
    )


def test_a_helpers_warnings_are_the_tasks(results: dict[str, dict[str, Any]]) -> None:
    """A helper's `warnings` lines (a mode it set again) are shown at every verbosity."""
    assert results["json_warnings"]["warnings"] == ["set again: /x"]
    assert "warnings" not in results["json_with_env"]


def test_stdin_and_the_working_directory(results: dict[str, dict[str, Any]]) -> None:
    assert results["stdin_and_chdir"]["stdout"].strip() == "/ fed"


def test_bad_use_is_named(results: dict[str, dict[str, Any]]) -> None:
    assert "unknown option(s) environment" in results["unknown_option"]["msg"]
    assert "as its env option" in results["task_environment_refused"]["msg"]
    assert "argv must be a non-empty list" in results["empty_argv"]["msg"]


def test_the_command_line_for_the_hosts_shell() -> None:
    line = command_action.shell_command(["a b", "c"], {"K": "v w"}, "/x y")
    assert line == "cd '/x y' && env 'K=v w' 'a b' c"
    assert command_action.shell_command(["true"]) == "true"
