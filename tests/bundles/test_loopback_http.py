"""The loopback HTTP client against a real socket server that sends canned answers: the three
body framings, 1xx answers, and every malformed or cut-short answer refused as ProtocolError
(an OSError, which the download loop retries like a broken connection)."""

from __future__ import annotations

import hashlib
import os
import socket
import threading

import pytest

from turbo_dllm.bundles.fetch import download
from turbo_dllm.bundles.loopback_http import MAX_HEAD_BYTES, ProtocolError, get
from turbo_dllm.bundles.sources import LoopbackHttpSource
from turbo_dllm.errors import DllmError


class CannedServer:
    """Accepts connections on `host` (127.0.0.1) and answers each with the next canned reply
    (the last one repeats), then closes; records each request's head."""

    def __init__(self, *replies: bytes, host: str = "127.0.0.1") -> None:
        self.replies = list(replies)
        self.requests: list[bytes] = []
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.create_server((host, 0), family=family)
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with conn:
                head = b""
                while b"\r\n\r\n" not in head and (data := conn.recv(4096)):
                    head += data
                self.requests.append(head)
                reply = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
                conn.sendall(reply)

    def __enter__(self) -> CannedServer:
        return self

    def __exit__(self, *exc) -> None:
        self._listener.close()


def body_of(response, limit: int = 7) -> bytes:
    data = b""
    while block := response.read1(limit):
        data += block
    return data


def body_into(response, limit: int = 7) -> bytes:
    """The body through `readinto`, one reused buffer of `limit` bytes."""
    data, buffer = b"", memoryview(bytearray(limit))
    while got := response.readinto(buffer):
        data += buffer[:got]
    return data


def chunked(data: bytes, size: int = 5) -> bytes:
    parts = [
        b"%x;ext=1\r\n%s\r\n" % (len(data[i : i + size]), data[i : i + size])
        for i in range(0, len(data), size)
    ]
    return b"".join(parts) + b"0\r\nX-Trailer: yes\r\n\r\n"


DATA = b"block-diffusion bundles, sent three ways"


@pytest.mark.parametrize(
    "reply",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(DATA), DATA),
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n"
        + chunked(DATA),
        b"HTTP/1.0 200 OK\r\n\r\n" + DATA,  # framed by the close
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s"
        % (len(DATA), DATA),
    ],
    ids=["content-length", "chunked", "until-close", "after-100"],
)
@pytest.mark.parametrize("read", [body_of, body_into])
def test_bodies_in_every_framing(reply, read):
    with CannedServer(reply) as server:
        response = get("127.0.0.1", server.port, "/x", {"Range": "bytes=0-"}, 5, 5)
        assert response.status == 200
        assert read(response) == DATA
        assert response.read1(7) == b"" and response.readinto(memoryview(bytearray(7))) == 0
        response.close()
    request = server.requests[0].decode()
    assert request.startswith("GET /x HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{server.port}\r\n" in request and "Range: bytes=0-\r\n" in request


def test_headers_status_and_empty_bodies():
    reply = b"HTTP/1.1 404 Not Found\r\nX-A: 1\r\nx-a: 2\r\nContent-Length: 0\r\n\r\n"
    with CannedServer(reply) as server:
        response = get("127.0.0.1", server.port, "/", {}, 5, 5)
        assert (response.status, response.reason) == (404, "Not Found")
        assert response.header("X-A") == "1, 2" and response.header("missing") == ""
        assert response.read1(10) == b""
        response.close()


@pytest.mark.parametrize(
    "reply, message",
    [
        (b"SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP/1.x status line"),
        (b"HTTP/1.1 2000 OK\r\n\r\n", "not an HTTP/1.x status line"),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "malformed header line"),
        (b"HTTP/1.1 200 OK\r\n folded: x\r\n\r\n", "malformed header line"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -4\r\n\r\n", "bad Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\n", "two different"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", "unsupported Transfer-Encoding"),
        (b"HTTP/1.1 200 OK\r\nX: " + b"a" * (MAX_HEAD_BYTES + 10), "head is longer"),
        (b"HTTP/1.1 200 OK\r\nContent-Le", "closed before the answer's head ended"),
    ],
)
def test_malformed_heads_are_refused(reply, message):
    with CannedServer(reply) as server, pytest.raises(ProtocolError, match=message):
        get("127.0.0.1", server.port, "/", {}, 5, 5)


@pytest.mark.parametrize(
    "reply, message",
    [
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this",
            "91 bytes before the body's end",
        ),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size"),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabcdeXX",
            "not followed by CRLF",
        ),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\nabc", "before a chunk's end"),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabcde\r\n",
            "inside the chunked",
        ),
    ],
)
@pytest.mark.parametrize("read", [body_of, body_into])
def test_bodies_cut_short_or_malformed_are_refused(reply, message, read):
    with CannedServer(reply) as server:
        response = get("127.0.0.1", server.port, "/", {}, 5, 5)
        with pytest.raises(ProtocolError, match=message):
            read(response)
        response.close()


@pytest.mark.parametrize("framing", ["content-length", "until-close"])
def test_readinto_receives_large_bodies_into_the_callers_buffer(framing):
    """Past what arrived with the head, the socket fills the caller's buffer itself; a body cut
    short is refused the same way."""
    data = os.urandom(700_000)
    length = b"Content-Length: %d\r\n" % len(data) if framing == "content-length" else b""
    reply = b"HTTP/1.1 200 OK\r\n" + length + b"\r\n" + data
    with CannedServer(reply) as server:
        response = get("127.0.0.1", server.port, "/", {}, 5, 5)
        assert body_into(response, 65536) == data
        response.close()
    if framing == "content-length":
        with CannedServer(reply[:-1000]) as server:
            response = get("127.0.0.1", server.port, "/", {}, 5, 5)
            with pytest.raises(ProtocolError, match="1000 bytes before the body's end"):
                body_into(response, 65536)
            response.close()


def test_a_silent_server_times_out():
    listener = socket.create_server(("127.0.0.1", 0))  # accepts (backlog) but never answers
    try:
        with pytest.raises(TimeoutError):
            get("127.0.0.1", listener.getsockname()[1], "/", {}, 5, 0.2)
    finally:
        listener.close()


def test_a_silent_index_names_its_timeout_attempts_and_deadline(monkeypatch):
    """The catalog fetch from a server that accepts and never answers waited 4 x 60 s, then
    said only "TimeoutError: timed out": not how long it waited, how often, or what bounds it."""
    from turbo_dllm.bundles import sources

    monkeypatch.setattr(sources, "READ_TIMEOUT_S", 0.2)
    listener = socket.create_server(("127.0.0.1", 0))  # accepts (backlog) but never answers
    source = LoopbackHttpSource(f"http://127.0.0.1:{listener.getsockname()[1]}")
    try:
        with pytest.raises(DllmError) as caught:
            source.read_small("releases/v1/catalog.toml", 1000, retries=1, backoff_s=0.01)
        assert caught.value.message == (
            f"cannot fetch {source.url('releases/v1/catalog.toml')} after 2 attempts: "
            "no answer within 0.2 s"
        )
        monkeypatch.setenv("DLLM_DOWNLOAD_DEADLINE_S", "0.5")
        with pytest.raises(DllmError) as caught:
            source.read_small("releases/v1/catalog.toml", 1000, retries=50, backoff_s=0.01)
        assert "within the 0.5 s transfer deadline" in caught.value.message
        assert "raise DLLM_DOWNLOAD_DEADLINE_S" in caught.value.hint
    finally:
        listener.close()


def test_download_through_a_chunked_mirror_then_one_that_cuts_off(tmp_path):
    """The install's download loop over this client: a chunked answer is a complete, verified
    file; an answer cut short is retried (the next attempt asks for the rest) until it gives up
    with the download's own error."""
    data = os.urandom(50_000)
    sha = hashlib.sha256(data).hexdigest()
    ok = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(data, 4096)
    with CannedServer(ok) as server:
        path = download(
            LoopbackHttpSource(f"http://127.0.0.1:{server.port}"), "bundles/b.bin", sha256=sha,
            size=len(data), dest_dir=tmp_path / "a", backoff_s=0.01,
        )  # fmt: skip
        assert path.read_bytes() == data
    cut = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data[:1000])
    with CannedServer(cut) as server, pytest.raises(DllmError, match="failed after 2 attempts"):
        download(
            LoopbackHttpSource(f"http://127.0.0.1:{server.port}"), "bundles/b.bin", sha256=sha,
            size=len(data), dest_dir=tmp_path / "b", retries=1, backoff_s=0.01,
        )  # fmt: skip
    assert len(server.requests) == 2
    assert b"Range: bytes=1000-" in server.requests[1]  # the second attempt resumed
    assert (tmp_path / "b" / f"{sha}.part").stat().st_size == 1000


def _ipv6_loopback() -> bool:
    try:
        socket.create_server(("::1", 0), family=socket.AF_INET6).close()
        return True
    except OSError:
        return False


@pytest.mark.parametrize("host", ["::1", "localhost"])
def test_ipv6_and_localhost_mirrors(tmp_path, host):
    """`http://[::1]:port` (the Host header brackets the address) and `http://localhost:port`
    (resolved by name)."""
    if host == "::1" and not _ipv6_loopback():
        pytest.skip("this host has no IPv6 loopback")
    data = os.urandom(1000)
    sha = hashlib.sha256(data).hexdigest()
    reply = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data)
    authority = f"[{host}]" if ":" in host else host
    with CannedServer(reply, host="::1" if host == "::1" else "127.0.0.1") as server:
        path = download(
            LoopbackHttpSource(f"http://{authority}:{server.port}"), "bundles/b.bin", sha256=sha,
            size=len(data), dest_dir=tmp_path, backoff_s=0.01,
        )  # fmt: skip
        assert path.read_bytes() == data
    assert f"Host: {authority}:{server.port}\r\n".encode() in server.requests[0]
