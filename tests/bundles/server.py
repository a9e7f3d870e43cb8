"""A real HTTP server on 127.0.0.1 for bundle tests: Range support and injectable faults.

`MirrorServer(root)` serves a mirror folder from a background thread. Faults, set per test:
`truncate_after` (send only that many body bytes of a bundle archive, then close; `truncate_times`
limits how many responses are cut), `throttle_bps` (slow bundle downloads to a crawl, for the
killed-install test), `fail_status` (answer bundle requests with this HTTP status, `fail_times`
times), `ranges = False` (ignore Range headers, like a server without range support),
`wrong_range = True` (answer every bundle request with 206 and a Content-Range one byte later
than asked), `catalog_failures` (answer that many release-catalog requests with HTTP 503),
`require_query` (answer HTTP 403 to a request whose query string is not this one, like a
token-authenticated mirror). Every request is logged as (path, Range header).
"""

from __future__ import annotations

import os
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class _Handler(SimpleHTTPRequestHandler):
    server: _Server

    def log_message(self, format, *args):  # keep test output clean
        pass

    def do_GET(self):
        state = self.server.state
        state.requests.append((self.path, self.headers.get("Range")))
        if state.require_query is not None and self.path.partition("?")[2] != state.require_query:
            self.send_error(403)
            return
        path = Path(self.translate_path(self.path))
        if self.path.endswith("catalog.toml") and state.catalog_failures > 0:
            state.catalog_failures -= 1
            self.send_error(503)
            return
        if "/bundles/" in self.path and state.fail_status and state.fail_times != 0:
            state.fail_times -= 1
            self.send_error(state.fail_status)
            return
        if not path.is_file():
            self.send_error(404)
            return
        size = path.stat().st_size
        start = 0
        status = 200
        range_header = self.headers.get("Range")
        if range_header and range_header.startswith("bytes=") and state.ranges:
            first = range_header[6:].split("-")[0]
            start = int(first) if first.isdigit() else 0
            if start >= size:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.end_headers()
                return
            status = 206
        is_bundle = "/bundles/" in self.path
        if is_bundle and state.wrong_range:
            start, status = min(start + 1, size), 206
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(size - start))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        limit = size - start
        if is_bundle and state.truncate_after is not None and state.truncate_times != 0:
            limit = min(limit, state.truncate_after)
            state.truncate_times -= 1
        with path.open("rb") as handle:
            handle.seek(start)
            sent = 0
            while sent < limit:
                step = min(limit - sent, state.chunk if is_bundle else 65536)
                block = handle.read(step)
                if not block:
                    break
                try:
                    self.wfile.write(block)
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    return
                sent += len(block)
                if is_bundle and state.throttle_bps:
                    time.sleep(len(block) / state.throttle_bps)
        if sent < size - start:
            self.close_connection = True


class _State:
    def __init__(self) -> None:
        self.requests: list[tuple[str, str | None]] = []
        self.truncate_after: int | None = None
        self.truncate_times: int = -1  # -1: every response
        self.throttle_bps: float | None = None
        self.chunk = 65536
        self.ranges = True
        self.wrong_range = False
        self.fail_status: int | None = None
        self.fail_times: int = -1  # -1: every request
        self.catalog_failures: int = 0
        self.require_query: str | None = None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    state: _State


class MirrorServer:
    def __init__(self, root: Path) -> None:
        root = Path(root)

        class Handler(_Handler):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, directory=os.fspath(root), **kwargs)

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._server.state = _State()
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def state(self) -> _State:
        return self._server.state

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> MirrorServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
