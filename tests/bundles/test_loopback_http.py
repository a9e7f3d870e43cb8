"""The plain-socket HTTP/1.1 client for mirrors on this machine (`LoopbackHttpSource`): each
framing a static server may use (Content-Length, chunked, until close), interim 1xx answers,
and answers outside its bounds, which are transient errors (retried, then a clear DllmError)."""

from __future__ import annotations

import socket
import threading

import pytest

from turbo_dllm.bundles.sources import LoopbackHttpSource, TransientError
from turbo_dllm.errors import DllmError


class CannedServer:
    """A loopback TCP server that answers every connection with `answer` and closes it; keeps
    the requests it read."""

    def __init__(self, answer: bytes) -> None:
        self.answer, self.requests = answer, []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                request = b""
                while b"\r\n\r\n" not in request:
                    request += conn.recv(4096)
                self.requests.append(request.decode("latin-1"))
                conn.sendall(self.answer)

    def __enter__(self) -> CannedServer:
        return self

    def __exit__(self, *exc) -> None:
        self.sock.close()


def body_of(answer: bytes, path: str = "f.bin") -> tuple[bytes, int | None, list[str]]:
    with CannedServer(answer) as server:
        opened = LoopbackHttpSource(server.url).open(path)
        try:
            return b"".join(opened.chunks), opened.total, server.requests
        finally:
            opened.close()


def test_content_length_chunked_and_close_delimited_bodies():
    data = bytes(range(256)) * 40
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
    body, total, requests = body_of(head + b"Content-Length: 10240\r\n\r\n" + data)
    assert (body, total) == (data, len(data))
    assert requests[0].startswith("GET /f.bin HTTP/1.1\r\n") and "Connection: close" in requests[0]
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (data[:1000], data[1000:]))
    body, total, _ = body_of(head + b"Transfer-Encoding: chunked\r\n\r\n" + chunked + b"0\r\n\r\n")
    assert (body, total) == (data, None)
    body, total, _ = body_of(b"HTTP/1.0 200 OK\r\n\r\n" + data)  # ends with the connection
    assert (body, total) == (data, None)
    interim = b"HTTP/1.1 100 Continue\r\n\r\n"
    assert body_of(interim + head + b"Content-Length: 3\r\n\r\nabc")[0] == b"abc"


def test_a_path_with_spaces_is_quoted():
    assert body_of(b"HTTP/1.0 200 OK\r\n\r\nx", "a b/c.bin")[2][0].startswith("GET /a%20b/c.bin ")


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        (b"SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP/1.x status line"),
        (b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 101 + b"\r\n", "more than 100 headers"),
        (b"HTTP/1.1 200 OK\r\nX: " + b"y" * 70000 + b"\r\n\r\n", "longer than 65536 bytes"),
        (b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n", "malformed header line"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", "two different"),
        (b"HTTP/1.1 200 OK\r\nContent-Le", "closed in the header line"),
    ],
    ids=["not-http", "header-count", "long-line", "no-colon", "two-lengths", "cut-head"],
)
def test_answers_outside_the_bounds_are_transient_errors(answer, problem):
    with CannedServer(answer) as server, pytest.raises(TransientError, match=problem):
        LoopbackHttpSource(server.url).open("f.bin")


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", "body ended 7 bytes short"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\nabc", "is not a number"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "malformed chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n", "longer than"),
    ],
    ids=["short", "bad-length", "bad-chunk-size", "long-chunk"],
)
def test_broken_bodies_are_transient_errors(answer, problem):
    with CannedServer(answer) as server:
        opened = LoopbackHttpSource(server.url).open("f.bin")
        with pytest.raises(TransientError, match=f"transfer broke off: .*{problem}"):
            b"".join(opened.chunks)
        opened.close()


def test_a_server_that_keeps_answering_badly_ends_in_a_clear_error():
    with CannedServer(b"garbage\r\n\r\n") as server, pytest.raises(DllmError, match="cannot fetch"):
        LoopbackHttpSource(server.url).read_small("f.bin", 1000, retries=1, backoff_s=0.01)
