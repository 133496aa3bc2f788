"""Download a model snapshot from ModelScope (or an internal ModelScope mirror).

Wraps modelscope's `snapshot_download(model_id, revision=..., cache_dir=..., endpoint=...)`,
the runbook's download call, so the models role gets one JSON line back with the local path.
snapshot_download keeps completed files and fetches only what is missing, so re-running after
an interrupted download resumes it. The access token, when one is needed, is read from the
MODELSCOPE_API_TOKEN environment variable (never from argv, which shows up in process lists).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Optional


def fetch(model_id: str, revision: str, cache_dir: str, endpoint: Optional[str]) -> str:
    from modelscope.hub.snapshot_download import snapshot_download  # noqa: PLC0415

    kwargs = {"revision": revision, "cache_dir": cache_dir}
    if endpoint:
        kwargs["endpoint"] = endpoint
    token = os.environ.get("MODELSCOPE_API_TOKEN")
    if token:
        kwargs["token"] = token
        if endpoint:
            # modelscope 1.37 scopes the token's session cookie to its public domain, so a
            # mirror would never see it: send it as that mirror's cookie ourselves.
            from urllib.parse import urlsplit  # noqa: PLC0415

            from requests.cookies import RequestsCookieJar  # noqa: PLC0415

            jar = RequestsCookieJar()
            jar.set("m_session_id", token, domain=urlsplit(endpoint).hostname, path="/")
            kwargs["cookies"] = jar
    return snapshot_download(model_id, **kwargs)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specfleet_helpers.models_fetch",
        description="Download a ModelScope model snapshot; print its local path as JSON.",
    )
    parser.add_argument("--model-id", required=True, help="e.g. Qwen/Qwen3-8B")
    parser.add_argument("--revision", default="master", help="branch, tag or commit")
    parser.add_argument("--cache-dir", required=True, help="modelscope cache directory")
    parser.add_argument("--endpoint", default=None, help="ModelScope endpoint or internal mirror")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        path = fetch(args.model_id, args.revision, args.cache_dir, args.endpoint)
    except Exception as exc:  # noqa: BLE001 - report any download failure on one line
        print(
            f"download of {args.model_id}@{args.revision} failed: {type(exc).__name__}: {exc}",
            file=sys.stderr,
        )
        return 1
    print(
        json.dumps(
            {
                "model_id": args.model_id,
                "revision": args.revision,
                "path": path,
                "seconds": round(time.monotonic() - started, 1),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
