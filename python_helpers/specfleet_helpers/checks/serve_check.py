"""Client side of the serve stage: talk to a running vLLM OpenAI-compatible server.

Subcommands (each prints one JSON line):
  chat     one chat completion, like the runbook's smoke test ("Hello", 8 tokens); fails
           unless it stopped because of the token limit after exactly --max-tokens tokens.
  metrics  the speculative-decoding counters from GET /metrics and what follows from them.
  greedy   temperature-0 chat completions per prompt with their token ids, so a role can
           compare the draft-model server with the plain verifier (speculative decoding is
           lossless: greedy outputs must be identical).
  auth     a server started with an API key must refuse requests without it: one chat
           completion without any key and one with a wrong key, each must get HTTP 401.

The API key, if the server wants one, is read from the environment variable named by
--api-key-env, never from argv (argv shows in ps and in logs). Standard library, plus
prometheus_client's parser for ``metrics``: the stage runs this module with the interpreter
that runs vLLM, and vLLM depends on prometheus_client (it serves /metrics with it).
Exit codes: 0 ok, 1 check failed or the server misbehaved, 2 bad input.
"""

from __future__ import annotations

import argparse
import http.client
import ipaddress
import json
import os
import secrets
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Optional

DEFAULT_TIMEOUT_S = 120.0
ERROR_BODY_CHARS = 500

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
SPEC_METRICS = (DRAFTS, DRAFT_TOKENS, ACCEPTED)

EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2


class CheckError(Exception):
    """The server answered badly, or a check on its answer failed."""

    exit_code = EXIT_FAILURE


class BadInput(CheckError):
    exit_code = EXIT_BAD_INPUT


class HTTPStatusError(CheckError):
    """The server answered with an HTTP error status (kept in `status`, its body in `detail`)."""

    def __init__(self, message: str, status: int, detail: str) -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail


# ---------------------------------------------------------------- Prometheus text


def _samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    # Imported here: chat, greedy and auth (and --help) need nothing beyond the stdlib.
    from prometheus_client.parser import text_string_to_metric_families

    return [
        (sample.name, dict(sample.labels), float(sample.value))
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Samples of a Prometheus text exposition as (name, labels, value), read with
    prometheus_client's parser; comments (# HELP, # TYPE, ...) and blank lines are skipped.
    Raises ValueError naming the first bad line."""
    try:
        return _samples(text)
    except ValueError as exc:
        for number, raw in enumerate(text.splitlines(), 1):
            try:
                _samples(raw + "\n")
            except ValueError as line_exc:
                raise ValueError(
                    f"line {number} is not a Prometheus sample ({line_exc}): {raw[:200]!r}"
                ) from None
        raise ValueError(f"not a Prometheus text exposition: {exc}") from None


def metric_sums(text: str, names: tuple[str, ...] = SPEC_METRICS) -> dict[str, Optional[float]]:
    """Each metric summed over all its label sets (engines, models); None when absent."""
    sums: dict[str, Optional[float]] = dict.fromkeys(names)
    for name, _labels, value in parse_prometheus(text):
        if name in sums:
            sums[name] = (sums[name] or 0.0) + value
    return sums


def spec_decode_stats(sums: dict[str, Optional[float]]) -> dict[str, Any]:
    """Speculative-decoding summary from the three counters, as vLLM defines it:

    acceptance_rate = accepted tokens / draft tokens proposed (0..1);
    mean_acceptance_length = 1 + accepted tokens / drafts, the tokens produced per
    verifier step: the accepted draft tokens plus the one token the verifier always
    emits (vLLM's SpecDecodingLogging prints this as "Mean acceptance length").
    Either is None when its denominator is 0 or missing (no speculation happened yet).
    """
    drafts, draft_tokens, accepted = (sums.get(name) for name in SPEC_METRICS)
    return {
        "num_drafts": drafts,
        "num_draft_tokens": draft_tokens,
        "num_accepted_tokens": accepted,
        "acceptance_rate": (accepted / draft_tokens)
        if accepted is not None and draft_tokens
        else None,
        "mean_acceptance_length": (1.0 + accepted / drafts)
        if accepted is not None and drafts
        else None,
        "spec_decode_metrics_present": all(v is not None for v in (drafts, draft_tokens, accepted)),
    }


# ---------------------------------------------------------------- HTTP


def _is_loopback(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_DEFAULT = urllib.request.build_opener()


def api_key_from_env(var: Optional[str]) -> Optional[str]:
    """The API key from the environment variable `var` (None: no key)."""
    if not var:
        return None
    value = os.environ.get(var)
    if not value:
        raise BadInput(f"--api-key-env {var}: that environment variable is not set or empty")
    return value


class Client:
    """Minimal JSON-over-HTTP client for one server base URL (http://host:port)."""

    def __init__(
        self, url: str, api_key: Optional[str] = None, timeout: float = DEFAULT_TIMEOUT_S
    ) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise BadInput(f"--url {url!r} is not an http(s)://host:port URL")
        self.base = url.rstrip("/")
        if self.base.endswith("/v1"):
            self.base = self.base[: -len("/v1")]
        self.api_key = api_key
        self.timeout = timeout
        # Loopback servers must not be reached through a proxy from the environment.
        self._opener = _DIRECT if _is_loopback(url) else _DEFAULT

    def request(self, method: str, path: str, body: Optional[dict] = None) -> tuple[int, bytes]:
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(self.base + path, data=data, headers=headers, method=method)
        try:
            with self._opener.open(req, timeout=self.timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:ERROR_BODY_CHARS].decode("utf-8", errors="replace").strip()
            raise HTTPStatusError(
                f"{method} {path} -> HTTP {exc.code}: {detail}", exc.code, detail
            ) from None
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise CheckError(f"{method} {path}: cannot reach {self.base}: {reason}") from None

    def get_text(self, path: str) -> str:
        return self.request("GET", path)[1].decode("utf-8", errors="replace")

    def post_json(self, path: str, body: dict) -> dict[str, Any]:
        _status, raw = self.request("POST", path, body)
        try:
            data = json.loads(raw)
        except ValueError:
            snippet = raw[:200].decode("utf-8", errors="replace")
            raise CheckError(f"POST {path}: response is not JSON: {snippet!r}") from None
        if not isinstance(data, dict):
            raise CheckError(f"POST {path}: response is not a JSON object")
        return data


def _first_choice(data: dict[str, Any], path: str) -> dict[str, Any]:
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise CheckError(f"POST {path}: response has no choices: {json.dumps(data)[:300]}")
    return choices[0]


def chat_completion(
    client: Client,
    model: str,
    prompt: str,
    max_tokens: int,
    temperature: Optional[float] = None,
    return_token_ids: bool = False,
) -> dict[str, Any]:
    """One non-streaming chat completion; content, finish_reason, usage, token ids."""
    path = "/v1/chat/completions"
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": False,
    }
    if temperature is not None:
        body["temperature"] = temperature
    if return_token_ids:
        body["return_token_ids"] = True
    data = client.post_json(path, body)
    choice = _first_choice(data, path)
    message = choice.get("message")
    if not isinstance(message, dict) or "content" not in message:
        raise CheckError(f"POST {path}: choice has no message content: {json.dumps(choice)[:300]}")
    usage = data.get("usage")
    if not isinstance(usage, dict) or not isinstance(usage.get("completion_tokens"), int):
        raise CheckError(f"POST {path}: response has no usage.completion_tokens")
    token_ids = choice.get("token_ids")
    return {
        "content": message.get("content") or "",
        "reasoning_content": message.get("reasoning_content") or message.get("reasoning"),
        "finish_reason": choice.get("finish_reason"),
        "completion_tokens": usage["completion_tokens"],
        "prompt_tokens": usage.get("prompt_tokens"),
        "token_ids": token_ids if isinstance(token_ids, list) else None,
    }


def check_chat(
    client: Client,
    model: str,
    prompt: str,
    max_tokens: int,
    require_length: bool = True,
    require_exact_tokens: bool = True,
) -> dict[str, Any]:
    """The runbook's smoke test: exactly `max_tokens` tokens, cut by the limit."""
    result = chat_completion(client, model, prompt, max_tokens)
    problems = []
    if require_length and result["finish_reason"] != "length":
        problems.append(f"finish_reason is {result['finish_reason']!r}, expected 'length'")
    if require_exact_tokens and result["completion_tokens"] != max_tokens:
        problems.append(
            f"completion_tokens is {result['completion_tokens']}, expected {max_tokens}"
        )
    out = {"ok": not problems, "prompt": prompt, "max_tokens": max_tokens, **result}
    if problems:
        out["error"] = "; ".join(problems)
    return out


def read_metrics(client: Client) -> dict[str, Any]:
    text = client.get_text("/metrics")
    try:
        sums = metric_sums(text)
    except ValueError as exc:
        raise CheckError(f"GET /metrics: {exc}") from None
    return {"metrics": sums, **spec_decode_stats(sums)}


def greedy(client: Client, model: str, prompts: list[str], max_tokens: int) -> list[dict[str, Any]]:
    """Temperature-0 completion per prompt, with token ids when the server returns them
    ("return_token_ids", vLLM >= 0.10); otherwise compare_by is "text"."""
    outputs = []
    for prompt in prompts:
        result = chat_completion(
            client, model, prompt, max_tokens, temperature=0.0, return_token_ids=True
        )
        outputs.append(
            {
                "prompt": prompt,
                "token_ids": result["token_ids"],
                "text": result["content"],
                "finish_reason": result["finish_reason"],
                "completion_tokens": result["completion_tokens"],
                "compare_by": "token_ids" if result["token_ids"] is not None else "text",
            }
        )
    return outputs


AUTH_PATH = "/v1/chat/completions"
WRONG_KEY_PREFIX = "specfleet-wrong-key-"
REFUSED = 401


def _status_without_valid_key(client: Client, model: str) -> tuple[int, str]:
    """POST one 1-token chat completion with client's key (None: none); (status, body)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 1,
        "stream": False,
    }
    try:
        status, raw = client.request("POST", AUTH_PATH, body)
    except HTTPStatusError as exc:
        return exc.status, exc.detail
    return status, raw[:ERROR_BODY_CHARS].decode("utf-8", errors="replace").strip()


def check_api_key_enforced(
    url: str, model: str, timeout: float = DEFAULT_TIMEOUT_S
) -> dict[str, Any]:
    """A server started with an API key must refuse a request without a key and one with a
    wrong (random) key, each with HTTP 401. Neither request carries the real key, so this
    needs none.

    {"ok", "api_key_enforced", "path", "without_key": status, "wrong_key": status[, "error"]}.
    """
    statuses = {}
    problems = []
    wrong = WRONG_KEY_PREFIX + secrets.token_hex(8)
    for case, key in (("without_key", None), ("wrong_key", wrong)):
        status, detail = _status_without_valid_key(Client(url, key, timeout=timeout), model)
        statuses[case] = status
        if status != REFUSED:
            what = "without an API key" if key is None else "with a wrong API key"
            problems.append(
                f"POST {AUTH_PATH} {what} -> HTTP {status}, expected {REFUSED}"
                f" ({detail[:200] or 'empty body'})"
            )
    out: dict[str, Any] = {
        "ok": not problems,
        "api_key_enforced": not problems,
        "path": AUTH_PATH,
        **statuses,
    }
    if problems:
        out["error"] = "the server does not enforce its API key: " + "; ".join(problems)
    return out


# ---------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m specfleet_helpers.checks.serve_check",
        description=(
            "Check a running vLLM OpenAI-compatible server: one chat completion, the "
            "speculative-decoding metrics, or greedy outputs for a lossless comparison. "
            "Prints one JSON line; exit 0 ok, 1 failed, 2 bad input."
        ),
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser, model: bool, api_key: bool = True) -> None:
        p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
        if model:
            p.add_argument(
                "--model", required=True, help="model name the server serves (served-model-name)"
            )
        if api_key:
            p.add_argument(
                "--api-key-env",
                metavar="VAR",
                help="name of the environment variable holding the API key (never the key itself)",
            )
        p.add_argument(
            "--timeout",
            type=float,
            default=DEFAULT_TIMEOUT_S,
            help="seconds per HTTP request (default %(default)s)",
        )

    p = sub.add_parser(
        "chat",
        help="one chat completion; fail unless cut at exactly --max-tokens",
        description=(
            "POST /v1/chat/completions with one user message. Exit 1 unless finish_reason is "
            "'length' and completion_tokens == --max-tokens (see the --allow-* flags)."
        ),
    )
    common(p, model=True)
    p.add_argument("--prompt", default="Hello", help="user message (default %(default)s)")
    p.add_argument("--max-tokens", type=int, default=8, help="token limit (default %(default)s)")
    p.add_argument(
        "--allow-stop", action="store_true", help="accept any finish_reason (e.g. 'stop')"
    )
    p.add_argument(
        "--allow-fewer-tokens",
        action="store_true",
        help="accept completion_tokens != --max-tokens",
    )

    p = sub.add_parser(
        "metrics",
        help="speculative-decoding counters and acceptance from GET /metrics",
        description=(
            f"GET /metrics and sum {', '.join(SPEC_METRICS)} over their label sets. "
            "acceptance_rate = accepted / draft tokens; mean_acceptance_length = 1 + "
            "accepted / drafts (tokens per verifier step, vLLM's definition). Exit 1 with "
            "--require-spec-decode when the counters are absent."
        ),
    )
    common(p, model=False)
    p.add_argument(
        "--require-spec-decode",
        action="store_true",
        help="fail unless the spec-decode counters are present and drafts > 0",
    )

    p = sub.add_parser(
        "greedy",
        help="temperature-0 outputs (token ids when available) per prompt",
        description=(
            "Temperature-0 chat completion for each --prompt, asking for token ids "
            "(return_token_ids) and falling back to text when the server does not return them."
        ),
    )
    common(p, model=True)
    p.add_argument(
        "--prompt", action="append", required=True, help="user message (repeat for several)"
    )
    p.add_argument("--max-tokens", type=int, default=32, help="token limit (default %(default)s)")

    p = sub.add_parser(
        "auth",
        help="the server must refuse requests without its API key (HTTP 401)",
        description=(
            f"POST {AUTH_PATH} (1 token) once without any API key and once with a wrong one; "
            f"exit 1 unless both get HTTP {REFUSED}. Needs no key: neither request carries it."
        ),
    )
    common(p, model=True, api_key=False)
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "max_tokens", 1) < 1:
        parser.error("--max-tokens must be at least 1")
    if args.timeout <= 0:
        parser.error("--timeout must be positive")
    try:
        key = api_key_from_env(getattr(args, "api_key_env", None))
        client = Client(args.url, key, timeout=args.timeout)
        if args.command == "chat":
            result = check_chat(
                client,
                args.model,
                args.prompt,
                args.max_tokens,
                require_length=not args.allow_stop,
                require_exact_tokens=not args.allow_fewer_tokens,
            )
            if not result["ok"]:
                print(json.dumps(result, sort_keys=True))
                print(f"error: chat check failed: {result['error']}", file=sys.stderr)
                return EXIT_FAILURE
        elif args.command == "metrics":
            result = read_metrics(client)
            if args.require_spec_decode and not (
                result["spec_decode_metrics_present"] and result["num_drafts"]
            ):
                result["ok"] = False
                result["error"] = "no speculative decoding recorded (counters absent or 0 drafts)"
                print(json.dumps(result, sort_keys=True))
                print(f"error: {result['error']}", file=sys.stderr)
                return EXIT_FAILURE
            result["ok"] = True
        elif args.command == "auth":
            result = check_api_key_enforced(args.url, args.model, timeout=args.timeout)
            if not result["ok"]:
                print(json.dumps(result, sort_keys=True))
                print(f"error: {result['error']}", file=sys.stderr)
                return EXIT_FAILURE
        else:
            outputs = greedy(client, args.model, args.prompt, args.max_tokens)
            result = {"ok": True, "max_tokens": args.max_tokens, "outputs": outputs}
    except CheckError as exc:
        print(json.dumps({"ok": False, "error": str(exc)}))
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
