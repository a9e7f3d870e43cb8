"""`dllm mirror serve`: the mirror folder over HTTP, for pip, uv and `dllm bundle install`.

A threaded `http.server` (one thread per connection, so a slow bundle download does not block
the index) that serves files and folder `index.html` pages only, no listings, with content types
pip and uv expect and single-range `Range` requests (206), so an interrupted bundle download
resumes. Nothing outside the folder is served, a symbolic link out of it included (404), a
client that goes away mid-transfer is a log line, and one that sends or reads nothing for
`IDLE_TIMEOUT_S` is disconnected (its thread would otherwise wait forever). Binds to 127.0.0.1
unless told otherwise: expose it to a cluster on purpose.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import socket
import sys
import threading
from functools import partial
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from turbo_dllm.errors import DllmError
from turbo_dllm.mirror.layout import mirror_folder

__all__ = ["MirrorServer", "MirrorRequestHandler"]

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
# A connection that moves no byte for this long is dropped (a resumable download resumes).
IDLE_TIMEOUT_S = 60.0


class MirrorRequestHandler(SimpleHTTPRequestHandler):
    extensions_map = {
        "": "application/octet-stream",
        ".html": "text/html; charset=utf-8",
        ".json": "application/json",
        ".toml": "application/toml",
        ".lock": "text/plain; charset=utf-8",
        ".whl": "application/octet-stream",
        ".zst": "application/zstd",
        ".sha256": "text/plain; charset=utf-8",
    }
    server_version = "dllm-mirror"
    quiet = False
    # socketserver's per-connection socket timeout; http.server logs "Request timed out" and
    # closes the connection when a read or a write of the request waits longer
    timeout = IDLE_TIMEOUT_S

    def list_directory(self, path):  # no listings: a mirror is its index pages
        self.send_error(HTTPStatus.NOT_FOUND, "not found")
        return None

    def log_message(self, format: str, *args) -> None:
        if not self.quiet:
            sys.stderr.write(f"{self.address_string()} {format % args}\n")

    _advertised_ranges = False

    def handle(self) -> None:
        """A client that goes away mid-transfer (pip or uv cancelled, a node rebooted, a resumable
        download cut) is routine: one log line, not socketserver's traceback on stderr."""
        try:
            super().handle()
        except ConnectionError as error:
            where = getattr(self, "path", "") or "-"
            self.log_message("%s: client went away (%s)", where, error.strerror or error)

    def _outside(self, path: str) -> bool:
        """Whether serving `path` would read a file outside the mirror folder: through a symbolic
        link there (translate_path already drops `..` and encoded separators)."""
        root = os.path.realpath(self.directory)
        paths = [path, os.path.join(path, "index.html")] if os.path.isdir(path) else [path]
        for candidate in paths:
            real = os.path.realpath(candidate)
            if real != root and not real.startswith(root.rstrip(os.sep) + os.sep):
                return True
        return False

    def send_head(self):
        self._remaining = None
        header = self.headers.get("Range")
        path = self.translate_path(self.path)
        if "\x00" in path:  # else a ValueError from open(): no answer, and a traceback
            self.send_error(HTTPStatus.BAD_REQUEST, "NUL in the path")
            return None
        if self._outside(path):
            self.send_error(HTTPStatus.NOT_FOUND, "not found")
            return None
        if not header or not os.path.isfile(path):
            return super().send_head()
        match = _RANGE.match(header.strip())
        size = os.path.getsize(path)
        if not match or (not match[1] and not match[2]):
            return super().send_head()  # a form we do not serve partially: whole file
        if match[1]:
            start = int(match[1])
            end = min(int(match[2]), size - 1) if match[2] else size - 1
        else:  # suffix range: the last N bytes
            start, end = max(size - int(match[2]), 0), size - 1
        if start >= size or start > end:
            self.send_response(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        handle = open(path, "rb")  # noqa: SIM115 - closed by copyfile's caller (do_GET)
        handle.seek(start)
        self.send_response(HTTPStatus.PARTIAL_CONTENT)
        self.send_header("Content-Type", self.guess_type(path))
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        self._remaining = end - start + 1
        return handle

    def end_headers(self) -> None:
        if not self._advertised_ranges:  # tell resuming clients that Range works
            self.send_header("Accept-Ranges", "bytes")
            self._advertised_ranges = True
        super().end_headers()

    def copyfile(self, source, outputfile) -> None:
        """The file's bytes (or the requested range's) straight from the page cache to the
        socket (`sendfile`: no copy through Python, as nginx serves). The headers are already
        out: `wfile` is unbuffered."""
        remaining = getattr(self, "_remaining", None)
        self._remaining = None
        offset = source.tell()
        if remaining is None:
            remaining = os.fstat(source.fileno()).st_size - offset
        if remaining > 0:
            self.connection.sendfile(source, offset, remaining)


def _server_class(host: str, port: int) -> type[ThreadingHTTPServer]:
    """The server for `host`'s address family: IPv4 where the host has an IPv4 address (so
    `localhost` stays 127.0.0.1), else IPv6 (`::1`, `::`; `::` also takes IPv4 clients where
    the system allows). A host that does not resolve is left to bind() to report."""
    try:
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except (socket.gaierror, UnicodeError):
        return ThreadingHTTPServer
    families = [info[0] for info in infos]
    if socket.AF_INET in families or socket.AF_INET6 not in families:
        return ThreadingHTTPServer
    return _IPv6Server


class _IPv6Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6

    def server_bind(self) -> None:
        with contextlib.suppress(OSError, AttributeError):  # dual stack where there is one
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


def _listen_hint(error: OSError) -> str:
    """What to change when bind() refused: an address that is not this machine's got 'pass
    another --port'."""
    if isinstance(error, socket.gaierror) or error.errno == errno.EADDRNOTAVAIL:
        # a host name that does not resolve, or an address no interface of this machine has
        return "pass another --host: an address of this machine (127.0.0.1, or 0.0.0.0 for all)"
    if error.errno == errno.EACCES:
        return "ports below 1024 need privileges: pass --port 1024 or more (0: any free port)"
    return "pass another --port (0: any free port)"


class MirrorServer:
    """A running server for one mirror folder; `with MirrorServer(DIR) as s: s.url`."""

    def __init__(
        self, root: str | Path, host: str = "127.0.0.1", port: int = 0, quiet: bool = False
    ) -> None:
        # One that does not exist, a file and a URL are named as such (as `--mirror` names them).
        self.root = mirror_folder(root)
        if not 0 <= port <= 65535:  # else a traceback from bind()
            raise DllmError(
                f"--port must be 0-65535 (0: any free port), got {port}",
                hint="pass a free TCP port, or --port 0 and read the one chosen",
            )
        handler = type("Handler", (MirrorRequestHandler,), {"quiet": quiet})
        try:
            self.httpd = _server_class(host, port)(
                (host, port), partial(handler, directory=self.root)
            )
        except OSError as error:
            raise DllmError(
                f"cannot listen on {host}:{port}: {error}", hint=_listen_hint(error)
            ) from error
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        host = f"[{host}]" if ":" in str(host) else host
        return f"http://{host}:{port}"

    @property
    def client_url(self) -> str:
        """The URL other hosts use: a server on every interface (0.0.0.0, ::) is reached by
        this host's name, not by the wildcard address (which no other host can connect to)."""
        host, port = self.httpd.server_address[:2]
        if host in ("0.0.0.0", "::"):
            return f"http://{socket.gethostname()}:{port}"
        return self.url

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def start(self) -> MirrorServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> MirrorServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
