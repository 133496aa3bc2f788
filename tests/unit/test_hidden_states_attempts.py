"""hidden_states.sh runs generate-offline-data again when it fails, resuming, up to
hidden_states_generate_attempts runs: the loop exactly as rendered (the golden A2 script, which
test_golden_scripts holds to the template), run by bash with the client and the server's
helper replaced by stand-ins that fail on purpose.

Why it exists: speculators 0.9.0's client waits at most 10 s for the server's writer to release a
row's file lock and then aborts the run (--fail-on-error); on a busy host (CI's four-host fleet on
two cores) one row in nine hundred did, and the job failed."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden" / "npu" / "atlas-a2" / "hidden_states.sh"


def generate_loop() -> str:
    text = GOLDEN.read_text()
    start = text.index("attempt=1\n")
    end = text.index("\ndone\n", start) + len("\ndone\n")
    return text[start:end]


# The client: one more row written per run; fails while its run count is in FAIL_RUNS.
CLIENT = """#!/bin/bash
runs=$(( $(cat "$STATE/runs" 2>/dev/null || echo 0) + 1 ))
echo "$runs" > "$STATE/runs"
touch "$OUT.tmp/hs_$runs.safetensors"
case " $FAIL_RUNS " in *" $runs "*) echo "TimeoutError (row lock)" >&2; exit 1 ;; esac
exit 0
"""


def run_loop(tmp_path: Path, fail_runs: str, watch_rc: int = 0) -> subprocess.CompletedProcess:
    client = tmp_path / "client"
    client.write_text(CLIENT)
    client.chmod(0o755)
    (tmp_path / "out.tmp").mkdir()
    # server watch waits for the client, as vllm_server's does, and fails with WATCH_RC (the
    # server died); every call is recorded.
    prelude = f"""set -euo pipefail
PY={client}; OUT={tmp_path}/out; HOST=127.0.0.1; PORT=1
export STATE={tmp_path} OUT FAIL_RUNS="{fail_runs}"
server() {{
  echo "$*" >> {tmp_path}/server.calls
  [ "$1" = watch ] || return 0
  while kill -0 "$3" 2>/dev/null; do sleep 0.02; done
  return {watch_rc}
}}
"""
    return subprocess.run(
        ["bash", "-c", prelude + generate_loop() + "echo finished\n"],
        capture_output=True,
        text=True,
        timeout=60,
    )


def runs(tmp_path: Path) -> int:
    return int((tmp_path / "runs").read_text())


def test_the_rendered_loop_allows_three_runs() -> None:
    assert 'if [ "$attempt" -ge 3 ]; then' in generate_loop()


def test_a_failed_run_is_run_again_and_resumes(tmp_path: Path) -> None:
    done = run_loop(tmp_path, fail_runs="1 2")
    assert done.returncode == 0, done.stderr
    assert runs(tmp_path) == 3
    assert "attempt 2 of 3: the last exited 1; resuming from the 1 rows written" in done.stdout
    assert "attempt 3 of 3: the last exited 1; resuming from the 2 rows written" in done.stdout
    assert done.stdout.rstrip().endswith("finished")
    # the server is checked healthy before each further run
    assert (tmp_path / "server.calls").read_text().count("wait --timeout") == 2


def test_the_last_failed_run_fails_the_stage_naming_the_setting(tmp_path: Path) -> None:
    done = run_loop(tmp_path, fail_runs="1 2 3")
    assert done.returncode == 1
    assert runs(tmp_path) == 3
    assert "failed (exit 1) on attempt 3 of 3, 3 rows written: giving up" in done.stderr
    assert "(hidden_states_generate_attempts)" in done.stderr
    assert "finished" not in done.stdout


@pytest.mark.parametrize("fail_runs", ["", "1"])
def test_a_dead_server_is_not_retried(tmp_path: Path, fail_runs: str) -> None:
    done = run_loop(tmp_path, fail_runs=fail_runs, watch_rc=3)
    assert done.returncode == 3
    assert runs(tmp_path) == 1
    assert "again" not in done.stdout
