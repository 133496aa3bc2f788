"""The one stage verifier: a stamp's file list, its recorded checker and the facts it re-reads."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from specfleet_helpers.checks import stage_verify
from specfleet_helpers.host import stamps


def artifacts(top: Path) -> Path:
    """A checkpoint-like tree: two epochs, a link to the best one, a small config."""
    for epoch in ("0", "1"):
        (top / epoch).mkdir(parents=True)
        (top / epoch / "model.safetensors").write_bytes(b"w" * (100 + int(epoch)))
        (top / epoch / "config.json").write_text('{"hidden_size": 128}')
    (top / "checkpoint_best").symlink_to("1")
    return top


def checker(prints: dict[str, Any], rc: int = 0) -> list[str]:
    """A real command that prints a checker's JSON line (or fails like one)."""
    code = f"import sys; print({json.dumps(json.dumps(prints))}); sys.exit({rc})"
    if rc:
        code = f"import sys; sys.stderr.write('dataset check failed: no rows\\n'); sys.exit({rc})"
    return [sys.executable, "-c", code]


def write_stamp(state: Path, stage: str, **fields: Any) -> dict[str, Any]:
    state.mkdir(exist_ok=True)
    stamp = {"stage": stage, "run_id": "r1", "metrics": {}, **fields}
    stamps.write(state, stamp)
    return stamp


def test_manifest_lists_files_with_size_and_checksum_and_links(tmp_path: Path) -> None:
    top = artifacts(tmp_path / "ckpt")
    m = stage_verify.manifest([top])
    assert set(m["files"]) == {
        str(top / e / f) for e in ("0", "1") for f in ("model.safetensors", "config.json")
    }
    entry = m["files"][str(top / "1" / "model.safetensors")]
    assert entry["size"] == 101 and len(entry["sha256"]) == 64
    # the link is recorded as a link, its target's files once
    assert m["links"] == {str(top / "checkpoint_best"): "1"}
    assert m["hash_limit_bytes"] == stage_verify.HASH_LIMIT_BYTES == 64 * 1024 * 1024


def test_files_over_the_limit_are_listed_by_size_only(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(stage_verify, "HASH_LIMIT_BYTES", 50)
    top = artifacts(tmp_path / "ckpt")
    m = stage_verify.manifest([top])
    assert "sha256" not in m["files"][str(top / "0" / "model.safetensors")]
    assert "sha256" in m["files"][str(top / "0" / "config.json")]


def test_manifest_refuses_a_missing_artifact(tmp_path: Path) -> None:
    with pytest.raises(stage_verify.VerifyError, match="does not exist"):
        stage_verify.manifest([tmp_path / "absent"])


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda t: (t / "1" / "model.safetensors").write_bytes(b""), "has 0 bytes, the stamp"),
        (lambda t: (t / "0" / "model.safetensors").unlink(), "model.safetensors is missing"),
        (lambda t: (t / "0" / "config.json").write_text('{"hidden_size": 256}'), "changed"),
        (
            lambda t: ((t / "checkpoint_best").unlink(), (t / "checkpoint_best").symlink_to("0")),
            "links to 0, the stamp recorded 1",
        ),
        (lambda t: (t / "checkpoint_best").unlink(), "checkpoint_best is missing"),
    ],
    ids=["emptied", "deleted", "edited", "relinked", "unlinked"],
)
def test_check_manifest_names_the_damaged_file(tmp_path: Path, damage, message) -> None:
    top = artifacts(tmp_path / "ckpt")
    recorded = stage_verify.manifest([top])
    assert stage_verify.check_manifest(recorded) == 4
    damage(top)
    with pytest.raises(stage_verify.VerifyError, match=message):
        stage_verify.check_manifest(recorded)


def test_extra_files_do_not_count_as_damage(tmp_path: Path) -> None:
    # e.g. a datasets cache file written beside the prepared data by a later reader
    top = artifacts(tmp_path / "ckpt")
    recorded = stage_verify.manifest([top])
    (top / "0" / "cache-123.arrow").write_bytes(b"c")
    assert stage_verify.check_manifest(recorded) == 4


def test_compare_metrics_skips_timings_and_keys_the_stamp_lacks() -> None:
    fresh = {"rows": 10, "elapsed_s": 3.2, "duration": 1, "new_key": 1, "nested": {"n": 2.0}}
    recorded = {"rows": 10, "elapsed_s": 9.9, "duration": 5, "nested": {"n": 2}}
    assert stage_verify.compare_metrics(fresh, recorded) == []
    differ = stage_verify.compare_metrics(
        {"rows": 10, "nested": {"n": 3}}, {"rows": 9, "nested": {"n": 2}}
    )
    assert differ == [
        "nested.n is 3 in the files, 2 in the stamp",
        "rows is 10 in the files, 9 in the stamp",
    ]


def test_verify_ok_then_each_kind_of_break(tmp_path: Path) -> None:
    top = artifacts(tmp_path / "ckpt")
    stamp = {
        "stage": "data",
        "metrics": {"rows": 10, "elapsed_s": 1.0},
        "manifest": stage_verify.manifest([top]),
        "verify_argv": checker({"rows": 10, "elapsed_s": 7.0}),
    }
    ok = stage_verify.verify(stamp)
    assert ok == {
        "status": "ok",
        "problem": None,
        "files": 4,
        "metrics": ["rows"],
        "checker": "ran",
    }

    lying = {**stamp, "metrics": {"rows": 11}}
    out = stage_verify.verify(lying)
    assert out["status"] == "damaged"
    assert (
        out["problem"]
        == "metrics disagree with the files: rows is 10 in the files, 11 in the stamp"
    )

    failing = {**stamp, "verify_argv": checker({}, rc=1)}
    out = stage_verify.verify(failing)
    assert out["status"] == "damaged"
    assert out["problem"] == "checker exited 1: dataset check failed: no rows"

    # the checker given by the role (begin.yml) wins over the stamp's
    assert stage_verify.verify(failing, checker({"rows": 10}))["status"] == "ok"


def test_older_stamps(tmp_path: Path) -> None:
    old = {"stage": "data", "metrics": {"rows": 10}, "specfleet_stamp_version": 1}
    # validate.yml: nothing to verify with, so not passed
    assert stage_verify.verify(old)["status"] == "unverified"
    # begin.yml: the role's checker decides, as before manifests existed
    assert stage_verify.verify(old, checker({"rows": 10}))["status"] == "ok"
    assert stage_verify.verify(old, [])["status"] == "ok"
    assert stage_verify.verify(old, checker({"rows": 9}))["status"] == "damaged"


def test_cli_check_records_the_missing_manifest_once(tmp_path: Path, capsys) -> None:
    top = artifacts(tmp_path / "ckpt")
    state = tmp_path / "state"
    write_stamp(state, "train", artifacts={"draft": str(top), "none": None}, metrics={"rows": 1})
    argv = checker({"rows": 1})
    args = ["check", f"--state-dir={state}", "--stage=train", "--checker-json", json.dumps(argv)]
    assert stage_verify.main([*args, "--record-missing"]) == 0
    assert capsys.readouterr().out.strip() == "train: ok (metrics rows re-read) (manifest recorded)"
    recorded = stamps.load(state)["train"]
    assert len(recorded["manifest"]["files"]) == 4 and recorded["verify_argv"] == argv
    assert stage_verify.main([*args, "--record-missing"]) == 0
    assert capsys.readouterr().out.strip() == "train: ok (4 files as stamped; metrics rows re-read)"
    # validate.yml's form: the stamp's own checker, no role variables
    (top / "0" / "config.json").write_text('{"hidden_size": 256}')
    assert stage_verify.main(["check", f"--state-dir={state}", "--stage=train"]) == 1
    out = capsys.readouterr().out.strip()
    assert out.startswith("train: damaged: ") and out.endswith(
        "config.json changed: its sha256 differs from the stamp's"
    )


def test_recorded_manifest_leaves_out_the_unlisted_artifacts(tmp_path: Path) -> None:
    """An older speculators_install stamp names the venv: listing it file by file made a
    14 MB stamp that every play then read (finish.yml leaves it out of new stamps)."""
    venv = artifacts(tmp_path / "venv")
    src = artifacts(tmp_path / "src")
    state = tmp_path / "state"
    write_stamp(state, "speculators_install", artifacts={"venv": str(venv), "src": str(src)})
    args = ["check", f"--state-dir={state}", "--stage=speculators_install"]
    args += ["--checker-json", json.dumps(checker({})), "--record-missing", "--unlisted=venv"]
    assert stage_verify.main(args) == 0
    files = stamps.load(state)["speculators_install"]["manifest"]["files"]
    assert files and all(name.startswith(str(src)) for name in files)


def test_cli_check_without_a_stamp(tmp_path: Path, capsys) -> None:
    assert stage_verify.main(["check", f"--state-dir={tmp_path}", "--stage=serve"]) == 1
    assert capsys.readouterr().out.startswith("serve: missing: no readable stamp")


def test_cli_check_all_skips_what_this_run_checked(tmp_path: Path, capsys) -> None:
    top = artifacts(tmp_path / "ckpt")
    state = tmp_path / "state"
    m = stage_verify.manifest([top])
    write_stamp(state, "train", manifest=m, verify_argv=[])
    write_stamp(state, "serve", manifest=m, verify_argv=checker({}, rc=1))
    write_stamp(state, "data")
    assert stage_verify.main(["check-all", f"--state-dir={state}", "--skip=serve"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"train", "data"}
    assert out["train"]["status"] == "ok" and out["data"]["status"] == "unverified"


def test_cli_manifest_and_help(tmp_path: Path, capsys) -> None:
    top = artifacts(tmp_path / "ckpt")
    assert stage_verify.main(["manifest", str(top)]) == 0
    assert len(json.loads(capsys.readouterr().out)["files"]) == 4
    assert stage_verify.main(["manifest", str(tmp_path / "absent")]) == 1
    with pytest.raises(SystemExit) as exc:
        stage_verify.main(["--help"])
    assert exc.value.code == 0
    assert "Verify a stage's artifacts" in capsys.readouterr().out


def test_stamps_write_is_atomic_and_readable(tmp_path: Path) -> None:
    path = stamps.write(tmp_path, {"stage": "models", "run_id": "x"})
    assert path == tmp_path / "models.json"
    assert stamps.load(tmp_path) == {"models": {"stage": "models", "run_id": "x"}}
    assert [p.name for p in tmp_path.iterdir()] == ["models.json"]
    assert oct(path.stat().st_mode & 0o777) == "0o640"


def test_the_checker_speaks_first_and_begin_gets_its_own_words(tmp_path: Path, capsys) -> None:
    """A failing checker is reported before the file list (its message says more), and in
    --reason form (begin.yml's 'artifacts no longer valid: ...') exactly as it printed it."""
    top = artifacts(tmp_path / "ckpt")
    state = tmp_path / "state"
    bad = [sys.executable, "-c", "import sys; sys.exit('model_check: weights truncated')"]
    write_stamp(state, "models", manifest=stage_verify.manifest([top]), verify_argv=bad)
    (top / "0" / "model.safetensors").unlink()
    base = ["check", f"--state-dir={state}", "--stage=models"]
    assert stage_verify.main([*base, "--reason"]) == 1
    assert capsys.readouterr().out.strip() == "model_check: weights truncated"
    assert stage_verify.main(base) == 1
    assert capsys.readouterr().out.strip() == (
        "models: damaged: checker exited 1: model_check: weights truncated"
    )
    # with a checker that passes, the file list names the deleted file
    assert stage_verify.main([*base, "--reason", "--checker-json=[]"]) == 1
    assert (
        capsys.readouterr()
        .out.strip()
        .endswith("0/model.safetensors is missing (the stamp lists 100 bytes)")
    )


# --- the hash index -------------------------------------------------------------------------


def counting_sha256(monkeypatch) -> list[Path]:
    """Record every file actually read for its checksum."""
    read: list[Path] = []
    real = stage_verify.sha256_of

    def sha256_of(path: Path) -> str:
        read.append(path)
        return real(path)

    monkeypatch.setattr(stage_verify, "sha256_of", sha256_of)
    return read


def test_index_skips_files_unchanged_since_their_hashing(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(stage_verify, "RACY_WINDOW_NS", 0)
    top = artifacts(tmp_path / "ckpt")
    recorded = stage_verify.manifest([top])
    read = counting_sha256(monkeypatch)
    path = tmp_path / "cache" / "sha256-index.json"
    first = stage_verify.HashIndex(path)
    assert stage_verify.check_manifest(recorded, first) == 4
    first.save()
    assert len(read) == 4 and path.is_file()
    # A later check (another process) reads the index and no file again.
    assert stage_verify.check_manifest(recorded, stage_verify.HashIndex(path)) == 4
    assert len(read) == 4


def test_index_rehashes_a_file_edited_in_place_with_its_mtime_restored(
    tmp_path, monkeypatch
) -> None:
    """Same size, same mtime (`touch -d`, rsync -t): the ctime still moves, so it is read."""
    monkeypatch.setattr(stage_verify, "RACY_WINDOW_NS", 0)
    top = artifacts(tmp_path / "ckpt")
    recorded = stage_verify.manifest([top])
    index_path = tmp_path / "index.json"
    index = stage_verify.HashIndex(index_path)
    stage_verify.check_manifest(recorded, index)
    index.save()
    config = top / "0" / "config.json"
    before = config.stat()
    time.sleep(0.05)  # past the kernel's coarse timestamp tick
    config.write_text('{"hidden_size": 256}')  # same length
    os.utime(config, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert config.stat().st_size == before.st_size
    assert config.stat().st_mtime_ns == before.st_mtime_ns
    with pytest.raises(stage_verify.VerifyError, match=r"config\.json changed"):
        stage_verify.check_manifest(recorded, stage_verify.HashIndex(index_path))


def test_index_never_trusts_a_file_written_just_before_its_hashing(tmp_path, monkeypatch) -> None:
    top = artifacts(tmp_path / "ckpt")  # written now: inside the racy window
    recorded = stage_verify.manifest([top])
    read = counting_sha256(monkeypatch)
    index_path = tmp_path / "index.json"
    index = stage_verify.HashIndex(index_path)
    stage_verify.check_manifest(recorded, index)
    index.save()
    stage_verify.check_manifest(recorded, stage_verify.HashIndex(index_path))
    assert len(read) == 8


def test_a_damaged_index_means_hashing_again(tmp_path, monkeypatch) -> None:
    top = artifacts(tmp_path / "ckpt")
    recorded = stage_verify.manifest([top])
    index_path = tmp_path / "index.json"
    index_path.write_text('{"version": 1, "files": ')
    read = counting_sha256(monkeypatch)
    assert stage_verify.check_manifest(recorded, stage_verify.HashIndex(index_path)) == 4
    assert len(read) == 4


def test_index_drops_files_that_are_gone(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(stage_verify, "RACY_WINDOW_NS", 0)
    top = artifacts(tmp_path / "ckpt")
    index_path = tmp_path / "index.json"
    index = stage_verify.HashIndex(index_path)
    stage_verify.check_manifest(stage_verify.manifest([top]), index)
    (top / "0" / "config.json").unlink()
    index.save()
    kept = json.loads(index_path.read_text())["files"]
    assert str(top / "0" / "config.json") not in kept
    assert str(top / "1" / "config.json") in kept


def test_cli_check_keeps_its_index_beside_the_state_dir(tmp_path) -> None:
    top = artifacts(tmp_path / "root" / "train")
    state = tmp_path / "root" / "state"
    write_stamp(state, "train", manifest=stage_verify.manifest([top]))
    args = ["check", f"--state-dir={state}", "--stage=train"]
    assert stage_verify.main(args) == 0
    assert (tmp_path / "root" / "cache" / "sha256-index.json").is_file()
    assert stage_verify.main([*args, "--index=none"]) == 0


# --- the checkers' kept results ----------------------------------------------------------------


def counting_checker(tmp_path: Path, prints: dict[str, Any], rc: int = 0) -> tuple[list[str], Path]:
    """A checker that notes each of its runs in a file outside the artifacts."""
    runs = tmp_path / "checker-runs"
    code = (
        f"import sys; open({str(runs)!r}, 'a').write('x'); print({json.dumps(json.dumps(prints))});"
        f" sys.exit({rc})"
    )
    return [sys.executable, "-c", code], runs


def runs_of(runs: Path) -> int:
    return len(runs.read_text()) if runs.exists() else 0


def kept_stamp(tmp_path: Path, argv: list[str]) -> tuple[dict[str, Any], Path]:
    top = artifacts(tmp_path / "ckpt")
    stamp = {
        "stage": "train",
        "run_id": "r1",
        "fingerprint": "f1",
        "artifacts": {"checkpoint": str(top)},
        "metrics": {"rows": 10},
        "manifest": stage_verify.manifest([top]),
        "verify_argv": argv,
    }
    return stamp, top


def test_a_passing_checker_is_not_started_again_while_its_files_keep_their_stat(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.setattr(stage_verify, "RACY_WINDOW_NS", 0)
    argv, runs = counting_checker(tmp_path, {"rows": 10})
    stamp, top = kept_stamp(tmp_path, argv)
    path = tmp_path / "cache" / "checker-results.json"
    first = stage_verify.CheckerResults(path)
    assert stage_verify.verify(stamp, results=first)["checker"] == "ran"
    first.save()
    again = stage_verify.verify(stamp, results=stage_verify.CheckerResults(path))
    assert again["status"] == "ok" and again["checker"] == "kept" and again["metrics"] == ["rows"]
    assert runs_of(runs) == 1
    assert "checker result kept" in stage_verify.line("train", again)
    # Rewritten with the same bytes: the stat moved, so the checker reads it again.
    time.sleep(0.05)
    (top / "0" / "config.json").write_text('{"hidden_size": 128}')
    assert stage_verify.verify(stamp, results=stage_verify.CheckerResults(path))["checker"] == "ran"
    assert runs_of(runs) == 2


def test_kept_results_depend_on_the_checker_and_the_stamp(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(stage_verify, "RACY_WINDOW_NS", 0)
    argv, runs = counting_checker(tmp_path, {"rows": 10})
    stamp, _ = kept_stamp(tmp_path, argv)
    results = stage_verify.CheckerResults(tmp_path / "kept.json")
    stage_verify.verify(stamp, results=results)
    assert stage_verify.verify(stamp, results=results)["checker"] == "kept"
    assert stage_verify.verify({**stamp, "run_id": "r2"}, results=results)["checker"] == "ran"
    assert stage_verify.verify(stamp, [*argv, "--more"], results=results)["checker"] == "ran"
    assert runs_of(runs) == 3


def test_an_unlisted_venv_is_kept_by_its_package_directories_and_never_walked(
    tmp_path, monkeypatch
) -> None:
    """A venv (speculators_install's unlisted artifact) counts by its configuration, bin/ and
    package directories: an install or a removal changes them, and its checker reads what
    is installed."""
    monkeypatch.setattr(stage_verify, "RACY_WINDOW_NS", 0)
    argv, runs = counting_checker(tmp_path, {"rows": 10})
    venv = tmp_path / "venv"
    site = venv / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (venv / "bin").mkdir()
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (venv / "bin" / "python").symlink_to(sys.executable)
    stamp = {
        "stage": "speculators_install",
        "run_id": "r1",
        "artifacts": {"venv": str(venv), "python": str(venv / "bin" / "python")},
        "metrics": {"rows": 10},
        "manifest": stage_verify.manifest([]),
        "verify_argv": argv,
    }
    results = stage_verify.CheckerResults(tmp_path / "kept.json")
    assert stage_verify.verify(stamp, results=results)["checker"] == "ran"
    assert stage_verify.verify(stamp, results=results)["checker"] == "kept"
    # A package installed: a new directory in site-packages.
    time.sleep(0.05)
    (site / "newpkg-1.0.dist-info").mkdir()
    assert stage_verify.verify(stamp, results=results)["checker"] == "ran"
    assert runs_of(runs) == 2
    # Not walked: a real venv is ~50,000 files, a second of every run.
    monkeypatch.setattr(stage_verify.os, "walk", lambda *_: pytest.fail("the venv was walked"))
    assert stage_verify.CheckerResults.key(stamp, argv) is not None


def test_an_unlisted_tree_that_is_not_a_venv_is_never_served_from_kept_results(
    tmp_path, monkeypatch
) -> None:
    """A source tree (the git source's checkout) has no stat that stands for it."""
    monkeypatch.setattr(stage_verify, "RACY_WINDOW_NS", 0)
    argv, runs = counting_checker(tmp_path, {"rows": 10})
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    stamp = {
        "stage": "speculators_install",
        "run_id": "r1",
        "artifacts": {"src": str(src)},
        "metrics": {"rows": 10},
        "manifest": stage_verify.manifest([]),
        "verify_argv": argv,
    }
    results = stage_verify.CheckerResults(tmp_path / "kept.json")
    for _ in range(2):
        assert stage_verify.verify(stamp, results=results)["checker"] == "ran"
    assert runs_of(runs) == 2
    assert stage_verify.CheckerResults.key(stamp, argv) is None


def test_a_file_added_beside_the_listed_ones_starts_the_checker_again(
    tmp_path, monkeypatch
) -> None:
    """A checker may count the files of its directory (hidden states): one added after the
    stamp is part of what it read, so it runs again once, then is kept with it."""
    monkeypatch.setattr(stage_verify, "RACY_WINDOW_NS", 0)
    argv, runs = counting_checker(tmp_path, {"rows": 10})
    stamp, top = kept_stamp(tmp_path, argv)
    results = stage_verify.CheckerResults(tmp_path / "kept.json")
    stage_verify.verify(stamp, results=results)
    (top / "0" / "extra.bin").write_bytes(b"e")
    assert stage_verify.verify(stamp, results=results)["checker"] == "ran"
    assert stage_verify.verify(stamp, results=results)["checker"] == "kept"
    assert runs_of(runs) == 2


def test_the_helpers_zip_stands_for_the_checkers_sources_by_its_content(
    tmp_path, monkeypatch
) -> None:
    """Shipped beside the helpers in place, then moved over them (the session action): the
    same zip at a new path and ctime is the same checkers."""
    shipped = tmp_path / "specfleet_helpers.0123456789ab.zip"
    shipped.write_bytes(b"PK one")
    module = ("specfleet_helpers", "checks", "stage_verify.py")
    monkeypatch.setattr(stage_verify, "__file__", str(shipped.joinpath(*module)))
    before = stage_verify.helpers_sources()
    in_place = shipped.rename(tmp_path / "specfleet_helpers.zip")
    monkeypatch.setattr(stage_verify, "__file__", str(in_place.joinpath(*module)))
    assert stage_verify.helpers_sources() == before
    in_place.write_bytes(b"PK two")
    assert stage_verify.helpers_sources() != before


def test_a_failed_or_racy_check_is_never_kept(tmp_path, monkeypatch) -> None:
    failing, failed_runs = counting_checker(tmp_path, {}, rc=3)
    stamp, _ = kept_stamp(tmp_path, failing)
    results = stage_verify.CheckerResults(tmp_path / "kept.json")
    monkeypatch.setattr(stage_verify, "RACY_WINDOW_NS", 0)
    for _ in range(2):
        assert stage_verify.verify(stamp, results=results)["status"] == "damaged"
    assert runs_of(failed_runs) == 2 and not results.stages
    # Files written just now (the default window): their stat proves nothing yet.
    monkeypatch.setattr(stage_verify, "RACY_WINDOW_NS", 3_000_000_000)
    argv, _ = counting_checker(tmp_path / "fresh", {"rows": 10})
    fresh, _ = kept_stamp(tmp_path / "fresh", argv)
    assert stage_verify.CheckerResults.key(fresh, argv) is None


def test_metrics_are_compared_with_the_kept_result_too(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(stage_verify, "RACY_WINDOW_NS", 0)
    argv, _ = counting_checker(tmp_path, {"rows": 10})
    stamp, _ = kept_stamp(tmp_path, argv)
    results = stage_verify.CheckerResults(tmp_path / "kept.json")
    stage_verify.verify(stamp, results=results)
    # The stamp's metrics are part of the key: a stamp edited to say 11 rows is checked again.
    edited = stage_verify.verify({**stamp, "metrics": {"rows": 11}}, results=results)
    assert edited["status"] == "damaged" and edited["checker"] == "ran"


def test_cli_keeps_checker_results_beside_the_state_dir_unless_told_not_to(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.setattr(stage_verify, "RACY_WINDOW_NS", 0)
    argv, runs = counting_checker(tmp_path, {"rows": 10})
    top = artifacts(tmp_path / "root" / "train")
    state = tmp_path / "root" / "state"
    write_stamp(
        state,
        "train",
        artifacts={"checkpoint": str(top)},
        metrics={"rows": 10},
        manifest=stage_verify.manifest([top]),
        verify_argv=argv,
    )
    args = ["check", f"--state-dir={state}", "--stage=train"]
    assert stage_verify.main(args) == 0 and stage_verify.main(args) == 0
    assert (tmp_path / "root" / "cache" / "checker-results.json").is_file()
    assert runs_of(runs) == 1
    assert stage_verify.main([*args, "--checker-results=none"]) == 0
    assert stage_verify.main(["check-all", f"--state-dir={state}", "--checker-results=none"]) == 0
    assert runs_of(runs) == 3


STAMP = {"stage": "train", "fingerprint": "f" * 64, "ended": "2026-12-03T10:00:00+00:00"}


def publish_cli(state: Path, *args: str) -> list[str]:
    return ["publish", f"--state-dir={state}", f"--stamp-json={json.dumps(STAMP)}", *args]


def test_publish_runs_the_checker_lists_the_files_and_writes_the_stamp(tmp_path, capsys) -> None:
    top = artifacts(tmp_path / "ckpt")
    state = tmp_path / "state"
    state.mkdir()
    # An earlier run's failure record of the stage: a stamp written now says it passed.
    (state / "train.failed.json").write_text("{}\n")
    argv = checker({"rows": 10})
    assert (
        stage_verify.main(publish_cli(state, f"--checker-json={json.dumps(argv)}", str(top))) == 0
    )
    assert not (state / "train.failed.json").exists()
    published = json.loads(capsys.readouterr().out)
    # The run id finish.yml made in Jinja: sha256(fingerprint ~ ended), 16 digits.
    expected_id = hashlib.sha256(("f" * 64 + STAMP["ended"]).encode()).hexdigest()[:16]
    assert published == {
        "ok": True,
        "run_id": expected_id,
        "metrics": {"rows": 10},
        "files": 4,
        "output": "",
    }
    stamp = json.loads((state / "train.json").read_text())
    assert stamp == {
        **STAMP,
        "run_id": expected_id,
        "metrics": {"rows": 10},
        "manifest": stage_verify.manifest([top]),
    }
    assert oct((state / "train.json").stat().st_mode & 0o777) == "0o640"
    assert stage_verify.verify(stamp)["status"] == "ok"


def test_the_first_check_after_publish_reads_no_file_and_starts_no_checker(
    tmp_path, monkeypatch, capsys
) -> None:
    """publish keeps the checksums it computed and its checker's result, as a check keeps
    them: the next run's verification reads only what changed since (the first no-op run after
    a stage ran, on a host whose artifacts are many files)."""
    monkeypatch.setattr(stage_verify, "RACY_WINDOW_NS", 0)
    top = artifacts(tmp_path / "ckpt")
    state = tmp_path / "state"
    state.mkdir()
    argv, runs = counting_checker(tmp_path, {"rows": 10})
    stamp = {**STAMP, "artifacts": {"checkpoint": str(top)}, "verify_argv": argv}
    cli = ["publish", f"--state-dir={state}", f"--stamp-json={json.dumps(stamp)}"]
    assert stage_verify.main([*cli, f"--checker-json={json.dumps(argv)}", str(top)]) == 0
    capsys.readouterr()
    assert runs_of(runs) == 1
    read = counting_sha256(monkeypatch)
    assert stage_verify.main(["check-all", f"--state-dir={state}"]) == 0
    checked = json.loads(capsys.readouterr().out)["train"]
    assert checked["status"] == "ok" and checked["checker"] == "kept", checked
    assert read == [] and runs_of(runs) == 1
    # Changed since: read again, and the checker started again.
    time.sleep(0.05)
    (top / "0" / "config.json").write_text('{"hidden_size": 128}')
    assert stage_verify.main(["check-all", f"--state-dir={state}"]) == 0
    assert json.loads(capsys.readouterr().out)["train"]["checker"] == "ran"
    assert read == [top / "0" / "config.json"] and runs_of(runs) == 2


def test_publish_with_the_metrics_a_role_read(tmp_path, capsys) -> None:
    top = artifacts(tmp_path / "models")
    state = tmp_path / "state"
    state.mkdir()
    metrics = {"verifier": {"hidden_size": 128}}
    assert (
        stage_verify.main(publish_cli(state, f"--metrics-json={json.dumps(metrics)}", str(top)))
        == 0
    )
    assert json.loads(capsys.readouterr().out)["metrics"] == metrics
    assert json.loads((state / "train.json").read_text())["metrics"] == metrics


def test_publish_of_a_failed_checker_gives_its_own_words_and_writes_nothing(
    tmp_path, capsys
) -> None:
    top = artifacts(tmp_path / "ckpt")
    state = tmp_path / "state"
    state.mkdir()
    argv = checker({}, rc=3)
    assert (
        stage_verify.main(publish_cli(state, f"--checker-json={json.dumps(argv)}", str(top))) == 1
    )
    published = json.loads(capsys.readouterr().out)
    assert not published["ok"] and published["run_id"] is None
    assert "dataset check failed: no rows" in published["output"]
    # A missing artifact is refused by name, as the manifest command refuses it.
    gone = tmp_path / "gone"
    argv = checker({"rows": 1})
    assert (
        stage_verify.main(publish_cli(state, f"--checker-json={json.dumps(argv)}", str(gone))) == 1
    )
    assert f"artifact {gone} does not exist" in json.loads(capsys.readouterr().out)["output"]
    assert list(state.iterdir()) == []


def test_a_checker_reporting_live_state_runs_every_time_and_its_live_part_is_passed_on(
    tmp_path, monkeypatch
) -> None:
    """The serve checker of serve_mode service reports the deployed service (live_service: its
    pid, its restarts). That is the present, not what the files hold: a restart since the stamp
    is no disagreement, and the result is never kept, so a stopped service is always seen."""
    monkeypatch.setattr(stage_verify, "RACY_WINDOW_NS", 0)
    argv, runs = counting_checker(tmp_path, {"rows": 10, "live_service": {"main_pid": 42}})
    stamp, _top = kept_stamp(tmp_path, argv)
    stamp["metrics"] = {"rows": 10, "live_service": {"main_pid": 7, "restarts": 0}}
    path = tmp_path / "cache" / "checker-results.json"
    for expected_runs in (1, 2):
        results = stage_verify.CheckerResults(path)
        checked = stage_verify.verify(stamp, results=results)
        results.save()
        assert checked["status"] == "ok", checked
        assert checked["checker"] == "ran" and checked["metrics"] == ["rows"]
        assert checked["live"] == {"live_service": {"main_pid": 42}}
        assert runs_of(runs) == expected_runs
    assert stage_verify.compare_metrics({"rows": 11, "live_x": 1}, {"rows": 10, "live_x": 2}) == [
        "rows is 11 in the files, 10 in the stamp"
    ]
