"""Tests for specfleet_helpers.cpu.train_entry (speculators.train as torchrun ranks over gloo on
a CPU-only host).

The checks and the patching run in-process against stand-in torch/speculators modules (the
controller venv has no torch). Tests that need the real stack run with the CPU venv's Python,
SPECFLEET_TEST_VENV_PYTHON (default <repo>/.work/local/venv/bin/python), and are skipped when it
is missing. The real training run, two gloo ranks under torchrun followed by `checkpoint
publish` and `checkpoint verify`, is slow: it runs with SPECFLEET_SLOW_TESTS=1 (the train stage
of every `make run` runs the same command line).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest
from specfleet_helpers.cpu import train_entry
from specfleet_helpers.cpu.train_entry import (
    BadInput,
    apply_cpu_patches,
    check_no_accelerator,
    cpu_config_problems,
    wants_help,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
HELPERS = REPO_ROOT / "python_helpers"
CPU_PYTHON = Path(
    os.environ.get("SPECFLEET_TEST_VENV_PYTHON", str(REPO_ROOT / ".work/local/venv/bin/python"))
)
needs_cpu_venv = pytest.mark.skipif(
    not CPU_PYTHON.exists(),
    reason=f"no CPU venv python at {CPU_PYTHON} (set SPECFLEET_TEST_VENV_PYTHON)",
)

CPU_OK = {
    "speculator_type": "dflash",
    "draft_attn_impl": "sdpa",
    "loss_implementation": "eager",
    "fsdp_shard": False,
    "save_path": "ckpt",
}


# ----------------------------------------------------------------------------- pure checks


def test_a_cpu_ready_config_has_no_problems():
    assert cpu_config_problems(CPU_OK) == []
    assert cpu_config_problems({**CPU_OK, "draft_attn_impl": "eager"}) == []


def test_speculators_defaults_are_refused_with_the_flag_to_pass():
    problems = cpu_config_problems(
        {**CPU_OK, "draft_attn_impl": "simple_flex_attention", "loss_implementation": "fused"}
    )
    assert len(problems) == 2
    assert "pass --draft-attn-impl sdpa" in problems[0]
    assert "no backward on CPU" in problems[0]
    assert "pass --loss-implementation eager" in problems[1]
    assert "Triton" in problems[1]


def test_mtp_and_fsdp_are_refused():
    (mtp,) = cpu_config_problems(
        {**CPU_OK, "speculator_type": "mtp", "draft_attn_impl": "simple_flex_attention"}
    )
    assert mtp.startswith("speculator type mtp cannot train on CPU")
    (fsdp,) = cpu_config_problems({**CPU_OK, "fsdp_shard": True})
    assert "--fsdp-shard" in fsdp


def test_wants_help_stops_at_the_separator():
    assert wants_help(["--epochs", "1", "-h"])
    assert wants_help(["--help"])
    assert not wants_help(["--epochs", "1"])
    assert not wants_help(["--", "--help"])


def test_importing_the_module_needs_no_torch():
    code = "import sys, specfleet_helpers.cpu.train_entry; print('torch' in sys.modules)"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(HELPERS)},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


# ----------------------------------------------------------------------------- stand-ins


class FakeStack:
    """torch + speculators.train modules shaped like the names train_entry touches."""

    def __init__(self, accelerator: str | None = None, config: dict[str, Any] | None = None):
        self.calls: list[dict[str, Any]] = []
        self.config = {**CPU_OK, **(config or {})}
        stack = self

        def synchronize(device: Any = None) -> None:
            raise RuntimeError("Cannot access accelerator device when none is available.")

        def current_accelerator(check_available: bool = False) -> Any:
            return types.SimpleNamespace(type=accelerator) if accelerator else None

        self.accelerator = types.ModuleType("torch.accelerator")
        self.accelerator.synchronize = synchronize
        self.accelerator.current_accelerator = current_accelerator
        self.torch = types.ModuleType("torch")
        self.torch.accelerator = self.accelerator
        self.torch.__version__ = "2.13.0+cpu"

        class Trainer:
            def __init__(self) -> None:
                self.local_rank = trainer.get_local_rank()
                self.device_type = "cuda"  # speculators' fallback without an accelerator

        self.trainer = trainer = types.ModuleType("speculators.train.trainer")
        trainer.get_local_rank = lambda: 0
        trainer.Trainer = Trainer
        self.checkpointer = types.ModuleType("speculators.train.checkpointer")
        self.checkpointer.get_current_device = lambda: "cuda:0"

        class TrainConfig:
            def __init__(self, argv: list[str]) -> None:
                self.argv = argv

            @classmethod
            def resolve(cls, argv: list[str]) -> TrainConfig:
                return cls(argv)

            def flatten(self) -> dict[str, Any]:
                return dict(stack.config)

        def train_main(config: TrainConfig) -> None:
            made = Trainer()
            stack.calls.append(
                {
                    "argv": config.argv,
                    "local_rank": made.local_rank,
                    "device_type": made.device_type,
                    "synchronize": stack.accelerator.synchronize(),
                    "resume_device": stack.checkpointer.get_current_device(),
                }
            )
            if stack.config.get("fail"):
                raise RuntimeError("loss exploded")

        # speculators.train.distributed: upstream's setup asks torch.accelerator for a device.
        self.distributed = distributed = types.ModuleType("speculators.train.distributed")
        distributed._local_rank, distributed._rank, distributed._world_size = 0, 0, 1
        distributed._is_distributed = False
        distributed._sp_size, distributed._dp_size = 1, 1
        distributed.logger = types.SimpleNamespace(info=lambda *a, **k: stack.logged.append(a[0]))
        distributed.get_rank = lambda: distributed._rank

        def upstream_setup(sp_size: int = 1) -> None:
            raise ValueError("No accelerator found")

        def init_sp_groups(rank: int, world_size: int, sp_size: int) -> None:
            distributed._sp_size, distributed._dp_size = sp_size, world_size // sp_size

        distributed.maybe_setup_distributed = upstream_setup
        distributed._init_sp_process_groups = init_sp_groups
        self.logged: list[str] = []
        self.process_groups: list[str] = []
        self.torch_distributed = types.ModuleType("torch.distributed")
        self.torch_distributed.init_process_group = lambda backend, timeout: (
            stack.process_groups.append((backend, timeout.total_seconds()))
        )
        self.torch_distributed.get_rank = lambda: int(os.environ.get("RANK", "0"))
        self.torch_distributed.get_world_size = lambda: int(os.environ.get("WORLD_SIZE", "1"))
        self.torch.distributed = self.torch_distributed

        self.cli = types.ModuleType("speculators.train.cli")
        self.cli.maybe_setup_distributed = upstream_setup

        def cli_main(config: TrainConfig) -> None:
            stack.cli.maybe_setup_distributed()  # what speculators' main does first
            train_main(config)

        self.cli.main = cli_main
        self.config_module = types.ModuleType("speculators.train.config")
        self.config_module.TrainConfig = TrainConfig
        self.speculators = types.ModuleType("speculators")
        self.speculators_train = types.ModuleType("speculators.train")

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for name, module in {
            "torch": self.torch,
            "torch.accelerator": self.accelerator,
            "torch.distributed": self.torch_distributed,
            "speculators.train.distributed": self.distributed,
            "speculators": self.speculators,
            "speculators.train": self.speculators_train,
            "speculators.train.trainer": self.trainer,
            "speculators.train.checkpointer": self.checkpointer,
            "speculators.train.cli": self.cli,
            "speculators.train.config": self.config_module,
        }.items():
            monkeypatch.setitem(sys.modules, name, module)
        for name in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "SPECFLEET_GLOO_TIMEOUT_S"):
            monkeypatch.delenv(name, raising=False)


def test_patches_redirect_every_accelerator_choice_to_cpu(monkeypatch):
    stack = FakeStack()
    stack.install(monkeypatch)
    patched = apply_cpu_patches(stack.torch)
    assert len(patched) == 5
    assert stack.cli.maybe_setup_distributed is stack.distributed.maybe_setup_distributed
    made = stack.trainer.Trainer()
    assert made.local_rank == "cpu"
    assert made.device_type == "cpu"
    assert stack.torch.accelerator.synchronize() is None
    assert stack.checkpointer.get_current_device() == "cpu"
    assert apply_cpu_patches(stack.torch) == patched  # idempotent


def test_a_missing_patch_target_is_a_clear_error(monkeypatch):
    stack = FakeStack()
    del stack.checkpointer.get_current_device
    stack.install(monkeypatch)
    with pytest.raises(RuntimeError, match=r"checkpointer\.get_current_device not found"):
        apply_cpu_patches(stack.torch)


def test_main_patches_then_trains_and_prints_json(monkeypatch, capsys):
    stack = FakeStack()
    stack.install(monkeypatch)
    assert train_entry.main(["--speculator-type", "dflash", "--epochs", "1"]) == 0
    assert stack.calls == [
        {
            "argv": ["--speculator-type", "dflash", "--epochs", "1"],
            "local_rank": "cpu",
            "device_type": "cpu",
            "synchronize": None,
            "resume_device": "cpu",
        }
    ]
    captured = capsys.readouterr()
    result = json.loads(captured.out.strip().splitlines()[-1])
    assert result["save_path"] == "ckpt"
    assert result["device"] == "cpu"
    assert result["torch_version"] == "2.13.0+cpu"
    assert len(result["patches"]) == 5
    assert result["elapsed_s"] >= 0
    # Without torchrun: speculators' one-process path, no process group.
    assert (result["backend"], result["rank"], result["world_size"]) == (None, 0, 1)
    assert stack.process_groups == []
    assert stack.distributed._is_distributed is False
    assert captured.err == ""


def test_a_torchrun_rank_joins_a_gloo_process_group(monkeypatch, capsys):
    stack = FakeStack()
    stack.install(monkeypatch)
    for name, value in {"LOCAL_RANK": "1", "RANK": "3", "WORLD_SIZE": "4"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SPECFLEET_GLOO_TIMEOUT_S", "45")
    assert train_entry.main(["--epochs", "1"]) == 0
    # Upstream's setup (which raises "No accelerator found" here) was replaced, in both places;
    # a lost peer fails a collective after the job's timeout, not torch's 30 minutes.
    assert stack.process_groups == [("gloo", 45.0)]
    d = stack.distributed
    assert (d._local_rank, d._rank, d._world_size, d._is_distributed) == (1, 3, 4, True)
    assert (d._sp_size, d._dp_size) == (1, 4)
    assert stack.logged == [
        "Started distributed with local_rank=1, dp_size=4, sp_size=1 (backend gloo, rank 3 of 4)"
    ]
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (result["backend"], result["rank"], result["local_rank"], result["world_size"]) == (
        "gloo",
        3,
        1,
        4,
    )


def test_an_interrupted_run_is_not_reported_as_trained(monkeypatch, capsys, tmp_path):
    # speculators catches SIGTERM, saves <save>/interrupted and returns as if it were done.
    stack = FakeStack(config={"save_path": str(tmp_path)})
    stack.install(monkeypatch)
    stack.cli.main = lambda config: (tmp_path / "interrupted").mkdir()
    monkeypatch.setenv("RANK", "0")
    assert train_entry.main([]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("train_entry (rank 0): training was interrupted;")
    assert str(tmp_path / "interrupted") in captured.err


def test_an_accelerator_host_is_refused(monkeypatch, capsys):
    stack = FakeStack(accelerator="npu")
    stack.install(monkeypatch)
    assert train_entry.main(["--speculator-type", "dflash"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("train_entry: an accelerator is present (npu)")
    assert "torchrun" in err
    assert stack.calls == []
    assert stack.trainer.Trainer().device_type == "cuda"  # nothing was patched
    with pytest.raises(BadInput):
        check_no_accelerator(stack.torch)


def test_cpu_incompatible_arguments_are_refused_before_training(monkeypatch, capsys):
    stack = FakeStack(config={"loss_implementation": "fused"})
    stack.install(monkeypatch)
    assert train_entry.main([]) == 2
    err = capsys.readouterr().err
    assert err == (
        "train_entry: --loss-implementation is fused (speculators' default), a Triton kernel "
        "with no CPU driver: pass --loss-implementation eager\n"
    )
    assert stack.calls == []


def test_a_training_failure_exits_1_with_a_summary_line(monkeypatch, capsys):
    stack = FakeStack(config={"fail": True})
    stack.install(monkeypatch)
    assert train_entry.main([]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "Traceback" in captured.err
    assert captured.err.splitlines()[-1] == (
        "train_entry: training failed: RuntimeError: loss exploded"
    )


def test_missing_torch_is_bad_input(monkeypatch, capsys):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setitem(sys.modules, "torch", None)
    assert train_entry.main(["--epochs", "1"]) == 2
    assert "expected torch and speculators (0.9.0) in this Python" in capsys.readouterr().err


def test_help_explains_the_cpu_requirements(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)  # speculators' own help is then skipped
    assert train_entry.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m torch.distributed.run")
    for words in ("--draft-attn-impl sdpa", "--loss-implementation eager", "torchrun", "JSON"):
        assert words in out


# ----------------------------------------------------------------------------- real stack


def run_module(module: str, args: list[str], timeout: float, **kwargs: Any):
    env = {**os.environ, "PYTHONPATH": str(HELPERS), **kwargs.pop("env", {})}
    env.pop("LOCAL_RANK", None)
    return subprocess.run(
        [str(kwargs.pop("python", CPU_PYTHON)), "-m", module, *args],
        text=True,
        timeout=timeout,
        env=env,
        **kwargs,
    )


@needs_cpu_venv
def test_real_speculators_defaults_are_refused_before_loading_anything(tmp_path):
    save = tmp_path / "ckpt"
    argv = [
        "--speculator-type", "dflash",
        "--verifier-name-or-path", str(tmp_path / "none"),
        "--data-path", str(tmp_path / "none"),
        "--save-path", str(save),
        "--epochs", "1",
    ]  # fmt: skip
    proc = run_module(
        "specfleet_helpers.cpu.train_entry",
        argv,
        timeout=300,
        capture_output=True,
    )
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "pass --draft-attn-impl sdpa" in last
    assert "pass --loss-implementation eager" in last
    assert not save.exists()


# Dataset and hidden states as `speculators prepare-data` and `generate-offline-data`
# (speculators 0.9.0) write them, built directly from the tiny verifier:
#  - a datasets.Dataset saved with save_to_disk, torch format, columns input_ids (int64),
#    loss_mask (int64), seq_len (int); plus token_freq.pt ({token id: count} over the
#    loss-masked tokens, what --no-skip-token-freq writes) for --draft-vocab-size;
#  - hs_<i>.safetensors: token_ids [T] int64 and hidden_states [T, 4, hidden] bf16 = the
#    outputs of decoder layers 1, 2, 3 (--target-layer-ids) and of the last layer, which
#    is what vLLM's extract_hidden_states appends.
BUILD_DATA = r"""
import json, sys
from pathlib import Path
import torch
from datasets import Dataset
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

verifier, root = Path(sys.argv[1]), Path(sys.argv[2])
# 20 rows: 18 train and 2 validate, a row for each of the two ranks in both splits.
layers_wanted, rows_wanted = (1, 2, 3), 20
tokenizer = AutoTokenizer.from_pretrained(verifier)
model = AutoModelForCausalLM.from_pretrained(verifier, dtype=torch.bfloat16).eval()
decoder = model.model.layers
outputs = {}
def keep(index):
    def hook(module, args, output):
        outputs[index] = output[0] if isinstance(output, tuple) else output
    return hook
for index in (*layers_wanted, len(decoder)):
    decoder[index - 1].register_forward_hook(keep(index))

words = ("draft verifier token block anchor speculative decoding ascend fleet layer "
         "hidden state train epoch loss return value").split()
rows = {"input_ids": [], "loss_mask": [], "seq_len": []}
freq = {}
(root / "hidden_states").mkdir(parents=True)
for i in range(rows_wanted):
    text = " ".join(words[(i * 5 + 3 * j) % len(words)] for j in range(120))
    ids = tokenizer(text)["input_ids"][: 40 + 8 * i]
    mask = [0] * (len(ids) // 3) + [1] * (len(ids) - len(ids) // 3)
    with torch.no_grad():
        model(torch.tensor([ids]))
    hidden = torch.stack([outputs[k][0] for k in (*layers_wanted, len(decoder))], dim=1)
    save_file(
        {"token_ids": torch.tensor(ids, dtype=torch.long),
         "hidden_states": hidden.to(torch.bfloat16).contiguous()},
        str(root / "hidden_states" / f"hs_{i}.safetensors"),
    )
    rows["input_ids"].append(ids)
    rows["loss_mask"].append(mask)
    rows["seq_len"].append(len(ids))
    for token, m in zip(ids, mask):
        if m:
            freq[token] = freq.get(token, 0) + 1
dataset = Dataset.from_dict(rows)
dataset.set_format(type="torch")
dataset.save_to_disk(str(root / "data"))
torch.save(freq, root / "data" / "token_freq.pt")
print(json.dumps({"rows": rows_wanted, "seq_len": rows["seq_len"],
                  "hidden_states": list(hidden.shape[1:])}))
"""

# Used only when specfleet_helpers.cpu.tiny_models is missing or fails: the same Qwen3 shape
# (hidden 128, intermediate 256, 6 layers, 4 heads / 2 kv, head_dim 32, vocab 1024) with a
# small byte-level BPE, leaving vocabulary slots free for speculators' <|MASK|> token.
BUILD_VERIFIER = r"""
import sys
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

out = sys.argv[1]
words = "draft verifier token block anchor speculative decoding ascend fleet layer".split()
corpus = [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(12)) for i in range(200)]
tok = Tokenizer(models.BPE(unk_token=None))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator(corpus, trainers.BpeTrainer(
    vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
tokenizer = PreTrainedTokenizerFast(
    tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
torch.manual_seed(0)
config = Qwen3Config(
    vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=6,
    num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=2048,
    tie_word_embeddings=False, eos_token_id=tokenizer.eos_token_id,
    pad_token_id=tokenizer.pad_token_id)
config.architectures = ["Qwen3ForCausalLM"]
Qwen3ForCausalLM(config).to(torch.bfloat16).save_pretrained(out)
tokenizer.save_pretrained(out)
"""

# The runbook's NPU flags, changed for the tiny model (each checked on this model):
#   --target-layer-ids 2 18 34 -> 1 2 3   speculators refuses ids beyond the verifier's 6
#                                         layers ("must be distinct and within [0, 6]")
#   --draft-vocab-size 32000 -> 512       must not exceed the verifier's vocab (1024): with a
#                                         token_freq.pt, 32000 fails with an IndexError
#   --num-layers 5 -> 1, --block-size 8 -> 4   the tiny pipeline's draft shape; 5 and 8
#                                         also train, only slower
# and added for CPU: --loss-implementation eager (no Triton), --num-workers 0 (speculators
# starts 12 dataloader processes by default), --total-seq-len 256 (a few rows per step
# instead of all of them in one 8192-token batch). --draft-attn-impl sdpa,
# --hidden-states-dtype float32 (CPU autocast then turns itself off, with a warning),
# --max-anchors 32, --epochs 1, --lr 3e-4 and --on-missing raise are the runbook's.
TRAIN_ARGS = [
    "--speculator-type", "dflash",
    "--draft-vocab-size", "512",
    "--epochs", "1",
    "--lr", "3e-4",
    "--block-size", "4",
    "--max-anchors", "32",
    "--draft-attn-impl", "sdpa",
    "--loss-implementation", "eager",
    "--num-layers", "1",
    "--target-layer-ids", "1", "2", "3",
    "--hidden-states-dtype", "float32",
    "--on-missing", "raise",
    "--num-workers", "0",
    "--total-seq-len", "256",
]  # fmt: skip


def build_verifier(out: Path, timings: dict[str, float]) -> str:
    started = time.monotonic()
    if (HELPERS / "specfleet_helpers" / "cpu" / "tiny_models.py").is_file():
        proc = run_module(
            "specfleet_helpers.cpu.tiny_models",
            ["verifier", "--out", str(out)],
            timeout=600,
            capture_output=True,
        )
        if proc.returncode == 0 and (out / "config.json").is_file():
            timings["build_verifier_s"] = round(time.monotonic() - started, 1)
            return "specfleet_helpers.cpu.tiny_models"
    script = out.parent / "build_verifier.py"
    script.write_text(BUILD_VERIFIER)
    subprocess.run([str(CPU_PYTHON), str(script), str(out)], check=True, timeout=600)
    timings["build_verifier_s"] = round(time.monotonic() - started, 1)
    return "fallback recipe"


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("SPECFLEET_SLOW_TESTS") != "1",
    reason="real CPU training (~2-3 min on 2 cores): set SPECFLEET_SLOW_TESTS=1",
)
@needs_cpu_venv
def test_real_training_on_cpu_then_publish_and_verify(tmp_path):
    timings: dict[str, float] = {}
    verifier = tmp_path / "verifier"
    built_by = build_verifier(verifier, timings)

    started = time.monotonic()
    script = tmp_path / "build_data.py"
    script.write_text(BUILD_DATA)
    data = subprocess.run(
        [str(CPU_PYTHON), str(script), str(verifier), str(tmp_path)],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    timings["build_data_s"] = round(time.monotonic() - started, 1)
    assert json.loads(data.stdout.strip().splitlines()[-1])["hidden_states"] == [4, 128]

    save = tmp_path / "ckpt"
    log = tmp_path / "train.log"
    argv = [
        *TRAIN_ARGS,
        "--verifier-name-or-path", str(verifier),
        "--data-path", str(tmp_path / "data"),
        "--hidden-states-path", str(tmp_path / "hidden_states"),
        "--save-path", str(save),
    ]  # fmt: skip
    started = time.monotonic()
    # The train stage's command line: torchrun, two ranks, this module for speculators.train.
    torchrun = ["--standalone", "--nproc_per_node=2", "-m", "specfleet_helpers.cpu.train_entry"]
    with open(log, "w") as handle:
        proc = run_module(
            "torch.distributed.run",
            [*torchrun, *argv],
            timeout=1200,
            stdout=handle,
            stderr=subprocess.STDOUT,
            env={"COLUMNS": "200"},
        )
    timings["train_s"] = round(time.monotonic() - started, 1)
    text = log.read_text()
    assert proc.returncode == 0, text[-4000:]
    lines = [line for line in text.splitlines() if line.startswith("{") and '"device"' in line]
    results = sorted((json.loads(line) for line in lines), key=lambda r: r["rank"])
    assert [(r["rank"], r["world_size"], r["backend"]) for r in results] == [
        (0, 2, "gloo"),
        (1, 2, "gloo"),
    ]
    assert "Started distributed with local_rank=1, dp_size=2" in text
    result = results[0]
    assert result["device"] == "cpu"
    assert result["speculators_version"] == "0.9.0"
    timings["train_loop_s"] = result["elapsed_s"]

    # speculators' own layout: epoch 0 with trainer state, the best and epoch links.
    assert (save / "checkpoint_best").resolve() == (save / "0").resolve()
    assert (save / "epoch0_end").is_symlink()
    assert {"optimizer_state_dict.pt", "training_state.json"} <= set(os.listdir(save / "0"))

    out = tmp_path / "published" / "draft"
    started = time.monotonic()
    publish_argv = [
        "publish", "--save-path", str(save), "--out", str(out),
        "--log", str(log), "--require-finite-loss",
    ]  # fmt: skip
    publish = run_module(
        "specfleet_helpers.stages.checkpoint",
        publish_argv,
        timeout=120,
        python=sys.executable,
        capture_output=True,
    )
    timings["publish_s"] = round(time.monotonic() - started, 2)
    assert publish.returncode == 0, publish.stderr
    published = json.loads(publish.stdout.strip().splitlines()[-1])
    assert published["epoch"] == 0
    assert published["selected_by"] == "checkpoint_best"
    metrics = published["metrics"]
    assert metrics["val_loss_finite"] is True
    assert math.isfinite(metrics["val_loss"])
    assert metrics["val_loss_source"] == "val_metrics.json"
    assert metrics["log"]["val/loss_epoch"] == pytest.approx(metrics["val_loss"], abs=1e-3)
    assert math.isfinite(metrics["log"]["train/loss"])
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_model_type"] == "dflash"
    assert config["aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert config["block_size"] == 4
    assert config["draft_vocab_size"] == 512

    verify = run_module(
        "specfleet_helpers.stages.checkpoint",
        ["verify", "--out", str(out)],
        timeout=60,
        python=sys.executable,
        capture_output=True,
    )
    assert verify.returncode == 0, verify.stderr
    print(json.dumps({"verifier_built_by": built_by, "timings": timings, "val_loss": metrics}))
