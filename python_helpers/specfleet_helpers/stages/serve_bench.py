"""The serve stage's measurement: the plain verifier, the trained draft and the yardstick
(the converted pretrained draft) benchmarked alternately, and the floors they are held to.

Why alternately: a speedup compares two runs of ``vllm bench serve``, and a figure measured
minutes away from its baseline measures whatever else the host did meanwhile (on the test
fleet, a draft benchmarked while other stages loaded the shared cores showed 89.9 %
acceptance and a 0.87x "speedup"). So every server is benchmarked once per round, the rounds
rotate the order (plain, trained, yardstick; then yardstick, plain, trained; ...), and each
round's speedup is taken against the plain verifier of the same round. The report shows the
median over the rounds and their spread (lowest, highest): a wide spread says the host was
not quiet, whatever the median.

The serve script saves each run as ``DIR/bench_<arm>_r<round>.json`` (vLLM's own result
file); ``summarize`` reads them. Acceptance is pooled over the rounds (accepted over proposed
tokens; mean acceptance length 1 + accepted / drafts, vLLM's definition), throughput and time
per output token are medians.

``run`` drives the benchmark itself: vLLM's own client (``vllm.benchmarks.serve``, what ``vllm
bench serve`` runs), called once per arm and round in one process, so that vLLM's import
(seconds of CPU) is paid once, not nine times; each run's output goes to
``bench_<arm>_r<round>.log`` beside its result. Its arguments are ``bench_argv``'s, one list for
every server: the prompts as a chat client sends them (the ``openai-chat`` backend, the prompt
the user message), which the server renders with the verifier's chat template, once. (vLLM's
``custom`` dataset applies the tokenizer's chat template itself unless told
``--skip-chat-template``: with a chat backend every prompt was templated twice, a chat
template inside the user message, and every figure measured on text no client sends.)

Floors: ``ARM.FIGURE=VALUE`` (e.g. ``yardstick.mean_acceptance_length=3``), checked by
``floor_problems`` against the medians; a figure below its floor names the figure, the floor,
where the floor comes from and the draft. Standard library only, but for ``run``, which
imports vLLM (the stage's Python has it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable, Optional

# The servers a measurement compares, in the order of its first round.
PLAIN = "plain"
DRAFT_ARMS = ("trained", "yardstick")
ARMS = (PLAIN, *DRAFT_ARMS)
# How the servers ran: all up at once (each on its own port and device), or one at a time,
# started again for each round (hosts with fewer devices than servers).
SERVER_MODES = ("together", "in turn")
# The figures a floor may name (per draft arm), and what the report calls them.
FLOOR_FIGURES = {
    "mean_acceptance_length": "mean acceptance length",
    "acceptance_rate": "acceptance rate",
    "speedup": "speedup over the plain verifier (output tokens/s)",
}
DRAFT_NAMES = {
    "trained": "the trained draft",
    "yardstick": "the yardstick (the converted pretrained draft)",
}
# What is kept of each round's vllm bench serve result.
ROUND_KEYS = (
    "date",
    "completed",
    "failed",
    "duration",
    "output_throughput",
    "mean_tpot_ms",
    "mean_ttft_ms",
    "spec_decode_num_drafts",
    "spec_decode_draft_tokens",
    "spec_decode_accepted_tokens",
    "spec_decode_per_position_acceptance_rates",
)


def round_order(arms: list[str], round_index: int) -> list[str]:
    """The order of round `round_index` (0-based): the arms rotated right by the round, so each
    arm takes every place once in len(arms) rounds, and a round starts with the arm the round
    before ended with: measured one server at a time, that server stays up across the two
    rounds (len(arms) - 1 fewer server starts over the measurement)."""
    shift = round_index % len(arms)
    return arms[len(arms) - shift :] + arms[: len(arms) - shift]


def result_path(directory: Path, arm: str, round_number: int) -> Path:
    return directory / f"bench_{arm}_r{round_number}.json"


def _read_round(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("output_throughput"), (int, float)):
        raise ValueError(f"{path} holds no vllm bench serve result")
    return {key: data.get(key) for key in ROUND_KEYS}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _spread(values: list[float]) -> dict[str, Any]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "rounds": values,
    }


def _ratios(numerators: list[Any], denominators: list[Any]) -> Optional[dict[str, Any]]:
    pairs = [a / b for a, b in zip(numerators, denominators) if _number(a) and _number(b) and b > 0]
    return _spread(pairs) if pairs and len(pairs) == len(numerators) else None


def _acceptance(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    drafts = sum(r.get("spec_decode_num_drafts") or 0 for r in rounds)
    proposed = sum(r.get("spec_decode_draft_tokens") or 0 for r in rounds)
    accepted = sum(r.get("spec_decode_accepted_tokens") or 0 for r in rounds)
    positions: list[float] = []
    weighted = [
        (r.get("spec_decode_num_drafts") or 0, r.get("spec_decode_per_position_acceptance_rates"))
        for r in rounds
    ]
    if drafts and all(isinstance(rates, list) for _, rates in weighted):
        width = min(len(rates) for _, rates in weighted)
        positions = [sum(n * rates[i] for n, rates in weighted) / drafts for i in range(width)]
    return {
        "num_drafts": drafts,
        "draft_tokens": proposed,
        "accepted_tokens": accepted,
        "acceptance_rate": accepted / proposed if proposed else None,
        "mean_acceptance_length": 1 + accepted / drafts if drafts else None,
        "per_position_acceptance": positions or None,
    }


def summarize(directory: Path, rounds: int, drafts: dict[str, str], servers: str) -> dict[str, Any]:
    """The measurement's figures: per arm the medians and spread over `rounds`, for each draft
    in `drafts` (arm -> the draft's path) its pooled acceptance and its speedup over the plain
    verifier, round by round."""
    if rounds < 1:
        raise ValueError(f"rounds is {rounds}, expected at least 1")
    arms = [PLAIN, *[arm for arm in DRAFT_ARMS if arm in drafts]]
    measured = {
        arm: [_read_round(result_path(directory, arm, n)) for n in range(1, rounds + 1)]
        for arm in arms
    }
    plain = measured[PLAIN]
    out: dict[str, Any] = {
        "rounds": rounds,
        "servers": servers,
        "order": [round_order(arms, i) for i in range(rounds)],
        PLAIN: {
            "output_throughput": _spread([r["output_throughput"] for r in plain]),
            "mean_tpot_ms": _spread([r["mean_tpot_ms"] for r in plain]),
            "completed": [r["completed"] for r in plain],
            "failed": [r["failed"] for r in plain],
            "dates": [r["date"] for r in plain],
        },
    }
    for arm in arms[1:]:
        runs = measured[arm]
        out[arm] = {
            "draft": drafts[arm],
            "output_throughput": _spread([r["output_throughput"] for r in runs]),
            "mean_tpot_ms": _spread([r["mean_tpot_ms"] for r in runs]),
            "completed": [r["completed"] for r in runs],
            "failed": [r["failed"] for r in runs],
            "dates": [r["date"] for r in runs],
            **_acceptance(runs),
            "speedup": _ratios(
                [r["output_throughput"] for r in runs], [r["output_throughput"] for r in plain]
            ),
            "speedup_tpot": _ratios(
                [r["mean_tpot_ms"] for r in plain], [r["mean_tpot_ms"] for r in runs]
            ),
        }
    return out


def figure(bench: dict[str, Any], arm: str, name: str) -> Optional[float]:
    """A draft arm's figure a floor is held against (medians for the speedup)."""
    measured = bench.get(arm)
    if not isinstance(measured, dict):
        return None
    value = measured.get(name)
    if isinstance(value, dict):
        value = value.get("median")
    return float(value) if _number(value) else None


def parse_floor(text: str) -> tuple[str, str, float]:
    """``ARM.FIGURE=VALUE`` -> (arm, figure, value); ValueError naming what was expected."""
    name, sep, value = text.partition("=")
    arm, dot, figure_name = name.partition(".")
    if not sep or not dot or arm not in DRAFT_ARMS or figure_name not in FLOOR_FIGURES:
        raise ValueError(
            f"floor {text!r}: expected ARM.FIGURE=NUMBER with ARM one of {', '.join(DRAFT_ARMS)}"
            f" and FIGURE one of {', '.join(FLOOR_FIGURES)}"
        )
    try:
        return arm, figure_name, float(value)
    except ValueError:
        raise ValueError(f"floor {text!r}: {value!r} is not a number") from None


def floor_problems(
    bench: Optional[dict[str, Any]], floors: list[tuple[str, str, float]], floors_of: str
) -> list[str]:
    """One sentence per figure below its floor (or not measured), naming the figure, the
    floor, where the floor is set and the draft."""
    problems = []
    for arm, name, floor in floors:
        measured = (bench or {}).get(arm)
        what = f"{DRAFT_NAMES[arm]}"
        if isinstance(measured, dict) and measured.get("draft"):
            what += f" ({measured['draft']})"
        value = figure(bench or {}, arm, name)
        if value is None:
            problems.append(
                f"{what}: no {FLOOR_FIGURES[name]} measured, so its floor {floor:g}"
                f" ({floors_of}) cannot be checked"
            )
        elif value < floor:
            rounds = (bench or {}).get("rounds")
            problems.append(
                f"{what}: {FLOOR_FIGURES[name]} {value:.3g}"
                + (f" (median of {rounds} rounds)" if name == "speedup" and rounds else "")
                + f" is below its floor {floor:g} ({floors_of})"
            )
    return problems


def bench_argv(
    model: str,
    tokenizer: str,
    prompts: Path,
    num_prompts: int,
    output_len: int,
    concurrency: int,
    ignore_eos: bool,
) -> list[str]:
    """`vllm bench serve`'s arguments for the measurement, but for the server's URL and where it
    saves (``run`` adds those): specfleet's benchmark prompts (a ``custom`` JSONL of
    {"prompt": ...}), in file order, sent to /v1/chat/completions as the user message, untouched
    (--skip-chat-template: the server applies the chat template), greedy, answers of exactly
    `output_len` tokens with `ignore_eos`, `concurrency` requests in flight."""
    argv = [
        "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
        "--model", model, "--tokenizer", tokenizer,
        "--dataset-name", "custom", "--dataset-path", str(prompts), "--skip-chat-template",
        "--disable-shuffle", "--num-prompts", str(num_prompts),
        "--custom-output-len", str(output_len),
        "--temperature", "0", "--max-concurrency", str(concurrency), "--seed", "0",
        "--disable-tqdm",
    ]  # fmt: skip
    return argv + (["--ignore-eos"] if ignore_eos else [])


def _arm_urls(given: list[str]) -> dict[str, str]:
    urls = {}
    for item in given:
        arm, sep, url = item.partition("=")
        if not sep or arm not in ARMS or not url:
            raise ValueError(f"--arm {item!r}: expected ARM=URL with ARM one of {', '.join(ARMS)}")
        urls[arm] = url
    return urls


def _vllm_bench() -> tuple[Callable[[list[str]], argparse.Namespace], Callable[..., Any]]:
    """vLLM's benchmark client: its argument parser (as `vllm bench serve` builds it) and main."""
    from vllm.benchmarks import serve as vllm_serve_bench  # noqa: PLC0415 - vLLM only for run

    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: PLC0415
    except ImportError:  # older vLLM (the vllm-ascend image's line)
        from vllm.utils import FlexibleArgumentParser  # noqa: PLC0415

    parser = FlexibleArgumentParser(prog="vllm bench serve")
    vllm_serve_bench.add_cli_args(parser)
    return parser.parse_args, vllm_serve_bench.main


def _summary_line(result: dict[str, Any]) -> str:
    parts = [f"{result.get('output_throughput', 0):.1f} output tok/s"]
    length = result.get("spec_decode_acceptance_length")
    if _number(length):
        parts.append(f"acceptance length {length:.2f}")
    failed = result.get("failed")
    if failed:
        parts.append(f"{failed} FAILED")
    return ", ".join(parts)


def run(
    directory: Path,
    arms: dict[str, str],
    rounds: Sequence[int],
    bench_argv: list[str],
    total_rounds: int,
    bench: Optional[tuple[Callable[[list[str]], argparse.Namespace], Callable[..., Any]]] = None,
    server_logs: Optional[dict[str, str]] = None,
) -> list[dict[str, Any]]:
    """Benchmark every arm (name -> base URL) in each of `rounds`, the order rotated by the
    round; each result in DIR/bench_<arm>_r<round>.json, vLLM's output in .log beside it."""
    parse, main = bench or _vllm_bench()
    server_logs = server_logs or {}
    directory.mkdir(parents=True, exist_ok=True)
    names = [arm for arm in ARMS if arm in arms]
    done = []
    for number in rounds:
        for arm in round_order(names, number - 1):
            out = result_path(directory, arm, number)
            args = parse(
                [
                    *bench_argv,
                    "--base-url",
                    arms[arm],
                    "--save-result",
                    "--result-dir",
                    str(directory),
                    "--result-filename",
                    out.name,
                ]
            )
            started = time.monotonic()
            log = out.with_suffix(".log")
            # Nested, not one parenthesized `with`: the host's Python may be 3.9 (serve_result,
            # which imports this module, verifies with it).
            with open(log, "w", encoding="utf-8") as sink:  # noqa: SIM117
                with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                    try:
                        result = main(args)
                    except Exception as exc:  # noqa: BLE001 - reported with the log's tail
                        print(f"{type(exc).__name__}: {exc}")
                        result = None
            failed = None
            if not isinstance(result, dict) or not out.exists():
                failed = "vllm bench serve failed"
            elif result.get("failed") or not result.get("completed"):
                # A server that died answers every request with an error at once: a figure
                # measured on it is no figure.
                sent = (result.get("completed") or 0) + (result.get("failed") or 0)
                failed = f"{result.get('failed')} of {sent} requests failed"
            if failed:
                tail = log.read_text(errors="replace").splitlines()[-30:]
                where = f" and its server's log, {server_logs[arm]}" if arm in server_logs else ""
                raise RuntimeError(
                    f"{failed} against the {arm} server ({arms[arm]}), round {number}: see"
                    f" {log}{where}\n" + "\n".join(tail)
                )
            print(
                f"    round {number}/{total_rounds} {arm:<9} {_summary_line(result)}"
                f" ({time.monotonic() - started:.1f} s)",
                flush=True,
            )
            done.append({"arm": arm, "round": number, "file": str(out)})
    return done


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specfleet_helpers.stages.serve_bench",
        description="Benchmark the serve stage's servers alternately with vLLM's own client "
        "(vllm bench serve), round by round.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="benchmark each arm in each round, the order rotated")
    r.add_argument("--dir", type=Path, required=True, help="where the round results go")
    r.add_argument(
        "--arm",
        action="append",
        required=True,
        metavar="ARM=URL",
        help=f"a server to benchmark ({', '.join(ARMS)}) and its base URL",
    )
    r.add_argument("--rounds", type=int, required=True, help="rounds of the whole measurement")
    r.add_argument(
        "--round",
        type=int,
        action="append",
        help="run only this round (repeat; servers one at a time run one round per call)",
    )
    r.add_argument(
        "--server-log",
        action="append",
        default=[],
        metavar="ARM=FILE",
        help="the log of an arm's server, named when its benchmark fails",
    )
    r.add_argument("--model", required=True, help="the served model name")
    r.add_argument("--tokenizer", required=True, help="the verifier's directory (its tokenizer)")
    r.add_argument(
        "--prompts", type=Path, required=True, help='the prompts, a JSONL of {"prompt": ...}'
    )
    r.add_argument("--num-prompts", type=int, required=True, help="prompts per server and round")
    r.add_argument("--output-len", type=int, required=True, help="tokens per answer")
    r.add_argument("--concurrency", type=int, default=1, help="requests in flight (default 1)")
    r.add_argument(
        "--ignore-eos", action="store_true", help="every answer exactly --output-len tokens"
    )
    args = parser.parse_args(argv)
    try:
        run(
            args.dir,
            _arm_urls(args.arm),
            args.round or list(range(1, args.rounds + 1)),
            bench_argv(
                args.model,
                args.tokenizer,
                args.prompts,
                args.num_prompts,
                args.output_len,
                args.concurrency,
                args.ignore_eos,
            ),
            args.rounds,
            server_logs=dict(item.partition("=")[::2] for item in args.server_log),
        )
    except (ValueError, RuntimeError, OSError) as exc:
        print(f"serve_bench {args.command}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Without the interpreter's teardown: vLLM's import leaves Triton's bindings behind, whose
    # leak report (hundreds of lines) would bury the measurement in the stage's log.
    os._exit(code)
