"""Where bundle indexes live: a folder, a file:// URL, or an HTTP(S) server.

One code path for online and offline installs: a `Source` opens a file of the index at an
offset (`Opened`: its chunks as they arrive, its size when known); `turbo_dllm.bundles.fetch`
drives sources with resume, verification and retries. Every fetch runs under one overall
deadline (`transfer_deadline`, $DLLM_DOWNLOAD_DEADLINE_S): a server that trickles bytes cannot
hold the install lock for longer, however patient each single read is. Two HTTP clients share
one reading of the answer (status codes, ranges, sizes): `requests` for remote servers (proxies,
CA bundles) and a plain-socket GET (`loopback_http`) for a mirror on this machine, where no proxy
applies and the install should not pay for importing `requests` or `http.client`.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple
from urllib.parse import unquote, urlparse, urlsplit, urlunsplit

from turbo_dllm import __version__
from turbo_dllm.bundles.archive import BundleRejected
from turbo_dllm.errors import DllmError, os_error_hint
from turbo_dllm.locations import parse_location

__all__ = [
    "CHUNK",
    "BufferPool",
    "DEADLINE_VARIABLE",
    "Deadline",
    "DeadlineExceeded",
    "HttpSource",
    "INDEX_VARIABLE",
    "LocalSource",
    "LoopbackHttpSource",
    "NotFound",
    "OFFLINE_VARIABLE",
    "Opened",
    "ServerFailed",
    "Source",
    "TransientError",
    "index_root_hint",
    "offline_requested",
    "open_source",
    "redact_url",
    "transfer_deadline",
]

INDEX_VARIABLE = "DLLM_BUNDLE_INDEX"
OFFLINE_VARIABLE = "DLLM_OFFLINE"
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
MAX_REDIRECTS = 5
CHUNK = 1024 * 1024
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 60.0
DEADLINE_VARIABLE = "DLLM_DOWNLOAD_DEADLINE_S"
DEFAULT_DEADLINE_S = 3600.0  # one hour: 16 GiB (the bundle cap) at ~5 MB/s
# read_small reads catalogs: a few KB each, so one over the cap is something else.
OVER_CAP_HINT = (
    "a release catalog is a few KB: the index serves something else under that name; check the "
    "index URL (`dllm mirror verify DIR` checks a mirror)"
)


class NotFound(DllmError):
    """The source has no file at that path (a missing file, HTTP 404)."""


class TransientError(Exception):
    """A failure worth retrying (connection reset, truncated body, 5xx); its message does not
    name the URL, which whoever reports it puts in front."""


class ServerFailed(TransientError):
    """The server answered with an error status worth retrying (5xx, 408, 429): it works,
    but cannot serve the file now; the URL and the connection are fine."""


class DeadlineExceeded(DllmError):
    """The transfer deadline passed; what was downloaded is kept for the next attempt."""


class Deadline(NamedTuple):
    seconds: float
    at: float  # time.monotonic() value


def transfer_deadline() -> Deadline:
    """The deadline of one download, all its attempts included: $DLLM_DOWNLOAD_DEADLINE_S
    seconds from now (default one hour)."""
    text = os.environ.get(DEADLINE_VARIABLE, "").strip()
    try:
        seconds = float(text) if text else DEFAULT_DEADLINE_S
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise DllmError(
            f"{DEADLINE_VARIABLE}={text!r} is not a positive number of seconds",
            hint=f"unset it for the default ({DEFAULT_DEADLINE_S:g} s) or set e.g. 7200",
        )
    return Deadline(seconds, time.monotonic() + seconds)


def _deadline_passed(url: str) -> DeadlineExceeded:
    return DeadlineExceeded(
        f"{url}: the transfer deadline passed",
        hint=f"the server is slow or stalled; try again, or raise {DEADLINE_VARIABLE} (seconds)",
    )


def _time_left(url: str, deadline: float | None, limit: float) -> float:
    """The socket timeout for the next wait: `limit`, or less as the deadline nears."""
    if deadline is None:
        return limit
    left = deadline - time.monotonic()
    if left <= 0:
        raise _deadline_passed(url)
    return min(limit, left)


class Opened(NamedTuple):
    """An open remote file: its chunks from `offset`, and the full size when the source knows it."""

    chunks: Iterator[bytes | memoryview]  # memoryviews only when opened with a BufferPool
    total: int | None
    offset: int
    close: Callable[[], None]


class BufferPool:
    """Receive buffers that a source fills in turn and its reader hands back, so a large
    download allocates no memory per block: a fresh 1 MiB bytes object per block costs a
    page fault per 4 KiB in a short-lived process (~4,000 faults and ~9 ms of CPU in a 64 MiB
    install on a 2-core host). A block from a pool is a memoryview of one buffer (`.obj`); the
    reader `give`s that buffer back once it is done with the block. Buffers are made only when
    none is free, up to `count`, and the last one handed back is reused first (warm in cache)."""

    def __init__(self, count: int, size: int = CHUNK) -> None:
        import threading

        self.size, self._left = size, count
        self._free: list[bytearray] = []
        self._ready = threading.Condition()

    def take(self, timeout: float) -> bytearray:
        with self._ready:
            if not self._free and self._left:
                self._left -= 1
                return bytearray(self.size)
            if not self._ready.wait_for(lambda: self._free, timeout):
                # the reader kept every buffer: a bug, not a network problem
                raise RuntimeError(f"no receive buffer was handed back within {timeout:g} s")
            return self._free.pop()

    def give(self, buffer: bytearray) -> None:
        with self._ready:
            self._free.append(buffer)
            self._ready.notify()


class Source:
    """Where releases live; paths are relative: `releases/v1/catalog.toml`, `bundles/x.tar.zst`."""

    location: str

    def open(
        self,
        path: str,
        offset: int = 0,
        deadline: float | None = None,
        pool: BufferPool | None = None,
    ) -> Opened:  # pragma: no cover - abstract
        """`path` from byte `offset` (or from 0: see `Opened.offset`); reading it raises
        DeadlineExceeded once `deadline` (a time.monotonic() value) has passed. Given a `pool`,
        a source may receive into its buffers (the loopback client does; others ignore it)."""
        raise NotImplementedError

    def url(self, path: str) -> str:
        return f"{self.location.rstrip('/')}/{path}"

    def read_small(self, path: str, limit: int, retries: int = 3, backoff_s: float = 0.5) -> bytes:
        """The whole file, refused when it is larger than `limit` bytes. A transient failure (a
        broken connection, a 5xx) is retried `retries` times (0: one attempt), with backoff,
        within the transfer deadline."""
        deadline = transfer_deadline()
        for attempt in range(retries + 1):
            try:
                opened = self.open(path, 0, deadline.at)
                try:
                    if opened.total is not None and opened.total > limit:
                        raise BundleRejected(
                            f"{self.url(path)} is {opened.total} bytes, over the {limit}-byte cap",
                            hint=OVER_CAP_HINT,
                        )
                    data = bytearray()
                    for chunk in opened.chunks:
                        data += chunk
                        if len(data) > limit:
                            raise BundleRejected(
                                f"{self.url(path)} is over the {limit}-byte cap", hint=OVER_CAP_HINT
                            )
                    if opened.total is not None and len(data) != opened.total:
                        raise TransientError(f"got {len(data)} of {opened.total} bytes")
                    return bytes(data)
                finally:
                    opened.close()
            except DeadlineExceeded:  # passed between two reads: said like a wait that ran out
                raise _fetch_deadline(self.url(path), deadline, attempt + 1, None) from None
            except TransientError as error:
                if attempt == retries:  # the attempts ran out: said so, whatever time is left
                    raise DllmError(
                        f"cannot fetch {self.url(path)} after {attempts_text(retries + 1)}: {error}",
                        hint="the server answered with an error (it is failing or overloaded): "
                        "retry later, or use another mirror"
                        if isinstance(error, ServerFailed)
                        else "check the index URL and your connection, then retry",
                    ) from None
                if time.monotonic() + backoff_s * 2**attempt > deadline.at:
                    raise _fetch_deadline(
                        self.url(path), deadline, attempt + 1, str(error)
                    ) from None
                time.sleep(backoff_s * 2**attempt)
        raise AssertionError("unreachable")


HIDDEN = "***"
HIDDEN_NOTE = (
    f"the index URL's query values (a token) are shown as {HIDDEN} and stored nowhere: put "
    f"yours in place of {HIDDEN}, or pass the --index (or set {INDEX_VARIABLE}) you used"
)


def redact_url(url: str) -> str:
    """`url` as it may be shown or stored: each query value (a bare query item whole) and a
    password replaced by `***`. Tokens of authenticated or signed mirrors travel in these."""
    parts = urlsplit(url)
    if not parts.query and parts.password is None:
        return url
    netloc = parts.netloc
    if parts.password is not None:
        user, _, host = netloc.rpartition("@")
        netloc = f"{user.partition(':')[0]}:{HIDDEN}@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, _redact_query(parts.query), ""))


def _redact_query(query: str) -> str:
    items = (item.partition("=") for item in query.split("&") if item)
    return "&".join(f"{key}={HIDDEN}" if sep else HIDDEN for key, sep, _ in items)


def attempts_text(count: int) -> str:
    """`count` attempts, said: "1 attempt", "3 attempts"."""
    return f"{count} attempt{'s' if count != 1 else ''}"


def _fetch_deadline(url: str, deadline: Deadline, attempts: int, problem: str | None) -> DllmError:
    last = f"; last problem: {problem}" if problem else ""
    return DllmError(
        f"cannot fetch {url} within the {deadline.seconds:g} s transfer deadline "
        f"({attempts_text(attempts)}{last})",
        hint=f"check the index URL and your connection, then retry; or raise "
        f"{DEADLINE_VARIABLE} (seconds)",
    )


class LocalSource(Source):
    """A mirror folder, given as a path or a file:// URL."""

    def __init__(self, root: Path, location: str | None = None) -> None:
        self.root = root
        self.location = location or str(root)

    def url(self, path: str) -> str:
        # The resolved folder, not the words given: an install records where its archive came
        # from, and a relative `--mirror site` would mean nothing from another directory.
        return str(self.root / path)

    def open(
        self,
        path: str,
        offset: int = 0,
        deadline: float | None = None,
        pool: BufferPool | None = None,
    ) -> Opened:
        file = self.root / path
        try:
            handle = file.open("rb")
        except FileNotFoundError:
            raise NotFound(
                f"{self.url(path)} does not exist",
                hint="check the mirror folder and the release name (`ls MIRROR/releases`)",
            ) from None
        except OSError as error:
            raise DllmError(
                f"cannot read {file}: {error.strerror}",
                hint=os_error_hint(error.errno or 0) or "check that file and its permissions",
            ) from None
        total = os.fstat(handle.fileno()).st_size
        handle.seek(min(offset, total))

        def chunks() -> Iterator[bytes]:
            while chunk := handle.read(CHUNK):
                yield chunk

        return Opened(chunks(), total, min(offset, total), handle.close)


class _Response(NamedTuple):
    """What `_HttpSource.open` needs of an HTTP response, whichever client made it."""

    status: int
    reason: str
    header: Callable[[str], str]  # a header's value, "" when absent
    chunks: Iterator[bytes | memoryview]  # the body as it arrives; TransientError if it breaks off
    close: Callable[[], None]


class _HttpSource(Source):
    """An index served over HTTP(S). The subclass picks the client (`plain_socket`: the
    loopback GET for http:// on loopback, `requests` for any other URL a redirect leads to);
    the answer is read here, and redirects (at most MAX_REDIRECTS) are followed here too, so
    both clients follow the same rules: to http(s) only, and in offline mode only to this
    machine's loopback."""

    plain_socket = False

    def __init__(self, base_url: str, offline: bool = False) -> None:
        # A query (`?token=...` of an authenticated or signed mirror) goes with every request,
        # after the file's path; its values are secrets, so `location` and `url` (what
        # messages and install.json show) hide them, and so does every message (`_hide`).
        parts = urlsplit(base_url)
        self._base = urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
        self._query = parts.query
        self.location = redact_url(self._base + (f"?{parts.query}" if parts.query else ""))
        self._secrets = sorted(
            {
                text
                for item in parts.query.split("&")
                for value in (item.partition("=")[2] if "=" in item else item,)
                for text in (value, unquote(value), unquote(value.replace("+", " ")))
                if len(text) >= 3
            }
            | ({parts.password, unquote(parts.password)} if parts.password else set()),
            key=len,
            reverse=True,
        )
        self.offline = offline
        self._session = None

    def url(self, path: str) -> str:
        return redact_url(self._request_url(path))

    def _request_url(self, path: str) -> str:
        """The URL requested for `path`: its path joined onto the index's, the query kept."""
        return f"{self._base}/{path}" + (f"?{self._query}" if self._query else "")

    def _hide(self, text: str) -> str:
        """`text` (a message) with the index URL's secrets replaced by `***`."""
        if self._query:
            text = text.replace(self._query, _redact_query(self._query))
        for secret in self._secrets:
            text = text.replace(secret, HIDDEN)
        return text

    def _get(
        self, url: str, headers: dict[str, str], deadline: float | None, pool: BufferPool | None
    ) -> _Response:
        """One request, redirects not followed; its errors hide the index's secrets."""
        try:
            return self._get_one(url, headers, deadline, pool)
        except TransientError as error:
            raise type(error)(self._hide(str(error))) from None
        except DllmError as error:
            raise type(error)(self._hide(error.message), hint=error.hint) from None

    def _get_one(
        self, url: str, headers: dict[str, str], deadline: float | None, pool: BufferPool | None
    ) -> _Response:
        parts = urlparse(url)
        if self.plain_socket and parts.scheme == "http" and parts.hostname in _LOOPBACK:
            return _loopback_get(url, headers, deadline, pool)
        if self._session is None:
            import requests

            self._session = requests.Session()
        # No proxy can reach this machine's loopback (an https:// mirror served here).
        no_proxy = parts.hostname in _LOOPBACK
        return _requests_get(self._session, url, headers, deadline, no_proxy)

    def _request(
        self, url: str, headers: dict[str, str], deadline: float | None, pool: BufferPool | None
    ) -> _Response:
        """`_get`, following redirects."""
        first = shown = self._hide(redact_url(url))
        for _ in range(MAX_REDIRECTS + 1):
            response = self._get(url, headers, deadline, pool)
            if response.status not in _REDIRECTS:
                return response
            location = response.header("Location").strip()
            response.close()
            if not location:
                raise DllmError(
                    f"{shown}: HTTP {response.status} {response.reason} without a Location",
                    hint="the server's redirect is broken; use the final URL as --index",
                )
            url = self._redirect_target(url, location)
            shown = self._hide(redact_url(url))
        raise DllmError(
            f"{first}: more than {MAX_REDIRECTS} redirects (the last to {shown})",
            hint="the server redirects in a loop; pass the final URL of the index as --index",
        )

    def _redirect_target(self, url: str, location: str) -> str:
        from urllib.parse import urljoin

        target = urljoin(url, location)
        parts = urlparse(target)
        url, shown = self._hide(redact_url(url)), self._hide(redact_url(target))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise DllmError(
                f"{url} redirects to {shown[:200]!r}, not an http(s) URL",
                hint="pass the index's real URL as --index (or a mirror folder as --mirror)",
            )
        if self.offline and parts.hostname not in _LOOPBACK:
            raise DllmError(
                f"offline mode: {url} redirects to {shown[:200]}; refusing to contact "
                f"{parts.hostname!r}",
                hint="serve the mirror on this machine without redirects, or use a mirror "
                f"folder (--mirror DIR); or drop --offline / unset {OFFLINE_VARIABLE}",
            )
        return target

    def open(
        self,
        path: str,
        offset: int = 0,
        deadline: float | None = None,
        pool: BufferPool | None = None,
    ) -> Opened:
        headers = {"Accept-Encoding": "identity", "User-Agent": f"turbo-dllm/{__version__}"}
        if offset:
            headers["Range"] = f"bytes={offset}-"
        url = self.url(path)  # shown in messages: the query's values hidden
        response = self._request(self._request_url(path), headers, deadline, pool)
        status = response.status
        content_range = response.header("Content-Range") if status == 206 else ""
        if offset and (
            status == 416 or (status == 206 and not content_range.startswith(f"bytes {offset}-"))
        ):
            # Our partial file is not a prefix the server can continue: start over, once
            # (offset 0 never comes back here, so a server that keeps answering this way gets
            # an error below, not another request).
            response.close()
            return self.open(path, 0, deadline, pool)
        if status in (408, 429) or status >= 500:
            response.close()
            raise ServerFailed(f"HTTP {status} {response.reason}".rstrip())
        if status == 404:
            response.close()
            raise NotFound(
                f"{url} was not found (HTTP 404)",
                hint="check the index URL and the release name",
            )
        if status == 206 and not content_range.startswith(f"bytes {offset}-"):
            response.close()
            raise DllmError(
                f"{url}: the server answered a request for the whole file with HTTP 206 and "
                f"Content-Range {content_range[:80]!r}",
                hint="the server's range support is broken; use another mirror",
            )
        if status == 416:
            response.close()
            raise DllmError(
                f"{url}: the server answered a request for the whole file with HTTP 416 "
                "(range not satisfiable)",
                hint="the server's range support is broken; use another mirror",
            )
        if status not in (200, 206):
            response.close()
            raise DllmError(
                f"{url}: HTTP {status} {response.reason}",
                hint="the server refused the request: check the index URL, and that the server "
                "lets you read it"
                if 400 <= status < 500
                else "the server's answer is not a file: check the index URL",
            )
        start = offset if status == 206 else 0
        total = None
        if status == 206:
            size = content_range.rpartition("/")[2]
            total = int(size) if size.isdigit() else None
        elif response.header("Content-Length").isdigit():
            total = int(response.header("Content-Length"))
        chunks = self._hiding(response.chunks)
        return Opened(_until(deadline, url, chunks), total, start, response.close)

    def _hiding(self, chunks: Iterator[bytes | memoryview]) -> Iterator[bytes | memoryview]:
        """`chunks`, their errors' messages with the index's secrets hidden."""
        try:
            yield from chunks
        except TransientError as error:
            raise type(error)(self._hide(str(error))) from None
        except DllmError as error:
            raise type(error)(self._hide(error.message), hint=error.hint) from None


def _until(
    deadline: float | None, url: str, chunks: Iterator[bytes | memoryview]
) -> Iterator[bytes | memoryview]:
    """`chunks`, stopped with DeadlineExceeded once the deadline has passed."""
    for chunk in chunks:
        yield chunk
        if deadline is not None and time.monotonic() > deadline:
            raise _deadline_passed(url)


class HttpSource(_HttpSource):
    """A remote index (https://, or http:// to another host), through `requests`: it honours the
    proxy variables (HTTPS_PROXY, NO_PROXY, ...) and CA bundles (REQUESTS_CA_BUNDLE, certifi)."""

    def __init__(self, base_url: str, offline: bool = False) -> None:
        import requests

        super().__init__(base_url, offline)
        self._session = requests.Session()


class LoopbackHttpSource(_HttpSource):
    """An index served on this machine (127.0.0.1, localhost, ::1), through `loopback_http`'s
    plain-socket GET: no proxy can reach this host's loopback, so none is consulted, and the
    install pays for importing neither `requests` nor `http.client` (unless the server
    redirects elsewhere)."""

    plain_socket = True


def _requests_get(
    session, url: str, headers: dict[str, str], deadline: float | None, no_proxy: bool
) -> _Response:
    import requests

    # One socket timeout for the whole response (requests sets it once): no single read
    # waits past the deadline as it stood when the request went out.
    timeout = (
        _time_left(url, deadline, CONNECT_TIMEOUT_S),
        _time_left(url, deadline, READ_TIMEOUT_S),
    )
    proxies = {"http": None, "https": None, "all": None} if no_proxy else None
    try:
        response = session.get(
            url,
            headers=headers,
            stream=True,
            timeout=timeout,
            allow_redirects=False,  # followed by _HttpSource._request, under its rules
            proxies=proxies,
        )
    except (requests.ConnectionError, requests.Timeout) as error:
        raise TransientError(f"{error.__class__.__name__}: {error}") from None

    def chunks() -> Iterator[bytes]:
        # read1 returns what has arrived: a connection that breaks off loses nothing already
        # received (a looping read would discard its partial buffer), so resume is exact.
        import urllib3

        raw = response.raw
        read = getattr(raw, "read1", None) or raw.read
        while True:
            try:
                chunk = read(CHUNK, decode_content=False)
            except (urllib3.exceptions.HTTPError, OSError) as error:
                raise TransientError(f"transfer broke off: {error}") from None
            if not chunk:
                return
            yield chunk

    return _Response(
        response.status_code,
        response.reason or "",
        lambda name: response.headers.get(name, ""),
        chunks(),
        response.close,
    )


def _loopback_get(
    url: str, headers: dict[str, str], deadline: float | None, pool: BufferPool | None
) -> _Response:
    from urllib.parse import quote, urlsplit

    from turbo_dllm.bundles import loopback_http

    parts = urlsplit(url)
    target = quote(parts.path or "/", safe="/%:@!$&'()*+,;=~") + (
        f"?{parts.query}" if parts.query else ""
    )
    read_timeout = _time_left(url, deadline, READ_TIMEOUT_S)
    try:
        response = loopback_http.get(
            parts.hostname or "127.0.0.1",
            parts.port or 80,
            target,
            headers,
            connect_timeout=_time_left(url, deadline, CONNECT_TIMEOUT_S),
            read_timeout=read_timeout,
        )
    except TimeoutError:  # "TimeoutError: timed out" said neither what nor how long
        raise TransientError(f"no answer within {read_timeout:.3g} s") from None
    except OSError as error:  # refused, reset, or a malformed answer
        raise TransientError(f"{error.__class__.__name__}: {error}") from None

    def chunks() -> Iterator[bytes | memoryview]:
        while True:
            buffer = pool.take(READ_TIMEOUT_S) if pool is not None else None
            wait = _time_left(url, deadline, READ_TIMEOUT_S)
            response.settimeout(wait)  # no wait past it
            try:
                if buffer is None:
                    chunk = response.read1(CHUNK)
                else:
                    view = memoryview(buffer)
                    chunk = view[: response.readinto(view)]
            except TimeoutError:
                raise TransientError(f"transfer broke off: no data for {wait:.3g} s") from None
            except OSError as error:
                raise TransientError(f"transfer broke off: {error}") from None
            if not chunk:
                if buffer is not None:
                    pool.give(buffer)
                return
            yield chunk

    return _Response(response.status, response.reason, response.header, chunks(), response.close)


_OFFLINE_ON = ("1", "true", "yes", "on")
_OFFLINE_OFF = ("", "0", "false", "no", "off")


def offline_requested(flag: bool = False) -> bool:
    """`--offline`, or DLLM_OFFLINE=1: only local sources (folders, file://, loopback HTTP).
    A value that is neither on nor off is an error: DLLM_OFFLINE=on (or 2, or y) read as off,
    so the network was contacted by someone who had asked for it not to be."""
    text = os.environ.get(OFFLINE_VARIABLE, "").strip().lower()
    if text not in _OFFLINE_ON + _OFFLINE_OFF:
        raise DllmError(
            f"{OFFLINE_VARIABLE}={os.environ[OFFLINE_VARIABLE]!r} is neither on nor off",
            hint=f"set {OFFLINE_VARIABLE}=1 (or true, yes, on) to stay offline, 0 (or unset "
            "it) otherwise",
        )
    return flag or text in _OFFLINE_ON


# The end of a location that names something inside an index rather than the index: its
# releases/ folder, a release's folder or catalog, its bundles/ folder or an archive in it.
_INSIDE_INDEX = re.compile(
    r"/(?:releases(?:/[^/?#]+(?:/catalog\.toml)?)?|bundles(?:/[^/?#]+\.tar\.zst)?)/*$"
)


def index_root_hint(location: str) -> str | None:
    """For an index `location` where nothing was found: when it names a folder or file inside
    an index (`.../releases/v1/catalog.toml`, `.../bundles`), the index to pass instead, as
    the option and value to paste; None otherwise."""
    import shlex

    path, _, query = location.partition("?")  # a query goes with the index (see redact_url)
    match = _INSIDE_INDEX.search(path)
    root = path[: match.start()] if match else ""
    if not root or root.endswith(":/"):
        return None
    flag = "--index" if "://" in root and not root.startswith("file:") else "--mirror"
    root += f"/?{query}" if query else ""
    hidden = f" ({HIDDEN_NOTE})" if HIDDEN in query else ""
    return (
        f"the index is the folder that holds releases/ and bundles/; if that is {root}, pass "
        f"{flag} {shlex.quote(root)}{hidden}"
    )


def open_source(location: str | None, *, offline: bool = False) -> Source:
    """`--index URL` / `--mirror PATH`, else $DLLM_BUNDLE_INDEX; `offline` refuses the network."""
    location = location or os.environ.get(INDEX_VARIABLE)
    if not location:
        raise DllmError(
            "no bundle index given",
            hint=f"pass --index URL or --mirror PATH, or set {INDEX_VARIABLE}",
        )
    try:
        where = parse_location(location, "bundle source")
    except DllmError as error:  # a catalog's path given as the mirror folder, say
        inside = index_root_hint(location)
        if inside is None:
            raise
        raise DllmError(error.message, hint=inside) from None
    # read for a folder too: DLLM_OFFLINE=maybe passed with --mirror DIR, then failed later
    offline = offline_requested(offline)
    if where.folder is not None:
        return LocalSource(where.folder, location)
    if offline and where.host not in _LOOPBACK:
        raise DllmError(
            f"offline mode: refusing to contact {where.host or location!r}",
            hint="use a mirror folder (--mirror DIR), a file:// URL or a mirror served on "
            f"127.0.0.1; or drop --offline / unset {OFFLINE_VARIABLE}",
        )
    if urlparse(location).scheme == "http" and where.host in _LOOPBACK:
        return LoopbackHttpSource(location, offline)
    return HttpSource(location, offline)
