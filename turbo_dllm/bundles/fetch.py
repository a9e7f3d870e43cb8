"""Resumable, verified downloads of bundle archives from a `Source` (see `sources`).

`download` fetches a file into `<sha256>.part` next to the store, resuming a kept partial file
with an HTTP Range request (even one a killed process left), computing the sha256 while
streaming, capping the transfer at the catalog's size, and retrying transient failures with
backoff. `download_unpacked` does the same while the bytes also stream through an unpacker, so
installing reads a large archive once.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, TypeVar

from turbo_dllm.bundles.archive import BundleRejected
from turbo_dllm.bundles.sources import (
    CHUNK,
    INDEX_VARIABLE,
    Opened,
    Source,
    TransientError,
    open_source,
)
from turbo_dllm.errors import DllmError

__all__ = [
    "INDEX_VARIABLE",  # re-exported with open_source: what callers of download need
    "Progress",
    "download",
    "download_unpacked",
    "open_source",
    "sha256_file",
]

THREADED_HASH_BYTES = 16 * CHUNK  # archives this large are hashed on a helper thread
Progress = Callable[[int, int], None]
T = TypeVar("T")


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
    """Fetch `path` into `dest_dir/<sha256>.tar.zst`, resuming a kept `<sha256>.part`.

    The catalog's `size` caps the transfer and `sha256` must match the bytes. A mismatched hash
    or a source file of the wrong size is refused at once (retrying cannot fix a bad mirror);
    broken connections and truncated bodies are retried, each attempt resuming where the last
    one stopped.
    """
    done = dest_dir / f"{sha256}.tar.zst"
    part = _fetch(source, path, sha256, size, dest_dir, retries, backoff_s, progress, None)[0]
    part.replace(done)
    return done


def download_unpacked(
    source: Source,
    path: str,
    *,
    unpack: Callable[[BinaryIO], T],
    sha256: str,
    size: int,
    dest_dir: Path,
    retries: int = 4,
    backoff_s: float = 0.5,
    progress: Progress | None = None,
) -> T:
    """Like `download`, but the bytes also stream through `unpack(reader)` as they arrive, so a
    large archive is read once: no second pass over the finished file.

    The partial file is kept for resume as with `download`, and removed at the end. Each attempt
    calls `unpack` afresh (it must start over). Its result is returned only once the whole
    archive matched `size` and `sha256`; until then a DllmError it raises is held back, so a
    corrupt download is reported as a hash mismatch, not as whatever the damage looked like.
    """
    part, result = _fetch(
        source, path, sha256, size, dest_dir, retries, backoff_s, progress, unpack
    )
    part.unlink(missing_ok=True)
    return result


def _fetch(
    source: Source,
    path: str,
    sha256: str,
    size: int,
    dest_dir: Path,
    retries: int,
    backoff_s: float,
    progress: Progress | None,
    unpack: Callable[[BinaryIO], T] | None,
) -> tuple[Path, T | None]:
    """The retry loop: (the verified `<sha256>.part`, what `unpack` returned)."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    part = dest_dir / f"{sha256}.part"
    done = dest_dir / f"{sha256}.tar.zst"
    if done.is_file() and not part.exists():
        done.replace(part)  # a finished download is a complete partial one: verified again below
    url = source.url(path)
    last_error = "no attempt made"
    fresh_restart_done = False
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(backoff_s * 2 ** (attempt - 1))
        have = part.stat().st_size if part.exists() else 0
        if have > size:
            part.unlink()
            have = 0
        incoming = _Incoming(source, path, part, have, size, progress)
        held: DllmError | None = None
        try:
            try:
                result = unpack(incoming) if unpack is not None else None
            except Exception as error:
                if incoming.failure is not None:
                    raise incoming.failure from None
                if not isinstance(error, DllmError):
                    raise
                held, result = error, None
            incoming.drain()
        except TransientError as error:
            last_error = str(error)
            continue
        except BundleRejected:
            part.unlink(missing_ok=True)
            raise
        finally:
            incoming.close()
        if incoming.position < size:
            last_error = f"the transfer stopped at {incoming.position} of {size} bytes"
            continue
        actual = incoming.digest.hexdigest()
        if actual != sha256:
            part.unlink()
            if incoming.resumed and not fresh_restart_done:
                # The old partial may have been the bad part: one clean retry from byte 0.
                fresh_restart_done = True
                last_error = "sha256 mismatch after resuming"
                continue
            raise BundleRejected(
                f"{url}: sha256 mismatch: the catalog says {sha256}, the downloaded bytes hash "
                f"to {actual}",
                hint="the mirror's copy is corrupt or was tampered with; re-publish it or use "
                "another mirror",
            )
        if held is not None:
            part.unlink()
            raise held
        return part, result
    raise DllmError(
        f"download of {url} failed after {retries + 1} attempts: {last_error}",
        hint="run the same command again: it resumes the partial download",
    )


class _Incoming:
    """One attempt's bytes, in order, as a readable stream: the `have` bytes kept in the .part
    file, then what the source sends from there (appended to the .part file as it arrives).

    Everything read is hashed into `digest`; `position` counts it. More than `size` bytes, or a
    source of another size, is refused. A failure of the transfer itself is kept in `failure`,
    so the caller can tell it from a problem of whoever was reading. `drain()` reads what the
    reader left, so the whole file is hashed and kept either way.
    """

    def __init__(
        self,
        source: Source,
        path: str,
        part: Path,
        have: int,
        size: int,
        progress: Progress | None,
    ) -> None:
        self.digest = _Sha256() if size < THREADED_HASH_BYTES else _ThreadedSha256()
        self.position = 0
        self.failure: Exception | None = None
        self._source, self._path, self._part = source, path, part
        self._have, self._size, self._progress = have, size, progress
        self._kept: BinaryIO | None = part.open("rb") if have else None
        self._out: BinaryIO | None = None
        self._opened: Opened | None = None
        self._pending = b""

    @property
    def resumed(self) -> bool:
        """Whether this attempt continued a kept partial file."""
        return self._have > 0

    def read(self, n: int = -1) -> bytes:
        """Up to `n` bytes (all of the next block when `n` < 0); b"" at the end."""
        if not self._pending:
            try:
                self._pending = self._next_block()
            except Exception as error:  # the transfer's own failure, not the reader's
                self.failure = error
                raise
        if 0 <= n < len(self._pending):
            block, self._pending = self._pending[:n], self._pending[n:]
            return block
        block, self._pending = self._pending, b""
        return block

    def drain(self) -> None:
        self._pending = b""
        while self._next_block():
            pass

    def _next_block(self) -> bytes:
        if self._opened is None and self._have < self._size:
            self._open()  # first: whether the source can continue after the kept bytes
        if self._kept is not None:
            block = self._kept.read(min(CHUNK, self._have - self.position))
            if block:
                self.digest.update(block)
                self.position += len(block)
                return block
            self._kept.close()
            self._kept = None
            if self.position < self._have:  # the .part shrank under us: start over next attempt
                raise TransientError(f"{self._part} changed while it was being resumed")
        if self._opened is None:
            return b""  # the kept .part was complete: nothing to fetch
        assert self._out is not None
        block = next(self._opened.chunks, b"")
        if block:
            self.position += len(block)
            if self.position > self._size:
                raise BundleRejected(
                    f"{self._source.url(self._path)}: wrong size: the source sent more than the "
                    f"catalog's {self._size} bytes",
                    hint="the mirror's copy does not belong to this catalog; re-publish it",
                )
            self.digest.update(block)
            self._out.write(block)
            if self._progress:
                self._progress(self.position, self._size)
        return block

    def _open(self) -> None:
        self._opened = opened = self._source.open(self._path, self._have)
        if opened.total is not None and opened.total != self._size:
            raise BundleRejected(
                f"{self._source.url(self._path)}: wrong size: the catalog says {self._size} "
                f"bytes, the source has {opened.total}",
                hint="the mirror's copy does not belong to this catalog; re-publish it",
            )
        if opened.offset != self._have:  # the source starts from byte 0: so do we
            if self._kept is not None:
                self._kept.close()
                self._kept = None
            self._have = 0
        if self._have:
            self._out = self._part.open("r+b")
            self._out.seek(self._have)
        else:
            # "wb", not a truncate: on ext4 truncating makes close() flush the file to disk.
            self._out = self._part.open("wb")

    def close(self) -> None:
        self.digest.hexdigest()  # stops a hashing thread
        for handle in (self._kept, self._out):
            if handle is not None:
                handle.close()
        if self._opened is not None:
            self._opened.close()


class _Sha256:
    def __init__(self) -> None:
        self._digest = hashlib.sha256()
        self.update = self._digest.update

    def hexdigest(self) -> str:
        return self._digest.hexdigest()


class _ThreadedSha256:
    """sha256 of the blocks given, in order, on a helper thread: hashlib releases the GIL, so
    hashing a large archive overlaps with unpacking it (decompress, hash and write each file)."""

    def __init__(self) -> None:
        import queue
        import threading

        self._digest = hashlib.sha256()
        self._blocks: queue.Queue[bytes | None] = queue.Queue(maxsize=64)  # <= 64 MiB ahead
        self._thread = threading.Thread(target=self._run, name="dllm-sha256", daemon=True)
        self._thread.start()
        self._hex: str | None = None

    def _run(self) -> None:
        while (block := self._blocks.get()) is not None:
            self._digest.update(block)

    def update(self, block: bytes) -> None:
        self._blocks.put(block)

    def hexdigest(self) -> str:
        if self._hex is None:
            self._blocks.put(None)
            self._thread.join()
            self._hex = self._digest.hexdigest()
        return self._hex
