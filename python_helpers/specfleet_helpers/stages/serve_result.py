"""Combine and verify the serve stage's checks into one result file.

The serve script collects one JSON per check (the chat completion, the spec-decode metrics,
with an API key whether the server refused requests without it, and, for the lossless check,
greedy outputs with and without the draft). `combine` writes them as one result.json
(atomically); `verify` re-reads it and exits 1 unless the smoke completion finished by
length with exactly max_tokens tokens, the draft proposed tokens (drafts > 0), with
--require-api-key the server refused requests without its key (HTTP 401), and, when
checked, the draft server's greedy tokens equal the plain verifier's, with --bench-prompts every
server of the measurement (serve_bench) answered every request of every round, and no figure is
below its --floor (naming the figure, the floor and the draft). For serve_mode service
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
from specfleet_helpers.stages import serve_bench


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
    bench: Optional[dict[str, Any]] = None,
) -> dict[str, Any]:
    result: dict[str, Any] = {"chat": last_json(chat), "metrics": last_json(metrics)}
    if bench is not None:
        result["bench"] = bench
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
REFERENCE_FORMAT = 3
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


# What the plain verifier's reference is made of: its greedy outputs (the lossless check), in a
# file of its own. Its benchmark figures are not kept: a speedup is measured against the plain
# verifier of the same round (serve_bench), never against one measured in another run.
REFERENCE_PARTS = {"greedy": _greedy_outputs}


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


def bench_problems(bench: Optional[dict[str, Any]], prompts: int) -> list[str]:
    """Every server benchmarked in every round, each request completed."""
    if not isinstance(bench, dict):
        return ["no benchmark recorded"]
    problems = []
    for arm in serve_bench.ARMS:
        figures = bench.get(arm)
        if arm == "yardstick" and figures is None:
            continue
        if not isinstance(figures, dict):
            problems.append(f"no {arm} benchmark recorded")
            continue
        completed, failed = figures.get("completed") or [], figures.get("failed") or []
        if (
            len(completed) != bench.get("rounds")
            or any(c != prompts for c in completed)
            or any(failed)
        ):
            problems.append(
                f"the {arm} benchmark completed {completed} of {prompts} requests per round"
                f" ({failed} failed)"
            )
    return problems


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
    floors: Optional[list[tuple[str, str, float]]] = None,
    floors_of: str = "configured",
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
        problems += bench_problems(bench, bench_prompts)
    problems += serve_bench.floor_problems(bench, floors or [], floors_of)
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
        trained = bench["trained"]
        summary.update(
            acceptance_measured_on="bench",
            acceptance_rate=trained["acceptance_rate"],
            mean_acceptance_length=trained["mean_acceptance_length"],
            num_drafts=trained["num_drafts"],
            num_draft_tokens=trained["draft_tokens"],
            num_accepted_tokens=trained["accepted_tokens"],
            bench=bench,
        )
        if floors:
            summary["floors"] = {
                "of": floors_of,
                "checked": [f"{arm}.{name}>={value:g}" for arm, name, value in floors],
            }
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


def _floor(text: str) -> tuple[str, str, float]:
    try:
        return serve_bench.parse_floor(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _drafts(given: list[str]) -> dict[str, str]:
    drafts = {}
    for item in given:
        arm, sep, path = item.partition("=")
        if not sep or arm not in serve_bench.DRAFT_ARMS or not path:
            raise ValueError(
                f"--draft {item!r}: expected ARM=PATH with ARM one of"
                f" {', '.join(serve_bench.DRAFT_ARMS)}"
            )
        drafts[arm] = path
    if "trained" not in drafts:
        raise ValueError("--bench-dir needs --draft trained=PATH")
    return drafts


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
    c.add_argument(
        "--bench-dir",
        type=Path,
        help="where the serve script saved each round's vllm bench serve results (serve_bench)",
    )
    c.add_argument("--bench-rounds", type=int, default=3, help="rounds measured")
    c.add_argument(
        "--bench-servers",
        choices=serve_bench.SERVER_MODES,
        default="together",
        help="whether the servers ran all at once or one at a time",
    )
    c.add_argument(
        "--draft",
        action="append",
        default=[],
        metavar="ARM=PATH",
        help=f"a draft benchmarked ({', '.join(serve_bench.DRAFT_ARMS)}) and where it is",
    )
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
        help="require every server benchmarked in every round, this many requests each completed",
    )
    v.add_argument(
        "--floor",
        action="append",
        default=[],
        type=_floor,
        metavar="ARM.FIGURE=VALUE",
        help=(
            "fail when a draft's figure is below VALUE, e.g. yardstick.mean_acceptance_length=3"
            f" (FIGURE: {', '.join(serve_bench.FLOOR_FIGURES)})"
        ),
    )
    v.add_argument(
        "--floors-of",
        default="configured",
        help="where the floors are set, named in the failure (e.g. the hardware group)",
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
                bench=serve_bench.summarize(
                    args.bench_dir, args.bench_rounds, _drafts(args.draft), args.bench_servers
                )
                if args.bench_dir is not None
                else None,
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
                args.floor,
                args.floors_of,
            )
    except (OSError, ValueError, KeyError) as exc:
        print(f"serve result {args.command} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
