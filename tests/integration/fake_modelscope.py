"""A small ModelScope hub on 127.0.0.1 serving model directories from disk.

It speaks the part of ModelScope's HTTP API that modelscope 1.37.0's
``snapshot_download(model_id, revision=..., cache_dir=..., endpoint=...)`` uses (read from
modelscope/hub/snapshot_download.py, file_download.py and api.py):

* ``GET /api/v1/models/<owner>/<name>/revisions``: ``HubApi.get_valid_revision_detail``
  reads ``Data.RevisionMap.{Branches,Tags}``; each entry needs ``Revision`` and
  ``CreatedAt`` (the cache writes both to its ``.mv`` file). One branch, ``master``, no tags.
* ``GET /api/v1/models/<owner>/<name>/repo/files?Revision=..&Recursive=..[&Root=..]``:
  ``HubApi.get_model_files`` reads ``Data.Files``; the download uses each file's ``Path``,
  ``Name``, ``Type`` (``blob``/``tree``), ``Size`` (how many bytes to fetch, and the Range end),
  ``Sha256`` (checked after the download; with a mismatch the file is fetched again) and
  ``Revision`` (the commit id the local cache keys files by).
* ``GET /api/v1/models/<owner>/<name>/repo?Revision=..&FilePath=..``: the file's bytes.
  modelscope always sends ``Range: bytes=<start>-<size-1>`` (start > 0 when it resumes a
  partial file left in ``<cache>/._____temp``); answered with 206 and Content-Range.
* ``GET /api/v1/models/<owner>/<name>[?Revision=..]``: the model's info (``HubApi.get_model``,
  and ``repo_exists`` when MODELSCOPE_DOMAIN picks the endpoint). snapshot_download does not
  call it when an ``endpoint`` is given; served for completeness.

The layout under ``root`` is ``<owner>/<name>/<files...>``. A model's commit id is derived
from its files (path + sha256), so changed content is a new revision.

Test hooks: every request is recorded (``records``: method, URL path, query, model, kind,
file, Range, status, bytes sent, Authorization/Cookie headers); ``fail_part_way(model_id,
path, times)`` makes the next ``times`` downloads of that file send only the first half of
the requested bytes (with the full Content-Length) and then close the connection, so the
client sees an incomplete read; later requests succeed.

Standard library only. In a test::

    with FakeModelScope(root) as hub:
        ... snapshot_download("Qwen/Qwen3-8B", endpoint=hub.url, cache_dir=...) ...

or from a shell (prints the port, serves until interrupted or --lifetime seconds)::

    python fake_modelscope.py --root DIR --port 0
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import signal
import socket
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Optional
from urllib.parse import parse_qs, unquote, urlsplit

API_PREFIX = "/api/v1/models/"
BRANCH = "master"
# CreatedAt of the served revision (modelscope compares it with its release date only when
# a revision is not given; any past time works).
CREATED_AT = 1_700_000_000
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


@dataclass
class RequestRecord:
    """One request the hub answered."""

    method: str
    path: str
    query: dict[str, str]
    kind: str  # model | revisions | files | file | unknown
    model_id: Optional[str] = None
    file: Optional[str] = None
    range: Optional[str] = None
    status: int = 0
    bytes_sent: int = 0
    cut_short: bool = False
    authorization: Optional[str] = None
    cookie: Optional[str] = None
    time: float = field(default_factory=time.time)


def _file_entry(model_dir: Path, path: Path, commit: str) -> dict[str, Any]:
    data = path.read_bytes()
    rel = path.relative_to(model_dir).as_posix()
    return {
        "Name": path.name,
        "Path": rel,
        "Type": "blob",
        "Size": len(data),
        "Sha256": hashlib.sha256(data).hexdigest(),
        "Revision": commit,
        "Mode": "33188",
        "IsLFS": rel.endswith(".safetensors"),
        "CommitMessage": "served by fake_modelscope",
        "CommittedDate": CREATED_AT,
    }


class FakeModelScope:
    """The hub: start()/stop() or a context manager; ``url`` is the endpoint to give modelscope."""

    def __init__(self, root: Path, port: int = 0) -> None:
        self.root = Path(root)
        self._lock = threading.Lock()
        self.records: list[RequestRecord] = []
        self._failures: dict[tuple[str, str], int] = {}
        self._server = ThreadingHTTPServer(("127.0.0.1", port), self._handler_class())
        self._server.daemon_threads = True
        self._thread: Optional[threading.Thread] = None

    # -- lifecycle --------------------------------------------------------------------------
    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeModelScope:
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="fake-modelscope",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=10)
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> FakeModelScope:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- test hooks -------------------------------------------------------------------------
    def fail_part_way(self, model_id: str, path: str, times: int) -> None:
        """The next `times` downloads of model_id's `path` send half the bytes, then close."""
        with self._lock:
            self._failures[(model_id, path)] = times

    def clear_failures(self) -> None:
        with self._lock:
            self._failures.clear()

    def pending_failures(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return {key: left for key, left in self._failures.items() if left > 0}

    def reset(self) -> None:
        """Forget recorded requests and injected failures."""
        with self._lock:
            self.records.clear()
            self._failures.clear()

    def snapshot(self) -> list[RequestRecord]:
        with self._lock:
            return list(self.records)

    def downloads(
        self, model_id: Optional[str] = None, file: Optional[str] = None
    ) -> list[RequestRecord]:
        """File requests (kind 'file'), optionally of one model and one file."""
        return [
            r
            for r in self.snapshot()
            if r.kind == "file"
            and (model_id is None or r.model_id == model_id)
            and (file is None or r.file == file)
        ]

    def counts(self) -> Counter[str]:
        """Requests per URL path (the file endpoint's path names the file: '...repo:FILE')."""
        counted: Counter[str] = Counter()
        for r in self.snapshot():
            counted[f"{r.path}:{r.file}" if r.kind == "file" else r.path] += 1
        return counted

    def records_as_dicts(self) -> list[dict[str, Any]]:
        return [asdict(r) for r in self.snapshot()]

    def _take_failure(self, model_id: str, path: str) -> bool:
        with self._lock:
            left = self._failures.get((model_id, path), 0)
            if left <= 0:
                return False
            self._failures[(model_id, path)] = left - 1
            return True

    def _record(self, record: RequestRecord) -> None:
        with self._lock:
            self.records.append(record)

    # -- the model repository on disk ---------------------------------------------------------
    def model_dir(self, model_id: str) -> Optional[Path]:
        parts = model_id.split("/")
        if len(parts) != 2 or any(p in ("", ".", "..") for p in parts):
            return None
        path = self.root / parts[0] / parts[1]
        return path if path.is_dir() else None

    @staticmethod
    def files_of(model_dir: Path) -> list[Path]:
        return sorted(p for p in model_dir.rglob("*") if p.is_file())

    def commit_of(self, model_dir: Path) -> str:
        digest = hashlib.sha1(usedforsecurity=False)
        for path in self.files_of(model_dir):
            digest.update(path.relative_to(model_dir).as_posix().encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
        return digest.hexdigest()

    # -- HTTP ---------------------------------------------------------------------------------
    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(_Handler):
            pass

        Handler.hub = hub
        return Handler


class _Handler(BaseHTTPRequestHandler):
    hub: FakeModelScope
    protocol_version = "HTTP/1.1"
    server_version = "fake-modelscope/1.37"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass  # requests are in hub.records

    def do_GET(self) -> None:
        self._serve(head=False)

    def do_HEAD(self) -> None:
        self._serve(head=True)

    # -- routing ------------------------------------------------------------------------------
    def _serve(self, head: bool) -> None:
        url = urlsplit(self.path)
        path = unquote(url.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        record = RequestRecord(
            method=self.command,
            path=path,
            query=query,
            kind="unknown",
            range=self.headers.get("Range"),
            authorization=self.headers.get("Authorization"),
            cookie=self.headers.get("Cookie"),
        )
        try:
            if not path.startswith(API_PREFIX):
                self._error(record, HTTPStatus.NOT_FOUND, f"no such endpoint: {path}", head)
                return
            parts = path[len(API_PREFIX) :].strip("/").split("/")
            if len(parts) < 2:
                self._error(record, HTTPStatus.NOT_FOUND, f"no such endpoint: {path}", head)
                return
            model_id, rest = "/".join(parts[:2]), parts[2:]
            record.model_id = model_id
            model_dir = self.hub.model_dir(model_id)
            if rest == []:
                record.kind = "model"
            elif rest == ["revisions"]:
                record.kind = "revisions"
            elif rest == ["repo", "files"]:
                record.kind = "files"
            elif rest == ["repo"]:
                record.kind = "file"
                record.file = query.get("FilePath")
            else:
                self._error(record, HTTPStatus.NOT_FOUND, f"no such endpoint: {path}", head)
                return
            if model_dir is None:
                self._error(record, HTTPStatus.NOT_FOUND, f"model {model_id} not found", head)
                return
            commit = self.hub.commit_of(model_dir)
            revision = query.get("Revision")
            if record.kind in ("files", "file") and revision not in (None, BRANCH, commit):
                self._error(
                    record,
                    HTTPStatus.NOT_FOUND,
                    f"model {model_id} has no revision {revision}",
                    head,
                )
                return
            if record.kind == "model":
                self._json(record, self._model_info(model_id, commit), head)
            elif record.kind == "revisions":
                self._json(record, self._revisions(commit), head)
            elif record.kind == "files":
                self._json(record, self._files(model_dir, commit, query), head)
            else:
                self._file(record, model_id, model_dir, head)
        finally:
            self.hub._record(record)

    # -- endpoints ----------------------------------------------------------------------------
    @staticmethod
    def _model_info(model_id: str, commit: str) -> dict[str, Any]:
        owner, name = model_id.split("/")
        return {
            "Id": int(commit[:6], 16),
            "Name": name,
            "Path": owner,
            "ChineseName": "",
            "Revision": BRANCH,
            "LatestCommitId": commit,
            "CreatedTime": CREATED_AT,
            "LastUpdatedTime": CREATED_AT,
        }

    @staticmethod
    def _revisions(commit: str) -> dict[str, Any]:
        branch = {
            "Revision": BRANCH,
            "CommitId": commit,
            "CreatedAt": CREATED_AT,
            "Message": "served by fake_modelscope",
        }
        return {"RevisionMap": {"Branches": [branch], "Tags": []}}

    def _files(self, model_dir: Path, commit: str, query: dict[str, str]) -> dict[str, Any]:
        recursive = query.get("Recursive", "False").lower() == "true"
        root = query.get("Root", "").strip("/")
        base = model_dir / root if root else model_dir
        entries: list[dict[str, Any]] = []
        if base.is_dir():
            if recursive:
                entries = [_file_entry(model_dir, p, commit) for p in self.hub.files_of(base)]
            else:
                for child in sorted(base.iterdir()):
                    if child.is_dir():
                        rel = child.relative_to(model_dir).as_posix()
                        entries.append({"Name": child.name, "Path": rel, "Type": "tree", "Size": 0})
                    elif child.is_file():
                        entries.append(_file_entry(model_dir, child, commit))
        return {"Files": entries, "LatestCommitter": None}

    def _file(self, record: RequestRecord, model_id: str, model_dir: Path, head: bool) -> None:
        rel = record.file or ""
        target = (model_dir / rel).resolve()
        if not rel or model_dir.resolve() not in target.parents or not target.is_file():
            self._error(record, HTTPStatus.NOT_FOUND, f"{model_id} has no file {rel!r}", head)
            return
        data = target.read_bytes()
        size = len(data)
        start, end, status = 0, size - 1, HTTPStatus.OK
        if record.range:
            match = _RANGE.match(record.range.strip())
            if match is None or (not match.group(1) and not match.group(2)):
                self._error(record, HTTPStatus.BAD_REQUEST, f"bad Range {record.range!r}", head)
                return
            if match.group(1):
                start = int(match.group(1))
                end = min(int(match.group(2)), size - 1) if match.group(2) else size - 1
            else:  # suffix range: the last N bytes
                start = max(size - int(match.group(2)), 0)
            if start >= size or start > end:
                record.status = HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE
                self.send_response(record.status)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = HTTPStatus.PARTIAL_CONTENT
        body = data[start : end + 1] if size else b""
        record.status = status
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        if status == HTTPStatus.PARTIAL_CONTENT:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.end_headers()
        if head:
            return
        if body and self.hub._take_failure(model_id, rel):
            # Fail part-way: half the promised bytes, then the connection goes away.
            half = body[: len(body) // 2]
            self.wfile.write(half)
            self.wfile.flush()
            record.bytes_sent, record.cut_short = len(half), True
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        self.wfile.write(body)
        record.bytes_sent = len(body)

    # -- responses ----------------------------------------------------------------------------
    def _json(self, record: RequestRecord, data: Any, head: bool) -> None:
        payload = {
            "Code": 200,
            "Success": True,
            "Message": "success",
            "RequestId": uuid.uuid4().hex,
            "Data": data,
        }
        self._send_json(record, HTTPStatus.OK, payload, head)

    def _error(self, record: RequestRecord, status: HTTPStatus, message: str, head: bool) -> None:
        payload = {
            "Code": int(status),
            "Success": False,
            "Message": message,
            "RequestId": uuid.uuid4().hex,
        }
        self._send_json(record, status, payload, head)

    def _send_json(
        self, record: RequestRecord, status: HTTPStatus, payload: dict[str, Any], head: bool
    ) -> None:
        body = json.dumps(payload).encode()
        record.status = int(status)
        self.send_response(status)
        self.send_header("Content-Type", "application/json;charset=UTF-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)
            record.bytes_sent = len(body)


def _parse_failure(text: str) -> tuple[str, str, int]:
    """OWNER/NAME:PATH:TIMES -> (model_id, path, times)."""
    model_id, path, times = text.rsplit(":", 2)
    return model_id, path, int(times)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        description="Serve model directories (ROOT/<owner>/<name>/...) through the part of "
        "ModelScope's API that snapshot_download uses, on 127.0.0.1."
    )
    parser.add_argument("--root", type=Path, required=True, help="directory of <owner>/<name>/")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (printed)")
    parser.add_argument(
        "--fail-part-way",
        action="append",
        default=[],
        metavar="OWNER/NAME:PATH:TIMES",
        help="the first TIMES downloads of PATH send half the bytes, then close the connection",
    )
    parser.add_argument(
        "--lifetime", type=float, default=3600.0, help="stop after this many seconds"
    )
    args = parser.parse_args(argv)
    hub = FakeModelScope(args.root, args.port)
    for spec in args.fail_part_way:
        hub.fail_part_way(*_parse_failure(spec))
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    with hub:
        print(hub.port, flush=True)
        stop.wait(args.lifetime)
    for line in hub.records_as_dicts():
        print(json.dumps(line), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
