"""HTTP/1.1 GET over a plain socket, for bundle indexes served on this machine's loopback.

An install from a local mirror (`dllm mirror serve`, or any static server on 127.0.0.1) must
cost a fraction of a `pip install`. Importing the standard library's `http.client`, which pulls
in `email` and `ssl`, took ~14 ms of a ~0.14 s install of a 64 MiB bundle on a 2-core host:
the largest step after the transfer itself. A loopback mirror needs little of it: one GET, the
status and headers, and the body framed by Content-Length, by the chunked coding, or by the
connection's close. No TLS, proxies or redirects (a redirect is returned as its status, which
the caller reports); remote indexes go through `requests`.

The answer is untrusted: the head is capped (`MAX_HEAD_BYTES`, `MAX_HEADERS`), numbers are
checked, and a malformed answer or a body cut short raises `ProtocolError`, an `OSError` like
the socket's own failures, so callers treat all of them as a broken connection.
"""

from __future__ import annotations

import socket

__all__ = ["MAX_HEAD_BYTES", "MAX_HEADERS", "ProtocolError", "Response", "get"]

MAX_HEAD_BYTES = 64 * 1024  # status line and headers together
MAX_HEADERS = 128
MAX_LINE_BYTES = 8 * 1024  # a chunk-size or trailer line
_HEAD_READ = 64 * 1024
_HEX = frozenset(b"0123456789abcdefABCDEF")


class ProtocolError(OSError):
    """The server's answer is not well-formed HTTP/1.x, or its body ended early."""


def get(
    host: str,
    port: int,
    target: str,
    headers: dict[str, str],
    connect_timeout: float,
    read_timeout: float,
) -> Response:
    """Send `GET target` to `host:port` and read the answer's head; the body is left to read
    with `Response.read1` or `Response.readinto`. `read_timeout` bounds each read of the head
    and the body (change it with `Response.settimeout`)."""
    # Bytes, not str: getaddrinfo would import the idna codec (~1 ms) to encode a str host.
    sock = socket.create_connection((host.encode("ascii"), port), connect_timeout)
    try:
        sock.settimeout(read_timeout)
        authority = f"[{host}]" if ":" in host else host
        lines = [f"GET {target} HTTP/1.1", f"Host: {authority}:{port}", "Connection: close"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        return _read_answer(sock)
    except BaseException:
        sock.close()
        raise


class Response:
    """An answer whose head has been read: `status`, `reason`, `header(name)`, and the body
    through `read1` or `readinto`."""

    def __init__(
        self,
        sock: socket.socket,
        status: int,
        reason: str,
        headers: dict[str, str],
        rest: bytes,
    ) -> None:
        self.status, self.reason = status, reason
        self._sock, self._headers, self._buffer = sock, headers, rest
        self._chunked = self._chunks_done = False
        self._left: int | None = None  # body bytes still to come (of this chunk when chunked)
        coding = headers.get("transfer-encoding")
        if status < 200 or status in (204, 304):
            self._left = 0
        elif coding is not None:  # it overrides any Content-Length (RFC 9112, 6.3)
            if coding.lower() != "chunked":
                raise ProtocolError(f"unsupported Transfer-Encoding {coding!r}")
            self._chunked, self._left = True, 0
        elif "content-length" in headers:
            length = headers["content-length"]
            if not (length.isascii() and length.isdigit()) or len(length) > 19:
                raise ProtocolError(f"bad Content-Length {length[:40]!r}")
            self._left = int(length)

    def header(self, name: str) -> str:
        """The header's value ("" when absent); repeated headers are joined with ", "."""
        return self._headers.get(name.lower(), "")

    def settimeout(self, seconds: float) -> None:
        self._sock.settimeout(seconds)

    def read1(self, limit: int) -> bytes:
        """Up to `limit` bytes of the body, as much as has arrived (blocking only until some
        has); b"" once the body is complete."""
        if self._chunked:
            return self._read1_chunked(limit)
        if self._left == 0:
            return b""
        want = limit if self._left is None else min(limit, self._left)
        data = self._take(want) or self._sock.recv(want)
        self._count(len(data))
        return data

    def readinto(self, buffer: memoryview) -> int:
        """`read1` into `buffer` (at most its length): the number of bytes, 0 once the body
        is complete. The socket fills the buffer itself, so a reader that reuses its buffers
        allocates nothing per block."""
        if self._chunked or self._buffer:  # framing lines, or bytes read with the head: copied
            data = self.read1(len(buffer))
            buffer[: len(data)] = data
            return len(data)
        if self._left == 0:
            return 0
        want = len(buffer) if self._left is None else min(len(buffer), self._left)
        got = self._sock.recv_into(buffer, want)
        self._count(got)
        return got

    def _count(self, got: int) -> None:
        """Account for `got` body bytes just received (0: the connection closed)."""
        if not got:
            if self._left is None:  # framed by the close: this is the end
                self._left = 0
                return
            raise ProtocolError(f"the connection closed {self._left} bytes before the body's end")
        if self._left is not None:
            self._left -= got

    def close(self) -> None:
        self._sock.close()

    def _read1_chunked(self, limit: int) -> bytes:
        assert self._left is not None
        if self._left == 0:  # at a chunk's start
            if self._chunks_done:
                return b""
            size = self._line().partition(b";")[0].strip()  # chunk extensions are ignored
            if not size or len(size) > 16 or not _HEX.issuperset(size):
                raise ProtocolError(f"bad chunk size {size[:40]!r}")
            self._left = int(size, 16)
            if self._left == 0:
                for _ in range(MAX_HEADERS):  # trailers, up to the empty line
                    if not self._line():
                        break
                else:
                    raise ProtocolError(f"more than {MAX_HEADERS} trailer lines")
                self._chunks_done = True
                return b""
        data = self._take(min(limit, self._left)) or self._sock.recv(min(limit, self._left))
        if not data:
            raise ProtocolError(f"the connection closed {self._left} bytes before a chunk's end")
        self._left -= len(data)
        if self._left == 0:
            self._fill(2)
            if self._buffer[:2] != b"\r\n":
                raise ProtocolError("a chunk is not followed by CRLF")
            self._buffer = self._buffer[2:]
        return data

    def _take(self, n: int) -> bytes:
        """Up to `n` bytes already read past the head (b"" once they are used up)."""
        data, self._buffer = self._buffer[:n], self._buffer[n:]
        return data

    def _line(self) -> bytes:
        """The next CRLF-terminated line of the body (chunked framing), without its CRLF."""
        line, self._buffer = _split_at(
            self._sock,
            self._buffer,
            b"\r\n",
            too_long=f"a chunk line is longer than {MAX_LINE_BYTES} bytes",
            limit=MAX_LINE_BYTES,
            closed="the connection closed inside the chunked body",
        )
        return line

    def _fill(self, n: int) -> None:
        """Read until at least `n` bytes are buffered (chunked framing)."""
        while len(self._buffer) < n:
            data = self._sock.recv(_HEAD_READ)
            if not data:
                raise ProtocolError("the connection closed inside the chunked body")
            self._buffer += data


def _split_at(
    sock: socket.socket, buffer: bytes, marker: bytes, *, limit: int, too_long: str, closed: str
) -> tuple[bytes, bytes]:
    """(the bytes before `marker`, the bytes after it), reading from `sock` until it arrives;
    ProtocolError(`too_long`) once more than `limit` bytes came without it, ProtocolError(`closed`)
    when the connection closes first."""
    while (end := buffer.find(marker)) < 0:
        if len(buffer) > limit:
            raise ProtocolError(too_long)
        data = sock.recv(_HEAD_READ)
        if not data:
            raise ProtocolError(closed)
        buffer += data
    return buffer[:end], buffer[end + len(marker) :]


def _read_answer(sock: socket.socket) -> Response:
    """Read heads until a final (non-1xx) one; return it with the bytes read past it."""
    buffer = b""
    while True:
        head, buffer = _split_at(
            sock,
            buffer,
            b"\r\n\r\n",
            limit=MAX_HEAD_BYTES,
            too_long=f"the answer's head is longer than {MAX_HEAD_BYTES} bytes",
            closed="the connection closed before the answer's head ended",
        )
        status, reason, headers = _parse_head(head)
        if not 100 <= status < 200:
            return Response(sock, status, reason, headers, buffer)


def _parse_head(head: bytes) -> tuple[int, str, dict[str, str]]:
    status_line, *lines = head.split(b"\r\n")
    version, _, rest = status_line.partition(b" ")
    code, _, reason = rest.partition(b" ")
    if not version.startswith(b"HTTP/1.") or len(code) != 3 or not code.isdigit():
        raise ProtocolError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
    if len(lines) > MAX_HEADERS:
        raise ProtocolError(f"more than {MAX_HEADERS} header lines")
    headers: dict[str, str] = {}
    for line in lines:
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip() or line[:1] in (b" ", b"\t"):
            raise ProtocolError(f"malformed header line {line[:80]!r}")
        key, text = name.decode("latin-1").lower(), value.strip().decode("latin-1")
        if key in headers:
            if key == "content-length" and headers[key] != text:
                raise ProtocolError("two different Content-Length headers")
            if key != "content-length":
                headers[key] = f"{headers[key]}, {text}"
        else:
            headers[key] = text
    return int(code), reason.decode("latin-1"), headers
