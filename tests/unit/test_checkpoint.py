"""Tests for specfleet_helpers.stages.checkpoint: selection, atomic publish, log metrics, verify.

Everything here is in-process and needs no torch: checkpoints are laid out as
speculators.train 0.9.0 writes them, with a small but valid safetensors file. The real
training run that feeds `publish` is in test_train_cpu.py (slow).
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path
from typing import Any

import pytest
from specfleet_helpers import files
from specfleet_helpers.stages import checkpoint
from specfleet_helpers.stages.checkpoint import (
    BadInput,
    CheckpointError,
    collect_metrics,
    draft_dir_problems,
    log_records,
    parse_log_metrics,
    publish,
    safetensors_tensor_count,
    select_checkpoint,
    verify,
)

TRAINER_FILES = (
    "config.py",
    "optimizer_state_dict.pt",
    "scheduler_state_dict.pt",
    "training_state.json",
    "val_metrics.json",
    "train_command.txt",
)


def safetensors_bytes(values: tuple[float, ...] = (1.0, 2.0)) -> bytes:
    header = {
        "__metadata__": {"format": "pt"},
        "fc.weight": {"dtype": "F32", "shape": [len(values)], "data_offsets": [0, 4 * len(values)]},
    }
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + struct.pack(f"<{len(values)}f", *values)


def make_epoch(
    save: Path,
    epoch: int,
    loss: float | None = None,
    weights: bytes | None = None,
    local_step: int = 0,
) -> Path:
    """An epoch directory as speculators.train writes it, with all the trainer files."""
    directory = save / str(epoch)
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(
        json.dumps({"speculators_model_type": "dflash", "epoch_marker": epoch})
    )
    (directory / "model.safetensors").write_bytes(
        safetensors_bytes((float(epoch), 1.0)) if weights is None else weights
    )
    (directory / "config.py").write_text("# custom config class\n")
    (directory / "optimizer_state_dict.pt").write_bytes(b"optimizer")
    (directory / "scheduler_state_dict.pt").write_bytes(b"scheduler")
    (directory / "train_command.txt").write_text("python -m speculators.train ...\n")
    (directory / "training_state.json").write_text(
        json.dumps({"epoch": epoch, "local_step": local_step, "global_step": 3 * (epoch + 1)})
    )
    if loss is not None:
        (directory / "val_metrics.json").write_text(
            json.dumps({"loss_epoch": loss, "full_acc_epoch": 0.25})
        )
    link = save / f"epoch{epoch}_{'end' if local_step == 0 else f'step{local_step}'}"
    link.symlink_to(str(epoch), target_is_directory=True)
    return directory


def make_save(tmp_path: Path, epochs: int = 3, best: int | None = 1) -> Path:
    save = tmp_path / "ckpt"
    save.mkdir()
    (save / "run.yaml").write_text("train: {}\n")
    (save / "train_command.txt").write_text("python -m speculators.train ...\n")
    for epoch in range(epochs):
        make_epoch(save, epoch, loss=3.0 - 0.1 * epoch if epoch == best else None)
    if best is not None:
        (save / "checkpoint_best").symlink_to(str(best), target_is_directory=True)
    return save


def tree(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def siblings(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name != out.name)


def publish_argv(save: Path, out: Path, *extra: str) -> list[str]:
    return ["publish", "--save-path", str(save), "--out", str(out), *extra]


def run_main(argv: list[str], capsys) -> tuple[int, Any, str]:
    code = checkpoint.main(argv)
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    return code, json.loads(lines[-1]) if lines else None, captured.err


# ----------------------------------------------------------------------------- selection


def test_selects_the_checkpoint_best_symlink(tmp_path):
    save = make_save(tmp_path, epochs=3, best=1)
    chosen = select_checkpoint(save)
    assert chosen == {"path": (save / "1").resolve(), "epoch": 1, "selected_by": "checkpoint_best"}


def test_selects_the_highest_epoch_without_checkpoint_best(tmp_path):
    save = make_save(tmp_path, epochs=3, best=None)
    make_epoch(save, 10)  # numeric order: 10 > 2, not "10" < "2"
    (save / "interrupted").mkdir()  # speculators' interrupted checkpoint is not an epoch
    (save / "logs").mkdir()
    chosen = select_checkpoint(save)
    assert chosen == {"path": (save / "10").resolve(), "epoch": 10, "selected_by": "latest_epoch"}


def test_epoch_symlinks_count_as_epochs(tmp_path):
    save = tmp_path / "ckpt"
    save.mkdir()
    make_epoch(save, 0)
    # The highest epoch is only reachable through its epoch<N>_end / _step<M> links.
    elsewhere = tmp_path / "moved"
    elsewhere.mkdir()
    make_epoch(elsewhere, 3)
    (elsewhere / "epoch3_end").unlink()
    (save / "epoch3_end").symlink_to(elsewhere / "3", target_is_directory=True)
    make_epoch(elsewhere, 2, local_step=40)
    (save / "epoch2_step40").symlink_to(elsewhere / "2", target_is_directory=True)
    chosen = select_checkpoint(save)
    assert chosen["path"] == (elsewhere / "3").resolve()
    assert chosen["epoch"] == 3
    assert chosen["selected_by"] == "latest_epoch"


def test_an_epoch_link_to_a_non_numeric_directory_takes_its_epoch_from_the_name(tmp_path):
    save = tmp_path / "ckpt"
    save.mkdir()
    make_epoch(save, 1)
    target = tmp_path / "kept"
    make_epoch(tmp_path, 4).rename(target)
    (save / "epoch4_end").symlink_to(target, target_is_directory=True)
    assert select_checkpoint(save)["epoch"] == 4
    assert select_checkpoint(save)["path"] == target.resolve()


@pytest.mark.parametrize("extra", [[], ["run.yaml", "train_command.txt"], ["interrupted/"]])
def test_no_checkpoint_is_a_clear_error(tmp_path, capsys, extra):
    save = tmp_path / "ckpt"
    save.mkdir()
    for name in extra:
        if name.endswith("/"):
            (save / name).mkdir()
        else:
            (save / name).write_text("x")
    with pytest.raises(CheckpointError, match="no checkpoint under"):
        select_checkpoint(save)
    code, out, err = run_main(
        ["publish", "--save-path", str(save), "--out", str(tmp_path / "draft")], capsys
    )
    assert code == 1
    assert out is None
    assert err.count("\n") == 1
    assert err.startswith("checkpoint: no checkpoint under")
    assert "checkpoint_best" in err
    assert not (tmp_path / "draft").exists()


def test_a_dangling_checkpoint_best_is_an_error(tmp_path):
    save = make_save(tmp_path, epochs=2, best=None)
    (save / "checkpoint_best").symlink_to("7", target_is_directory=True)
    with pytest.raises(CheckpointError, match="checkpoint_best does not lead"):
        select_checkpoint(save)


# ----------------------------------------------------------------------------- publish


def test_publish_copies_only_config_and_weights(tmp_path, capsys):
    save = make_save(tmp_path, epochs=3, best=1)
    out = tmp_path / "serve" / "draft"
    code, result, err = run_main(
        ["publish", "--save-path", str(save), "--out", str(out), "--require-finite-loss"], capsys
    )
    assert code == 0, err
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
    for name in ("config.json", "model.safetensors"):
        assert (out / name).read_bytes() == (save / "1" / name).read_bytes()
        assert not (out / name).is_symlink()
    for name in (*TRAINER_FILES, "run.yaml", "checkpoint_best", "epoch1_end"):
        assert not (out / name).exists()
    # The save directory is untouched and nothing is left next to the draft.
    assert set(TRAINER_FILES) <= set(os.listdir(save / "1"))
    assert siblings(out) == []
    assert result["path"] == str(out)
    assert result["source_checkpoint"] == str((save / "1").resolve())
    assert result["selected_by"] == "checkpoint_best"
    assert result["epoch"] == 1
    assert result["changed"] is True
    assert [f["name"] for f in result["files"]] == ["config.json", "model.safetensors"]
    assert result["files"][1]["size"] == (out / "model.safetensors").stat().st_size
    assert len(result["files"][1]["sha256"]) == 64
    metrics = result["metrics"]
    assert metrics["val_loss"] == pytest.approx(2.9)
    assert metrics["val_loss_finite"] is True
    assert metrics["val_loss_source"] == "val_metrics.json"
    assert metrics["val_metrics"] == {"loss_epoch": pytest.approx(2.9), "full_acc_epoch": 0.25}
    assert metrics["training_state"] == {"epoch": 1, "local_step": 0, "global_step": 6}
    assert metrics["log"] is None
    # The published directory is readable like any other (mkdtemp would make it 0700).
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o777 & ~umask


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2-exchange", "two-renames"])
def test_publish_replaces_an_existing_draft(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(files, "exchange_paths", lambda first, second: False)
    save = make_save(tmp_path, epochs=3, best=2)
    out = tmp_path / "draft"
    out.mkdir()
    (out / "config.json").write_text("{}")
    (out / "model.safetensors").write_bytes(safetensors_bytes((9.0,)))
    (out / "optimizer_state_dict.pt").write_bytes(b"left over by the runbook's cp -af")
    result = publish(save, out)
    assert result["changed"] is True
    assert tree(out) == {
        "config.json": (save / "2" / "config.json").read_bytes(),
        "model.safetensors": (save / "2" / "model.safetensors").read_bytes(),
    }
    assert siblings(out) == ["ckpt"]


def test_publishing_the_same_draft_again_changes_nothing(tmp_path):
    save = make_save(tmp_path)
    out = tmp_path / "draft"
    assert publish(save, out)["changed"] is True
    inode = out.stat().st_ino
    again = publish(save, out)
    assert again["changed"] is False
    assert out.stat().st_ino == inode
    assert again["files"] == publish(save, out)["files"]
    assert siblings(out) == ["ckpt"]


def test_a_failure_while_copying_leaves_the_old_draft_intact(tmp_path, monkeypatch, capsys):
    save = make_save(tmp_path)
    out = tmp_path / "draft"
    out.mkdir()
    (out / "config.json").write_text('{"old": true}')
    (out / "model.safetensors").write_bytes(safetensors_bytes((7.0,)))
    before = tree(out)
    real_copy = checkpoint.copy_file

    def copy_then_fail(source: Path, destination: Path) -> str:
        if source.name == "model.safetensors":
            destination.write_bytes(b"partial")
            raise OSError(28, "No space left on device", str(destination))
        return real_copy(source, destination)

    monkeypatch.setattr(checkpoint, "copy_file", copy_then_fail)
    code, result, err = run_main(["publish", "--save-path", str(save), "--out", str(out)], capsys)
    assert code == 1
    assert result is None
    assert "No space left on device" in err
    assert err.count("\n") == 1
    assert tree(out) == before
    assert siblings(out) == ["ckpt"]


def test_a_failure_at_the_rename_restores_the_old_draft(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "exchange_paths", lambda first, second: False)
    save = make_save(tmp_path)
    out = tmp_path / "draft"
    out.mkdir()
    (out / "config.json").write_text('{"old": true}')
    (out / "model.safetensors").write_bytes(safetensors_bytes((7.0,)))
    before = tree(out)
    real_rename = os.rename

    def rename(source, destination):
        if Path(source).name.endswith(".tmp") and Path(destination) == out:
            raise OSError(5, "Input/output error")
        return real_rename(source, destination)

    monkeypatch.setattr(checkpoint.os, "rename", rename)
    with pytest.raises(OSError, match="Input/output error"):
        publish(save, out)
    assert tree(out) == before
    assert siblings(out) == ["ckpt"]


def test_an_invalid_checkpoint_is_not_published(tmp_path, capsys):
    save = tmp_path / "ckpt"
    save.mkdir()
    make_epoch(save, 0, weights=b"")
    out = tmp_path / "draft"
    code, _, err = run_main(["publish", "--save-path", str(save), "--out", str(out)], capsys)
    assert code == 1
    assert "model.safetensors is empty" in err
    assert not out.exists()


def test_require_finite_loss_refuses_a_nan_loss_and_keeps_the_old_draft(tmp_path, capsys):
    save = make_save(tmp_path, epochs=1, best=0)
    (save / "0" / "val_metrics.json").write_text('{"loss_epoch": NaN}')
    out = tmp_path / "draft"
    out.mkdir()
    (out / "config.json").write_text("{}")
    (out / "model.safetensors").write_bytes(safetensors_bytes())
    before = tree(out)
    argv = ["publish", "--save-path", str(save), "--out", str(out)]
    code, _, err = run_main([*argv, "--require-finite-loss"], capsys)
    assert code == 1
    assert "validation loss is nan (not finite)" in err
    assert tree(out) == before
    # Without the flag it publishes and says so; NaN becomes null (valid JSON).
    code, result, _ = run_main(argv, capsys)
    assert code == 0
    assert result["metrics"]["val_loss"] is None
    assert result["metrics"]["val_loss_finite"] is False
    assert result["metrics"]["val_metrics"] == {"loss_epoch": None}


def test_require_finite_loss_refuses_when_no_loss_is_found(tmp_path, capsys):
    save = make_save(tmp_path, epochs=2, best=None)
    log = tmp_path / "train.log"
    log.write_text("INFO Training epoch 1/1 started\n")
    code, _, err = run_main(
        publish_argv(save, tmp_path / "d", "--log", str(log), "--require-finite-loss"),
        capsys,
    )
    assert code == 1
    assert "no validation loss found" in err
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize(
    ("out", "message"),
    [
        ("ckpt", "would replace the save directory"),
        (".", "would replace the save directory"),
        ("ckpt/1", "overlaps the checkpoint"),
        ("ckpt/1/draft", "overlaps the checkpoint"),
        ("a-file", "exists and is not a directory"),
    ],
)
def test_out_must_not_overlap_the_save_directory(tmp_path, capsys, out, message):
    save = make_save(tmp_path)
    (tmp_path / "a-file").write_text("x")
    code, _, err = run_main(
        ["publish", "--save-path", str(save), "--out", str(tmp_path / out)], capsys
    )
    assert code == 2
    assert message in err
    assert sorted(os.listdir(save / "1")) == sorted(
        ["config.json", "model.safetensors", *TRAINER_FILES]
    )


def test_missing_inputs_are_bad_input(tmp_path, capsys):
    code, _, err = run_main(
        ["publish", "--save-path", str(tmp_path / "nope"), "--out", str(tmp_path / "d")], capsys
    )
    assert (code, err) == (2, f"checkpoint: --save-path {tmp_path / 'nope'} is not a directory\n")
    save = make_save(tmp_path)
    code, _, err = run_main(
        publish_argv(save, tmp_path / "d", "--log", str(tmp_path / "missing.log")),
        capsys,
    )
    assert code == 2
    assert "cannot read --log" in err
    assert not (tmp_path / "d").exists()


def test_help_describes_both_commands(capsys):
    with pytest.raises(SystemExit) as exit_info:
        checkpoint.main(["publish", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for words in ("--save-path", "--out", "--log", "--require-finite-loss", "checkpoint_best"):
        assert words in text
    with pytest.raises(SystemExit):
        checkpoint.main(["--help"])
    assert "verify" in capsys.readouterr().out


# ----------------------------------------------------------------------------- log metrics

# Lines of a real `python -m specfleet_helpers.cpu.train_entry ...` log written with COLUMNS=200
# (speculators 0.9.0, rich logging): long records still wrap onto indented lines.
REAL_LOG = (
    "           INFO     No vocab mappings provided. Regenerating from token frequenc"
    "ies                                                                             "
    "                              cli.py:366\n"
    "2026-11-29 18:14:04.270 | INFO     | speculators.utils.loading:_resolve_file:163"
    " - Loading from local directory: fx/verifier\n"
    "           INFO     Training epoch 1/1 started                                  "
    "                                                                                "
    "                          trainer.py:737\n"
    "/venv/lib/python3.11/site-packages/speculators/train/trainer.py:539: UserWarning"
    ": In CPU autocast, but the target dtype is not supported. Disabling autocast.\n"
    "  with torch.autocast(\n"
    "[18:14:06] INFO     train/loss=2.865, train/full_acc=0.00e+00, train/position_1_"
    "acc=0.00e+00, train/position_2_acc=0.00e+00, train/position_3_acc=0.00e+00, trai"
    "n/eal=1.000,              trainer.py:587\n"
    "                    train/error_records=0.00e+00, profile/fetch_ms=108.079, prof"
    "ile/fwd_ms=395.894, profile/bwd_ms=734.858, profile/opt_ms=339.367, profile/step"
    "_ms=1.58e+03,                           \n"
    "                    profile/tokens_per_s=152.072, profile/fetch_frac=0.068, prof"
    "ile/queue_ms=107.345, profile/h2d_ms=0.650, profile/clip_ms=23.497, epoch=0, lr/"
    "Muon=3.00e-04,                          \n"
    "                    lr/AdamW=3.00e-04, global_step=0                            "
    "                                                                                "
    "                                        \n"
    "[18:14:07] INFO     train/loss=2.892, train/full_acc=0.00e+00, train/position_1_"
    "acc=0.00e+00, train/position_2_acc=0.00e+00, train/position_3_acc=0.00e+00, trai"
    "n/eal=1.000,              trainer.py:587\n"
    "                    train/error_records=0.00e+00, profile/fetch_ms=49.326, profi"
    "le/fwd_ms=322.453, profile/bwd_ms=193.259, profile/opt_ms=444.164, profile/step_"
    "ms=1.01e+03,                            \n"
    "                    profile/tokens_per_s=39.635, profile/fetch_frac=0.049, profi"
    "le/queue_ms=49.092, profile/h2d_ms=0.175, profile/clip_ms=5.514, epoch=0, lr/Muo"
    "n=1.50e-04,                             \n"
    "                    lr/AdamW=1.50e-04, global_step=1                            "
    "                                                                                "
    "                                        \n"
    "Epoch 0 100% ━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━"
    "━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━"
    "━━━━ 2/2  [ 0:00:02 < 0:00:00 , 1 it/s ]\n"
    "           INFO     Saving checkpoint to fx/ckpt/0                              "
    "                                                                                "
    "                          trainer.py:689\n"
    "           INFO     val/loss_epoch=2.904, val/full_acc_epoch=0.00e+00, val/posit"
    "ion_1_acc_epoch=0.00e+00, val/position_2_acc_epoch=0.00e+00, val/position_3_acc_"
    "epoch=0.00e+00,           trainer.py:671\n"
    "                    val/eal_epoch=1.000, epoch=0                                "
    "                                                                                "
    "                                        \n"
    "           INFO     Validation epoch 1/1 completed                              "
    "                                                                                "
    "                          trainer.py:756\n"
    "           INFO     Updated checkpoint_best -> 0 (loss_epoch=2.903736)          "
    "                                                                                "
    "                          trainer.py:727\n"
)

# rich with a terminal (FORCE_COLOR=1) at COLUMNS=100: colours, OSC 8 hyperlinks on the
# path column, and a record wrapped after ", ".
COLOR_LOG = (
    "\x1b[2;36m[11/29/26 18:16:20]\x1b[0m\x1b[2;36m \x1b[0m\x1b[34mINFO    \x1b[0m val/\x1b[3"
    "3mloss_epoch\x1b[0m=\x1b[1;36m3\x1b[0m\x1b[1;36m.180\x1b[0m, val/\x1b[33mfull_acc_epoch"
    "\x1b[0m=\x1b[1;36m0\x1b[0m\x1b[1;36m.00e+00\x1b[0m,            \x1b]8;id=7360265;file://"
    "<stdin>\x1b\\\x1b[2m<stdin>\x1b[0m\x1b]8;;\x1b\\\x1b[2m:\x1b[0m\x1b]8;id=7360266;file://"
    "<stdin>#6\x1b\\\x1b[2m6\x1b[0m\x1b]8;;\x1b\\\n"
    "\x1b[2;36m                    \x1b[0m         val/\x1b[33mposition_1_acc_epoch\x1b[0m="
    "\x1b[1;36m0\x1b[0m\x1b[1;36m.012\x1b[0m, val/\x1b[33meal_epoch\x1b[0m=\x1b[1;36m1\x1b[0m"
    "\x1b[1;36m.000\x1b[0m, \x1b[33mepoch\x1b[0m=\x1b[1;36m0\x1b[0m  \x1b[2m         \x1b[0m"
    "\n"
)

# rich at COLUMNS=80 breaks inside long keys too (after "_", or anywhere in one long word).
NARROW_LOG = (
    "[11/29/26 18:18:14] INFO     val/loss_epoch=3.180,                     <stdin>:5"
    "\n"
    "                             val/full_acc_epoch=0.012,                          "
    "\n"
    "                             val/a_very_long_metric_name_that_is_long_          "
    "\n"
    "                             epoch=1.23e-04, epoch=1                            "
    "\n"
    "                    INFO     train/loss=nan,                           <stdin>:6"
    "\n"
    "                             train/verylongmetricnamewithoutanybreakop          "
    "\n"
    "                             portunitywhatsoeverxxxxxxxxxxxxxxxxxxxxxx          "
    "\n"
    "                             xxx=1.5, epoch=1                                   "
    "\n"
)


def test_log_records_join_rich_wrapped_lines():
    records = log_records(REAL_LOG)
    val = [r for r in records if r.startswith("val/")]
    assert val == [
        "val/loss_epoch=2.904, val/full_acc_epoch=0.00e+00, val/position_1_acc_epoch=0.00e+00, "
        "val/position_2_acc_epoch=0.00e+00, val/position_3_acc_epoch=0.00e+00, "
        "val/eal_epoch=1.000, epoch=0"
    ]
    train = [r for r in records if r.startswith("train/")]
    assert len(train) == 2
    assert train[0].endswith("lr/Muon=3.00e-04, lr/AdamW=3.00e-04, global_step=0")
    assert "trainer.py" not in " ".join(train + val)
    assert any(r.startswith("2026-11-29 18:14:04.270 | INFO") for r in records)


def test_parse_metrics_from_a_real_wrapped_log():
    parsed = parse_log_metrics(REAL_LOG)
    assert parsed["metrics"] == {
        "train/loss": 2.892,  # the last of the two steps
        "train/full_acc": 0.0,
        "train/position_1_acc": 0.0,
        "train/position_2_acc": 0.0,
        "train/position_3_acc": 0.0,
        "train/eal": 1.0,
        "train/error_records": 0.0,  # on a continuation line
        "val/loss_epoch": 2.904,
        "val/full_acc_epoch": 0.0,
        "val/position_1_acc_epoch": 0.0,
        "val/position_2_acc_epoch": 0.0,
        "val/position_3_acc_epoch": 0.0,
        "val/eal_epoch": 1.0,
    }
    assert parsed["val_loss_by_epoch"] == {0: 2.904}  # epoch=0 is on the wrapped line


def test_parse_metrics_through_ansi_colour_codes_and_hyperlinks():
    parsed = parse_log_metrics(COLOR_LOG)
    assert parsed["metrics"] == {
        "val/loss_epoch": 3.18,
        "val/full_acc_epoch": 0.0,
        "val/position_1_acc_epoch": 0.012,
        "val/eal_epoch": 1.0,
    }
    assert parsed["val_loss_by_epoch"] == {0: 3.18}


def test_parse_metrics_when_a_key_is_broken_across_lines():
    parsed = parse_log_metrics(NARROW_LOG)
    metrics = parsed["metrics"]
    assert metrics["val/a_very_long_metric_name_that_is_long_epoch"] == pytest.approx(1.23e-4)
    assert metrics[
        "train/verylongmetricnamewithoutanybreakopportunitywhatsoeverxxxxxxxxxxxxxxxxxxxxxxxxx"
    ] == pytest.approx(1.5)
    assert math.isnan(metrics["train/loss"])
    assert parsed["val_loss_by_epoch"] == {1: 3.18}


def test_parse_metrics_from_plain_lines_and_carriage_returns():
    text = (
        "epoch 0 10%\repoch 0 100%\n"
        "INFO:speculators.metrics:val/loss_epoch=inf, val/x=-2.5e+03, epoch=3\r\n"
        "val/loss_epoch=1.25, epoch=4\n"
        "not a metric: myval/loss_epoch=9, val/loss_epoch=abc, train/ratio=1.5x\n"
    )
    parsed = parse_log_metrics(text)
    assert parsed["metrics"] == {"val/loss_epoch": 1.25, "val/x": -2500.0}
    assert parsed["val_loss_by_epoch"] == {3: math.inf, 4: 1.25}


def test_val_loss_prefers_the_checkpoint_then_its_epoch_in_the_log(tmp_path):
    save = tmp_path / "ckpt"
    save.mkdir()
    directory = make_epoch(save, 1, loss=2.5)
    log = "val/loss_epoch=2.6, epoch=1\nval/loss_epoch=2.7, epoch=2\n"
    metrics = collect_metrics(directory, 1, log)
    assert (metrics["val_loss"], metrics["val_loss_source"]) == (2.5, "val_metrics.json")
    (directory / "val_metrics.json").unlink()
    metrics = collect_metrics(directory, 1, log)
    assert (metrics["val_loss"], metrics["val_loss_source"]) == (2.6, "log (epoch 1)")
    metrics = collect_metrics(directory, 5, log)
    assert (metrics["val_loss"], metrics["val_loss_source"]) == (2.7, "log (last value)")
    metrics = collect_metrics(directory, 1, None)
    assert metrics["val_loss"] is None
    assert metrics["val_loss_source"] is None
    assert metrics["val_loss_finite"] is False
    assert metrics["training_state"]["epoch"] == 1


def test_publish_reads_metrics_from_the_log(tmp_path, capsys):
    save = make_save(tmp_path, epochs=1, best=None)
    log = tmp_path / "train.log"
    log.write_text(REAL_LOG)
    code, result, _ = run_main(
        publish_argv(save, tmp_path / "d", "--log", str(log), "--require-finite-loss"),
        capsys,
    )
    assert code == 0
    assert result["metrics"]["val_loss"] == 2.904
    assert result["metrics"]["val_loss_source"] == "log (epoch 0)"
    assert result["metrics"]["log"]["train/loss"] == 2.892


# ----------------------------------------------------------------------------- verify


def published(tmp_path: Path) -> Path:
    out = tmp_path / "draft"
    out.mkdir()
    (out / "config.json").write_text('{"speculators_model_type": "dflash"}')
    (out / "model.safetensors").write_bytes(safetensors_bytes())
    return out


def test_verify_accepts_exactly_the_two_files(tmp_path, capsys):
    out = published(tmp_path)
    code, result, err = run_main(["verify", "--out", str(out)], capsys)
    assert (code, err) == (0, "")
    assert result == {
        "path": str(out),
        "ok": True,
        "problems": [],
        "files": [
            {"name": "config.json", "size": (out / "config.json").stat().st_size},
            {"name": "model.safetensors", "size": (out / "model.safetensors").stat().st_size},
        ],
        "tensors": 1,
    }


def test_verify_published_prints_the_record_of_a_finite_loss_and_refuses_another(tmp_path, capsys):
    """The train stage's verifier: the draft, then publish's record (the stamp's metrics),
    which must hold a finite validation loss."""
    out = published(tmp_path)
    record = tmp_path / "train.publish.json"
    good = {"path": str(out), "metrics": {"val_loss": 2.5, "val_loss_finite": True}}
    record.write_text("earlier output\n" + json.dumps(good) + "\n")
    argv = ["verify", "--out", str(out), "--published", str(record)]
    code, result, err = run_main(argv, capsys)
    assert (code, err, result) == (0, "", good)
    bad = {"metrics": {"val_loss": "nan", "val_loss_finite": False, "log": "/w/logs/train.log"}}
    record.write_text(json.dumps(bad) + "\n")
    code, result, err = run_main(argv, capsys)
    assert code == 1 and result is None
    assert err == (
        "checkpoint: train: the validation loss is nan, expected a finite number "
        "(see /w/logs/train.log)\n"
    )
    record.write_text("")
    code, _, err = run_main(argv, capsys)
    assert code == 1 and "holds no publish record" in err


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda d: (d / "run.yaml").write_text("x"), "unexpected entries: run.yaml"),
        (lambda d: (d / "0").mkdir(), "unexpected entries: 0"),
        (lambda d: (d / "model.safetensors").unlink(), "model.safetensors is missing"),
        (lambda d: (d / "model.safetensors").write_bytes(b""), "model.safetensors is empty"),
        (
            lambda d: (d / "model.safetensors").write_bytes(b"\x10" + b"\0" * 7 + b"{not json"),
            "model.safetensors has a bad safetensors header length",
        ),
        (lambda d: (d / "config.json").write_text("{"), "config.json does not parse as JSON"),
        (lambda d: (d / "config.json").write_text("[]"), "config.json is not a JSON object"),
        (lambda d: (d / "config.json").unlink(), "config.json is missing"),
    ],
)
def test_verify_rejects(tmp_path, capsys, damage, problem):
    out = published(tmp_path)
    damage(out)
    code, result, err = run_main(["verify", "--out", str(out)], capsys)
    assert code == 1
    assert result["ok"] is False
    assert any(p.startswith(problem) for p in result["problems"]), result["problems"]
    assert err.startswith(f"checkpoint: {out} is not a published draft: ")
    assert err.count("\n") == 1


def test_verify_rejects_symlinks_and_missing_directories(tmp_path):
    out = published(tmp_path)
    real = tmp_path / "real.json"
    real.write_text("{}")
    (out / "config.json").unlink()
    (out / "config.json").symlink_to(real)
    assert draft_dir_problems(out) == ["config.json is a symlink, expected a regular file"]
    assert verify(tmp_path / "absent")["problems"] == [f"{tmp_path / 'absent'} does not exist"]
    assert draft_dir_problems(real) == [f"{real} is not a directory"]


def test_safetensors_header_checks(tmp_path):
    path = tmp_path / "w.safetensors"
    path.write_bytes(safetensors_bytes((1.0, 2.0, 3.0)))
    assert safetensors_tensor_count(path) == 1
    header = json.dumps({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)  # data cut short
    with pytest.raises(ValueError, match="bad safetensors entry for tensor 'a'"):
        safetensors_tensor_count(path)
    header = json.dumps({"__metadata__": {}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header)
    with pytest.raises(ValueError, match="holds no tensors"):
        safetensors_tensor_count(path)
    path.write_bytes(b"abc")
    with pytest.raises(ValueError, match="too short"):
        safetensors_tensor_count(path)


def test_bad_input_and_checkpoint_errors_are_distinct():
    assert not issubclass(BadInput, CheckpointError)
    assert not issubclass(CheckpointError, BadInput)


def interrupted_at(save: Path) -> Path:
    """speculators' checkpoint of a stopped run: weights, optimizer, scheduler, no state."""
    directory = save / "interrupted"
    directory.mkdir()
    (directory / "model.safetensors").write_bytes(safetensors_bytes((9.0, 9.0)))
    (directory / "optimizer_state_dict.pt").write_bytes(b"optimizer")
    return directory


def test_resume_turns_the_interrupted_checkpoint_into_a_mid_epoch_resume(tmp_path):
    save = make_save(tmp_path, epochs=2, best=None)
    interrupted_at(save)
    assert checkpoint.resume(save) == {
        "resumed_from": "the interrupted checkpoint, in epoch 2",
        "epochs_done": [0, 1],
    }
    assert not (save / "interrupted").exists()
    assert (save / "2" / "model.safetensors").read_bytes() == safetensors_bytes((9.0, 9.0))
    state = json.loads((save / "2" / "training_state.json").read_text())
    # speculators resumes within epoch 2 (local_step > 0) from the interrupted weights
    assert state == {"epoch": 2, "local_step": 1, "global_step": 6}


def test_resume_in_the_first_epoch_and_without_an_interrupted_checkpoint(tmp_path):
    save = tmp_path / "ckpt"
    save.mkdir()
    assert checkpoint.resume(save) == {"resumed_from": None, "epochs_done": []}
    interrupted_at(save)
    assert checkpoint.resume(save)["resumed_from"] == "the interrupted checkpoint, in epoch 0"
    assert json.loads((save / "0" / "training_state.json").read_text())["epoch"] == 0
    assert checkpoint.resume(save) == {"resumed_from": "epoch 0", "epochs_done": [0]}


def test_resume_drops_an_interrupted_checkpoint_whose_save_was_cut_short(tmp_path):
    save = make_save(tmp_path, epochs=1, best=None)
    (save / "interrupted").mkdir()
    assert checkpoint.resume(save) == {"resumed_from": "epoch 0", "epochs_done": [0]}
    assert not (save / "interrupted").exists()
