"""Fetch catalogs and bundle archives from an index: https://, http://, file:// or a folder.

One code path for online and offline installs: a `Source` opens a file at an offset, and
`download` drives it with resume (HTTP Range), a streamed sha256, a size cap taken from the
catalog, and retries with backoff for transient failures. Partial downloads live next to the
store as `<sha256>.part` and are resumed by the next attempt, even from another process.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from turbo_dllm import __version__
from turbo_dllm.bundles.archive import BundleRejected
from turbo_dllm.errors import DllmError

__all__ = [
    "INDEX_VARIABLE",
    "OFFLINE_VARIABLE",
    "HttpSource",
    "LocalSource",
    "Opened",
    "Source",
    "download",
    "offline_requested",
    "open_source",
    "sha256_file",
]

INDEX_VARIABLE = "DLLM_BUNDLE_INDEX"
OFFLINE_VARIABLE = "DLLM_OFFLINE"
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
CHUNK = 1024 * 1024
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 60.0

Progress = Callable[[int, int], None]


class TransientError(Exception):
    """A failure worth retrying (connection reset, truncated body, 5xx)."""


@dataclass
class Opened:
    """An open remote file: its chunks from `offset`, and the full size when the source knows it."""

    chunks: Iterator[bytes]
    total: int | None
    offset: int
    close: Callable[[], None]


class Source:
    """Where releases live; paths are relative: `releases/v1/catalog.toml`, `bundles/x.tar.zst`."""

    location: str

    def open(self, path: str, offset: int = 0) -> Opened:  # pragma: no cover - abstract
        raise NotImplementedError

    def url(self, path: str) -> str:
        return f"{self.location.rstrip('/')}/{path}"

    def read_small(self, path: str, limit: int, retries: int = 3, backoff_s: float = 0.5) -> bytes:
        """The whole file, refused when it is larger than `limit` bytes."""
        for attempt in range(retries + 1):
            try:
                opened = self.open(path)
                try:
                    if opened.total is not None and opened.total > limit:
                        raise BundleRejected(
                            f"{self.url(path)} is {opened.total} bytes, over the {limit}-byte cap"
                        )
                    data = bytearray()
                    for chunk in opened.chunks:
                        data += chunk
                        if len(data) > limit:
                            raise BundleRejected(f"{self.url(path)} is over the {limit}-byte cap")
                    if opened.total is not None and len(data) != opened.total:
                        raise TransientError(f"got {len(data)} of {opened.total} bytes")
                    return bytes(data)
                finally:
                    opened.close()
            except TransientError as error:
                if attempt == retries:
                    raise DllmError(
                        f"cannot fetch {self.url(path)}: {error}",
                        hint="check the index URL and your connection, then retry",
                    ) from None
                time.sleep(backoff_s * 2**attempt)
        raise AssertionError("unreachable")


class LocalSource(Source):
    """A mirror folder, given as a path or a file:// URL."""

    def __init__(self, root: Path, location: str | None = None) -> None:
        self.root = root
        self.location = location or str(root)

    def open(self, path: str, offset: int = 0) -> Opened:
        file = self.root / path
        try:
            handle = file.open("rb")
        except FileNotFoundError:
            raise DllmError(
                f"{self.url(path)} does not exist",
                hint="check the mirror folder and the release name (`ls MIRROR/releases`)",
            ) from None
        except OSError as error:
            raise DllmError(f"cannot read {file}: {error.strerror}") from None
        total = os.fstat(handle.fileno()).st_size
        handle.seek(min(offset, total))

        def chunks() -> Iterator[bytes]:
            while chunk := handle.read(CHUNK):
                yield chunk

        return Opened(chunks(), total, min(offset, total), handle.close)


class HttpSource(Source):
    """An index served over HTTP(S) (a release server, or a loopback mirror)."""

    def __init__(self, base_url: str) -> None:
        import requests

        self.location = base_url.rstrip("/")
        self.session = requests.Session()
        self.session.headers["User-Agent"] = f"turbo-dllm/{__version__}"

    def open(self, path: str, offset: int = 0) -> Opened:
        import requests

        headers = {"Accept-Encoding": "identity"}
        if offset:
            headers["Range"] = f"bytes={offset}-"
        url = self.url(path)
        try:
            response = self.session.get(
                url, headers=headers, stream=True, timeout=(CONNECT_TIMEOUT_S, READ_TIMEOUT_S)
            )
        except (requests.ConnectionError, requests.Timeout) as error:
            raise TransientError(f"{url}: {error.__class__.__name__}: {error}") from None
        status = response.status_code
        if status == 416:  # our partial file is not a prefix the server can continue
            response.close()
            return self.open(path, 0)
        if status in (408, 429) or status >= 500:
            response.close()
            raise TransientError(f"{url}: HTTP {status}")
        if status == 404:
            response.close()
            raise DllmError(
                f"{url} was not found (HTTP 404)",
                hint="check the index URL and the release name",
            )
        if status not in (200, 206):
            response.close()
            raise DllmError(f"{url}: HTTP {status} {response.reason}")
        start = offset if status == 206 else 0
        total = None
        if status == 206:
            content_range = response.headers.get("Content-Range", "")
            if not content_range.startswith(f"bytes {offset}-"):
                response.close()
                return self.open(path, 0)
            size = content_range.rpartition("/")[2]
            total = int(size) if size.isdigit() else None
        elif response.headers.get("Content-Length", "").isdigit():
            total = int(response.headers["Content-Length"])

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
                    raise TransientError(f"{url}: transfer broke off: {error}") from None
                if not chunk:
                    return
                yield chunk

        return Opened(chunks(), total, start, response.close)


def offline_requested(flag: bool = False) -> bool:
    """`--offline`, or DLLM_OFFLINE=1: only local sources (folders, file://, loopback HTTP)."""
    return flag or os.environ.get(OFFLINE_VARIABLE, "").strip().lower() in ("1", "true", "yes")


def open_source(location: str | None, *, offline: bool = False) -> Source:
    """`--index URL` / `--mirror PATH`, else $DLLM_BUNDLE_INDEX; `offline` refuses the network."""
    location = location or os.environ.get(INDEX_VARIABLE)
    if not location:
        raise DllmError(
            "no bundle index given",
            hint=f"pass --index URL or --mirror PATH, or set {INDEX_VARIABLE}",
        )
    parsed = urlparse(location)
    if parsed.scheme in ("http", "https"):
        host = (parsed.hostname or "").lower()
        if offline_requested(offline) and host not in _LOOPBACK:
            raise DllmError(
                f"offline mode: refusing to contact {host or location!r}",
                hint="use a mirror folder (--mirror DIR), a file:// URL or a mirror served on "
                f"127.0.0.1; or drop --offline / unset {OFFLINE_VARIABLE}",
            )
        return HttpSource(location)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise DllmError(f"{location!r}: file:// URLs must name a local path (file:///path)")
        root = Path(unquote(parsed.path))
    elif parsed.scheme and len(parsed.scheme) > 1:
        raise DllmError(
            f"unsupported index {location!r}",
            hint="use https://, http://, file:// or a plain folder path",
        )
    else:
        root = Path(location).expanduser()
    if not root.is_dir():
        raise DllmError(f"mirror folder {str(root)!r} does not exist", hint="check the path")
    return LocalSource(root.resolve(), location)


def sha256_file(path: Path, chunk: int = CHUNK) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def download(
    source: Source,
    path: str,
    *,
    sha256: str,
    size: int,
    dest_dir: Path,
    retries: int = 4,
    backoff_s: float = 0.5,
    progress: Progress | None = None,
) -> Path:
    """Fetch `path` into `dest_dir/<sha256>.part`, resuming what is there; verify; rename.

    The catalog's `size` caps the transfer and `sha256` must match the bytes. A mismatched hash
    or a source file of the wrong size is refused at once (retrying cannot fix a bad mirror);
    broken connections and truncated bodies are retried, each attempt resuming where the last
    one stopped.
    """
    dest_dir.mkdir(parents=True, exist_ok=True)
    part = dest_dir / f"{sha256}.part"
    done = dest_dir / f"{sha256}.tar.zst"
    url = source.url(path)
    if done.is_file() and done.stat().st_size == size and sha256_file(done) == sha256:
        return done
    last_error = "no attempt made"
    fresh_restart_done = False
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(backoff_s * 2 ** (attempt - 1))
        have = part.stat().st_size if part.exists() else 0
        if have > size:
            part.unlink()
            have = 0
        try:
            received, digest, resumed = _transfer(source, path, part, have, size, progress)
        except TransientError as error:
            last_error = str(error)
            continue
        if received < size:
            last_error = f"the transfer stopped at {received} of {size} bytes"
            continue
        actual = digest.hexdigest()
        if actual == sha256:
            part.replace(done)
            return done
        part.unlink()
        if resumed and not fresh_restart_done:
            # The old partial may have been the bad part: one clean retry from byte 0.
            fresh_restart_done = True
            last_error = "sha256 mismatch after resuming"
            continue
        raise BundleRejected(
            f"{url}: sha256 mismatch: the catalog says {sha256}, the downloaded bytes hash to "
            f"{actual}",
            hint="the mirror's copy is corrupt or was tampered with; re-publish it or use "
            "another mirror",
        )
    raise DllmError(
        f"download of {url} failed after {retries + 1} attempts: {last_error}",
        hint="run the same command again: it resumes the partial download",
    )


def _transfer(
    source: Source, path: str, part: Path, have: int, size: int, progress: Progress | None
) -> tuple[int, hashlib._Hash, bool]:
    """One attempt: (bytes the .part file holds afterwards, their sha256, resumed or not).

    The hash is streamed: the kept prefix is hashed once, new bytes as they arrive.
    """
    opened = source.open(path, have)
    url = source.url(path)
    try:
        if opened.total is not None and opened.total != size:
            raise BundleRejected(
                f"{url}: wrong size: the catalog says {size} bytes, the source has {opened.total}",
                hint="the mirror's copy does not belong to this catalog; re-publish it",
            )
        position = opened.offset
        digest = hashlib.sha256()
        if position:
            with part.open("rb") as kept:
                remaining = position
                while remaining and (block := kept.read(min(CHUNK, remaining))):
                    digest.update(block)
                    remaining -= len(block)
        with part.open("r+b" if position else "wb") as out:
            out.seek(position)
            out.truncate()
            for chunk in opened.chunks:
                position += len(chunk)
                if position > size:
                    raise BundleRejected(
                        f"{url}: wrong size: the source sent more than the catalog's {size} bytes",
                        hint="the mirror's copy does not belong to this catalog; re-publish it",
                    )
                digest.update(chunk)
                out.write(chunk)
                if progress:
                    progress(position, size)
        return position, digest, opened.offset > 0
    except BundleRejected:
        part.unlink(missing_ok=True)
        raise
    finally:
        opened.close()
