"""Combine and verify the serve stage's checks into one result file.

The serve script collects one JSON per check (the chat completion, the spec-decode metrics,
with an API key whether the server refused requests without it, and, for the lossless check,
greedy outputs with and without the draft). `combine` writes them as one result.json
(atomically); `verify` re-reads it and exits 1 unless the smoke completion finished by
length with exactly max_tokens tokens, the draft proposed tokens (drafts > 0), with
--require-api-key the server refused requests without its key (HTTP 401), and, when
checked, the draft server's greedy tokens equal the plain verifier's. For serve_mode service
(--service-name), `verify` also requires the deployed service to be what this result checked
(the same launcher, unchanged), running and answering /health: a stopped, removed or
hand-changed endpoint is redeployed by the next run.

The plain verifier's greedy outputs depend only on the verifier's files, the vLLM install,
the server's arguments and the prompts, so they are kept (`keep-reference`) under a key made
of exactly those (`reference_key`: the verifier's files as the models stamp recorded them,
sha256 or size, where the models came from, the plain server's own `vllm serve` arguments
given after `--`, and an identity the serve role builds); a later
serve run with the same key takes them (`take-reference`) instead of starting a second
server. A draft retrained on an unchanged verifier is then checked against the kept outputs.
Standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any, Optional

from specfleet_helpers import files


def last_json(path: Path) -> dict[str, Any]:
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    if not lines:
        raise ValueError(f"{path} is empty")
    return json.loads(lines[-1])


def lossless(spec: dict[str, Any], plain: dict[str, Any]) -> dict[str, Any]:
    """Compare greedy outputs prompt by prompt (token ids when both have them)."""
    pairs = []
    for with_draft, without in zip(spec["outputs"], plain["outputs"]):
        key = "token_ids" if with_draft.get("token_ids") and without.get("token_ids") else "text"
        pairs.append(
            {
                "prompt": with_draft["prompt"],
                "compared_by": key,
                "equal": with_draft.get(key) == without.get(key),
            }
        )
    return {
        "prompts": len(pairs),
        "equal": bool(pairs) and all(p["equal"] for p in pairs),
        "pairs": pairs,
    }


def combine(
    chat: Path,
    metrics: Path,
    spec: Optional[Path],
    plain: Optional[Path],
    out: Path,
    auth: Optional[Path] = None,
    plain_source: str = "served",
    service: Optional[Path] = None,
    bench_dflash: Optional[Path] = None,
    bench_plain: Optional[Path] = None,
) -> dict[str, Any]:
    result: dict[str, Any] = {"chat": last_json(chat), "metrics": last_json(metrics)}
    if bench_dflash is not None and bench_plain is not None:
        result["bench"] = bench_figures(
            _bench_figures(bench_dflash), _bench_figures(bench_plain), plain_source
        )
    if auth is not None:
        result["auth"] = last_json(auth)
    if service is not None:
        shown = last_json(service)
        result["service"] = {key: shown.get(key) for key in SERVICE_KEYS}
    if spec is not None and plain is not None:
        result["lossless"] = {**lossless(last_json(spec), last_json(plain)), "plain": plain_source}
    files.write_json_atomic(out, result, indent=1)
    return result


# What result.json keeps of the service deployed (service.status), and verify reports.
SERVICE_KEYS = (
    "manager",
    "unit",
    "launcher",
    "launcher_sha256",
    "main_pid",
    "restarts",
    "host",
    "port",
)


def service_problems(
    result: dict[str, Any], name: str, run_dir: Path, health_wait_s: float
) -> tuple[list[str], dict[str, Any]]:
    """Whether the service this result checked still serves: deployed from the same launcher,
    unchanged, running, and answering /health (within `health_wait_s` when its server is
    running but still starting, e.g. just restarted by its supervisor)."""
    from specfleet_helpers.host import service  # noqa: PLC0415 - only the service mode needs it

    now = service.status(name, run_dir)
    checked = result.get("service") or {}
    if not now["deployed"]:
        return [f"the '{name}' service is not deployed (stopped or removed since)"], now
    if not checked:
        return ["this result was not checked against a service"], now
    if now.get("launcher_sha256") != checked.get("launcher_sha256") or not now.get(
        "launcher_unchanged"
    ):
        return [
            f"the deployed '{name}' service is not the one this result checked "
            "(its launcher changed)"
        ], now
    deadline = time.monotonic() + health_wait_s
    while now.get("running") and not now.get("healthy") and time.monotonic() < deadline:
        time.sleep(1.0)
        now = service.status(name, run_dir)
    if not now.get("running"):
        return [
            f"the '{name}' service is not running ({now.get('manager')}: "
            f"{now.get('active_state') or 'server process gone'})"
        ], now
    if not now.get("healthy"):
        return [
            f"the '{name}' service runs but does not answer /health within {health_wait_s:g} s"
        ], now
    return [], now


# Bumped when what a reference holds, or how it is keyed, changes: older ones are not taken.
REFERENCE_FORMAT = 2
# Models stamp inputs that say nothing about the verifier's weights (the run ids of what the
# models stage ran after, the stage script's own checksum).
_NOT_ORIGIN = frozenset({"upstream", "script_sha256"})


def reference_key(models_stamp: Path, verifier: Path, identity: Any) -> Optional[str]:
    """The key of the plain verifier's greedy outputs, or None when the models stamp does not
    record the verifier's files (then nothing is kept or taken)."""
    stamp = json.loads(models_stamp.read_text())
    recorded = (stamp.get("manifest") or {}).get("files") or {}
    prefix = str(verifier).rstrip("/") + "/"
    verifier_files = {
        path[len(prefix) :]: entry.get("sha256") or entry.get("size")
        for path, entry in recorded.items()
        if path.startswith(prefix) and isinstance(entry, dict)
    }
    if not verifier_files:
        return None
    # Where the models came from as well: a shard larger than the hash limit is recorded by
    # size only, and new weights of the same shapes have the same sizes.
    origin = {k: v for k, v in (stamp.get("inputs") or {}).items() if k not in _NOT_ORIGIN}
    keyed = {
        "format": REFERENCE_FORMAT,
        "verifier": verifier_files,
        "origin": origin,
        "identity": identity,
    }
    return hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()


def _greedy_outputs(path: Path) -> dict[str, Any]:
    data = last_json(path)
    outputs = data.get("outputs")
    if not isinstance(outputs, list) or not outputs:
        raise ValueError(f"{path} holds no greedy outputs")
    return data


def _bench_figures(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("output_throughput"), (int, float)):
        raise ValueError(f"{path} holds no vllm bench serve result")
    return data


# What the plain verifier's reference is made of: its greedy outputs (the lossless check) and
# its benchmark figures (the measured speedup), each kept in a file of its own.
REFERENCE_PARTS = {"greedy": _greedy_outputs, "bench": _bench_figures}


def take_reference(
    directory: Path, key: Optional[str], outs: dict[str, Path]
) -> Optional[list[Path]]:
    """Copy the kept parts of `key` to their `outs`; the kept files, or None unless every part
    asked for is kept. A kept file that does not read as its part is removed, so the plain
    server runs again."""
    if key is None or not outs:
        return None
    found: dict[str, tuple[Path, dict[str, Any]]] = {}
    for part in outs:
        kept = directory / f"{key}.{part}.json"
        try:
            found[part] = (kept, REFERENCE_PARTS[part](kept))
        except FileNotFoundError:
            return None
        except ValueError:
            kept.unlink(missing_ok=True)
            return None
    for part, (_, data) in found.items():
        files.write_json_atomic(outs[part], data)
    return [kept for kept, _ in found.values()]


def keep_reference(
    directory: Path, key: Optional[str], sources: dict[str, Path]
) -> Optional[list[Path]]:
    """Keep the plain verifier's parts in `sources` under `key` (atomically, each)."""
    if key is None:
        return None
    checked = {part: REFERENCE_PARTS[part](source) for part, source in sources.items()}
    directory.mkdir(parents=True, exist_ok=True)
    kept = []
    for part, data in checked.items():
        target = directory / f"{key}.{part}.json"
        files.write_json_atomic(target, data)
        kept.append(target)
    return kept


# What result.json and the stamp keep of a `vllm bench serve` result (the rest is per request,
# or the run's own bookkeeping).
BENCH_KEYS = (
    "date",
    "num_prompts",
    "max_concurrency",
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "mean_ttft_ms",
    "median_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "mean_itl_ms",
    "spec_decode_acceptance_rate",
    "spec_decode_acceptance_length",
    "spec_decode_num_drafts",
    "spec_decode_draft_tokens",
    "spec_decode_accepted_tokens",
    "spec_decode_per_position_acceptance_rates",
)


def bench_figures(
    dflash: dict[str, Any], plain: dict[str, Any], plain_source: str
) -> dict[str, Any]:
    """The measured speedup: both runs' figures and the ratios (> 1 is faster with the draft).
    vLLM reports the acceptance rate in percent; here it is a fraction like the checks'."""
    shown_dflash = {k: dflash.get(k) for k in BENCH_KEYS}
    shown_plain = {k: plain.get(k) for k in BENCH_KEYS if not k.startswith("spec_decode")}
    shown_plain["source"] = plain_source

    def ratio(a: Any, b: Any) -> Optional[float]:
        ok = isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0
        return a / b if ok else None

    rate = dflash.get("spec_decode_acceptance_rate")
    return {
        "dflash": shown_dflash,
        "plain": shown_plain,
        "acceptance_rate": rate / 100.0 if isinstance(rate, (int, float)) else None,
        "mean_acceptance_length": dflash.get("spec_decode_acceptance_length"),
        "per_position_acceptance": dflash.get("spec_decode_per_position_acceptance_rates"),
        "speedup_output_throughput": ratio(
            dflash.get("output_throughput"), plain.get("output_throughput")
        ),
        "speedup_tpot": ratio(plain.get("mean_tpot_ms"), dflash.get("mean_tpot_ms")),
    }


def api_key_enforced(result: dict[str, Any]) -> bool:
    """True only when the serve run checked that requests without the key got HTTP 401."""
    auth = result.get("auth")
    return isinstance(auth, dict) and auth.get("api_key_enforced") is True


def verify(
    result_path: Path,
    max_tokens: int,
    require_lossless: bool,
    require_api_key: bool = False,
    service_name: Optional[str] = None,
    run_dir: Optional[Path] = None,
    health_wait_s: float = 0.0,
    bench_prompts: int = 0,
) -> dict[str, Any]:
    result = json.loads(result_path.read_text())
    chat, metrics = result["chat"], result["metrics"]
    problems = []
    serving: dict[str, Any] = {}
    if service_name is not None:
        if run_dir is None:
            raise ValueError("--service-name needs --run-dir")
        problems, serving = service_problems(result, service_name, run_dir, health_wait_s)
    if require_api_key and not api_key_enforced(result):
        auth = result.get("auth")
        problems.append(
            "the server did not refuse a request without its API key: "
            + (str(auth.get("error") or auth) if isinstance(auth, dict) else "no check recorded")
        )
    if chat.get("finish_reason") != "length":
        problems.append(f"finish_reason is {chat.get('finish_reason')!r}, expected 'length'")
    if chat.get("completion_tokens") != max_tokens:
        problems.append(
            f"completion_tokens is {chat.get('completion_tokens')}, expected {max_tokens}"
        )
    if not metrics.get("num_drafts"):
        problems.append("the draft proposed nothing (spec_decode drafts = 0)")
    if require_lossless:
        check = result.get("lossless")
        if check is None:
            problems.append("no lossless check recorded")
        elif not check["equal"]:
            differing = [p["prompt"] for p in check["pairs"] if not p["equal"]]
            problems.append(f"greedy outputs differ with the draft for: {differing}")
    bench = result.get("bench")
    if bench_prompts:
        for side in ("dflash", "plain"):
            figures = (bench or {}).get(side) or {}
            if figures.get("completed") != bench_prompts or figures.get("failed"):
                problems.append(
                    f"the {side} benchmark completed {figures.get('completed')} of {bench_prompts}"
                    f" requests ({figures.get('failed')} failed)"
                    if figures
                    else f"no {side} benchmark recorded"
                )
    if problems:
        raise ValueError("; ".join(problems))
    summary = {
        "path": str(result_path),
        "content": chat.get("content"),
        "completion_tokens": chat.get("completion_tokens"),
        "finish_reason": chat.get("finish_reason"),
        "num_drafts": metrics.get("num_drafts"),
        "num_draft_tokens": metrics.get("num_draft_tokens"),
        "num_accepted_tokens": metrics.get("num_accepted_tokens"),
        "acceptance_rate": metrics.get("acceptance_rate"),
        "mean_acceptance_length": metrics.get("mean_acceptance_length"),
        "api_key_enforced": api_key_enforced(result),
    }
    if serving:
        # live_: the service as it is now (stage_verify neither compares nor keeps it).
        summary["live_service"] = {
            key: serving.get(key) for key in (*SERVICE_KEYS, "healthy", "enabled")
        }
    if "lossless" in result:
        summary["lossless"] = result["lossless"]["equal"]
        summary["lossless_prompts"] = result["lossless"]["prompts"]
    if bench_prompts and bench:
        # The acceptance people compare is the benchmark's: the same fixed prompts on every host.
        dflash = bench["dflash"]
        summary.update(
            acceptance_measured_on="bench",
            acceptance_rate=bench["acceptance_rate"],
            mean_acceptance_length=bench["mean_acceptance_length"],
            num_drafts=dflash.get("spec_decode_num_drafts"),
            num_draft_tokens=dflash.get("spec_decode_draft_tokens"),
            num_accepted_tokens=dflash.get("spec_decode_accepted_tokens"),
            bench=bench,
        )
    else:
        summary["acceptance_measured_on"] = "checks"
    return summary


def _parts(given: list[str]) -> dict[str, Path]:
    parts = {}
    for item in given:
        name, sep, path = item.partition("=")
        if not sep or name not in REFERENCE_PARTS or not path:
            raise ValueError(
                f"--part {item!r}: expected NAME=FILE with NAME one of {', '.join(REFERENCE_PARTS)}"
            )
        parts[name] = Path(path)
    return parts


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specfleet_helpers.stages.serve_result",
        description="Combine the serve stage's check outputs into result.json, or verify it.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("combine", help="write result.json from the per-check JSON files")
    c.add_argument("--chat", type=Path, required=True)
    c.add_argument("--metrics", type=Path, required=True)
    c.add_argument("--greedy-with-draft", type=Path)
    c.add_argument("--greedy-plain", type=Path)
    c.add_argument("--auth", type=Path, help="serve_check auth output (with an API key)")
    c.add_argument(
        "--plain-source",
        choices=["served", "kept"],
        default="served",
        help="whether --greedy-plain came from a plain server now or was kept from an earlier run",
    )
    c.add_argument("--service", type=Path, help="service status output (serve_mode service)")
    c.add_argument("--bench-dflash", type=Path, help="vllm bench serve result, DFlash endpoint")
    c.add_argument("--bench-plain", type=Path, help="vllm bench serve result, plain verifier")
    c.add_argument("--out", type=Path, required=True)
    v = sub.add_parser("verify", help="exit 1 unless result.json shows a passing smoke test")
    v.add_argument("--result", type=Path, required=True)
    v.add_argument("--max-tokens", type=int, required=True)
    v.add_argument("--require-lossless", action="store_true")
    v.add_argument(
        "--require-api-key",
        action="store_true",
        help="fail unless a request without the API key was refused (HTTP 401)",
    )
    v.add_argument("--service-name", help="serve_mode service: the service that must still serve")
    v.add_argument(
        "--run-dir", type=Path, help="where the service's record is (with --service-name)"
    )
    v.add_argument(
        "--health-wait-s",
        type=float,
        default=0.0,
        help="how long a running service's server may take to answer /health (a restart)",
    )
    v.add_argument(
        "--bench-prompts",
        type=int,
        default=0,
        help="require both benchmarks with every one of this many requests completed",
    )
    for name, what in (
        (
            "take-reference",
            "copy the kept plain-verifier outputs to --out, print their file; exit 3 if none",
        ),
        ("keep-reference", "keep the plain-verifier greedy outputs of --from for later runs"),
    ):
        r = sub.add_parser(name, help=what)
        r.add_argument("--dir", type=Path, required=True, help="where kept outputs live")
        r.add_argument(
            "--models-stamp", type=Path, required=True, help="<specfleet_root>/state/models.json"
        )
        r.add_argument("--verifier", type=Path, required=True, help="the verifier's directory")
        r.add_argument(
            "--identity",
            type=json.loads,
            required=True,
            help="JSON: the vLLM install and the prompts the outputs depend on",
        )
        r.add_argument(
            "--part",
            action="append",
            required=True,
            metavar="NAME=FILE",
            help=(
                f"a part of the reference ({', '.join(REFERENCE_PARTS)}) and the file to"
                + (" copy it to" if name == "take-reference" else " keep it from")
            ),
        )
        r.add_argument(
            "server_argv",
            nargs="*",
            metavar="-- SERVER_ARG",
            help="after --: the plain server's vllm serve arguments (host and port left out)",
        )
    args = parser.parse_args(argv)
    try:
        if args.command in ("take-reference", "keep-reference"):
            identity = {"server": args.server_argv, **args.identity}
            key = reference_key(args.models_stamp, args.verifier, identity)
            parts = _parts(args.part)
            if args.command == "take-reference":
                kept = take_reference(args.dir, key, parts)
            else:
                kept = keep_reference(args.dir, key, parts)
            if kept is None:
                return 3 if args.command == "take-reference" else 0
            print(" ".join(str(path) for path in kept))
            return 0
        if args.command == "combine":
            out = combine(
                args.chat,
                args.metrics,
                args.greedy_with_draft,
                args.greedy_plain,
                args.out,
                auth=args.auth,
                plain_source=args.plain_source,
                service=args.service,
                bench_dflash=args.bench_dflash,
                bench_plain=args.bench_plain,
            )
        else:
            out = verify(
                args.result,
                args.max_tokens,
                args.require_lossless,
                args.require_api_key,
                args.service_name,
                args.run_dir,
                args.health_wait_s,
                args.bench_prompts,
            )
    except (OSError, ValueError, KeyError) as exc:
        print(f"serve result {args.command} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
