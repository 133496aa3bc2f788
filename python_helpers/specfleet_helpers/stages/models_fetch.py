"""Download a model snapshot from ModelScope (or an internal ModelScope mirror).

Makes the runbook's own call, `snapshot_download(model_id)` with no `cache_dir`, with
MODELSCOPE_CACHE set to the cache given: modelscope 1.37.0 then keeps the model where the
runbook's call keeps it, `<cache>/models/<org>/<name>` (`~/.cache/modelscope/hub/models/...`
by default), so a model a host already downloaded by following the runbook is reused, and a
model downloaded here is found by the runbook's commands and by vLLM with VLLM_USE_MODELSCOPE.
(With `cache_dir=<cache>` modelscope uses `<cache>/<org>/<name>`, without `models/`: a copy that
older specfleet releases left there is moved into the runbook's layout first, not fetched again.)

snapshot_download keeps completed files and fetches only what is missing, so re-running after
an interrupted download resumes it. The role gets one JSON line back with the local path. The
access token, when one is needed, is read from the MODELSCOPE_API_TOKEN environment variable
(never from argv, which shows up in process lists).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Optional

# modelscope 1.37.0: the model store under MODELSCOPE_CACHE (file_utils.get_model_cache_root),
# the index file of a model's cached files (caching.FileSystemCache.KEY_FILE_NAME), and the
# on-disk name of a model whose name has dots (model_id_to_group_owner_name + '.' -> '___').
MODEL_STORE = "models"
CACHE_INDEX = ".msc"


def stored_name(model_id: str) -> tuple[str, str]:
    org, _, name = model_id.partition("/")
    return org, name.replace(".", "___")


def runbook_path(cache: Path, model_id: str) -> Path:
    """Where the runbook's snapshot_download(model_id) keeps it, with MODELSCOPE_CACHE=cache."""
    return cache.joinpath(MODEL_STORE, *stored_name(model_id))


def adopt_legacy_copy(cache: Path, model_id: str) -> Optional[Path]:
    """Move a `cache_dir=<cache>` download (`<cache>/<org>/<name>`) into the runbook's layout.

    Only a directory modelscope indexed (its .msc file) is moved, and only when the runbook's
    place is free; the move keeps modelscope's index, so nothing is fetched again. Returns the
    directory moved, or None.
    """
    org, name = stored_name(model_id)
    legacy = cache / org / name
    target = runbook_path(cache, model_id)
    if legacy.is_symlink() or not (legacy / CACHE_INDEX).is_file() or os.path.lexists(target):
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    os.rename(legacy, target)
    # A dotted name also had a link by its real name (snapshot_download makes one); it now
    # points nowhere, and snapshot_download makes the new one beside the moved directory.
    link = cache / model_id
    if link.is_symlink() and not link.exists():
        link.unlink()
    return legacy


def fetch(model_id: str, revision: str, cache: str, endpoint: Optional[str]) -> str:
    cache = os.path.abspath(os.path.expanduser(cache))
    # Read by modelscope when it is called (get_modelscope_cache_dir), not only at import.
    os.environ["MODELSCOPE_CACHE"] = cache
    from modelscope.hub.snapshot_download import snapshot_download  # noqa: PLC0415

    moved = adopt_legacy_copy(Path(cache), model_id)
    if moved:
        print(f"moved {moved} to {runbook_path(Path(cache), model_id)}", file=sys.stderr)
    kwargs = {"revision": revision}
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
        prog="python -m specfleet_helpers.stages.models_fetch",
        description=(
            "Download a ModelScope model snapshot the way the runbook does (into"
            " <cache>/models/<org>/<name>); print its local path as JSON."
        ),
    )
    parser.add_argument("--model-id", required=True, help="e.g. Qwen/Qwen3-8B")
    parser.add_argument("--revision", default="master", help="branch, tag or commit")
    parser.add_argument(
        "--cache-dir",
        required=True,
        help="modelscope's cache (MODELSCOPE_CACHE), e.g. ~/.cache/modelscope/hub",
    )
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
