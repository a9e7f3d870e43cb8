"""Resumable, verified downloads of bundle archives from a `Source` (see `sources`).

`download` fetches a file into `<sha256>.part` next to the store, resuming a kept partial file
with an HTTP Range request (even one a killed process left), computing the sha256 while
streaming (on a helper thread for large archives), capping the transfer at the catalog's size,
and retrying transient failures with backoff, all within one overall deadline
($DLLM_DOWNLOAD_DEADLINE_S, see `sources.transfer_deadline`). A resumed download is hashed
again from its first byte, and a file that fails verification is deleted, so bad bytes a
hostile mirror sent cannot poison the next attempt.

`download_unpacked` is how installs read an archive: verify before you parse. The bytes cross
the network once, into the `.part` file and the hash together; only once the whole file
matches the catalog's sha256 does the unpacker see it, as a local file (still in the page
cache, so reading it again costs little next to hashing and writing it). A hostile mirror's
bytes therefore never reach tarfile or zstd.
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
    DEADLINE_VARIABLE,
    INDEX_VARIABLE,
    DeadlineExceeded,
    Opened,
    Source,
    TransientError,
    open_source,
    transfer_deadline,
)
from turbo_dllm.errors import DllmError

__all__ = [
    "INDEX_VARIABLE",  # re-exported with open_source: what callers of download need
    "Progress",
    "download",
    "download_unpacked",
    "open_source",
]

THREADED_HASH_BYTES = 16 * CHUNK  # archives this large are hashed on a helper thread
Progress = Callable[[int, int], None]
T = TypeVar("T")


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
    or a source file of the wrong size is refused at once and the partial file deleted
    (retrying cannot fix a bad mirror), except that a mismatch after resuming gets one clean
    retry from byte 0 (the kept part may have been the bad one). Broken connections and
    truncated bodies are retried, each attempt resuming where the last one stopped, until
    `retries` or the transfer deadline runs out.
    """
    dest_dir.mkdir(parents=True, exist_ok=True)
    part = dest_dir / f"{sha256}.part"
    done = dest_dir / f"{sha256}.tar.zst"
    if done.is_file() and not part.exists():
        done.replace(part)  # a finished download is a complete partial one: verified again below
    url = source.url(path)
    deadline = transfer_deadline()
    last_error = "no attempt made"
    fresh_restart_done = False
    for attempt in range(retries + 1):
        if attempt:
            pause = backoff_s * 2 ** (attempt - 1)
            if time.monotonic() + pause >= deadline.at:
                break
            time.sleep(pause)
        have = part.stat().st_size if part.exists() else 0
        if have > size:
            part.unlink()
            have = 0
        transfer = _Transfer(source, path, part, have, size, progress, deadline.at)
        try:
            transfer.run()
        except TransientError as error:
            last_error = str(error)
            if time.monotonic() >= deadline.at:
                break
            continue
        except DeadlineExceeded:
            break
        except BundleRejected:
            part.unlink(missing_ok=True)
            raise
        finally:
            transfer.close()
        if transfer.position < size:
            last_error = f"the transfer stopped at {transfer.position} of {size} bytes"
            continue
        actual = transfer.digest.hexdigest()
        if actual != sha256:
            part.unlink()
            if transfer.resumed and not fresh_restart_done:
                fresh_restart_done = True
                last_error = "sha256 mismatch after resuming"
                continue
            raise BundleRejected(
                f"{url}: sha256 mismatch: the catalog says {sha256}, the downloaded bytes hash "
                f"to {actual}",
                hint="the mirror's copy is corrupt or was tampered with; re-publish it or use "
                "another mirror",
            )
        part.replace(done)
        return done
    else:
        raise DllmError(
            f"download of {url} failed after {retries + 1} attempts: {last_error}",
            hint="run the same command again: it resumes the partial download",
        )
    got = part.stat().st_size if part.exists() else 0
    raise DeadlineExceeded(
        f"download of {url} did not finish within the {deadline.seconds:g} s transfer deadline "
        f"({got} of {size} bytes; last problem: {last_error})",
        hint=f"the server is slow or stalled; run the same command again to resume, or raise "
        f"{DEADLINE_VARIABLE} (seconds)",
    )


def download_unpacked(
    source: Source,
    path: str,
    *,
    unpack: Callable[[Path], T],
    sha256: str,
    size: int,
    dest_dir: Path,
    retries: int = 4,
    backoff_s: float = 0.5,
    progress: Progress | None = None,
) -> T:
    """`download`, then `unpack(archive)` on the verified local file, which is removed after
    (whatever `unpack` did: a verified archive that fails to unpack is no use either)."""
    archive = download(
        source,
        path,
        sha256=sha256,
        size=size,
        dest_dir=dest_dir,
        retries=retries,
        backoff_s=backoff_s,
        progress=progress,
    )
    try:
        return unpack(archive)
    finally:
        archive.unlink(missing_ok=True)


class _Transfer:
    """One attempt: hash the `have` bytes kept in the .part file, then append what the source
    sends from there, hashing it too. `digest` covers every byte of the file; `position`
    counts them. More than `size` bytes, or a source of another size, is refused."""

    def __init__(
        self,
        source: Source,
        path: str,
        part: Path,
        have: int,
        size: int,
        progress: Progress | None,
        deadline: float,
    ) -> None:
        self.digest = _Sha256() if size < THREADED_HASH_BYTES else _ThreadedSha256()
        self.position = 0
        self._source, self._path, self._part = source, path, part
        self._have, self._size, self._progress = have, size, progress
        self._deadline = deadline
        self._out: BinaryIO | None = None
        self._opened: Opened | None = None

    @property
    def resumed(self) -> bool:
        """Whether this attempt continued a kept partial file."""
        return self._have > 0

    def run(self) -> None:
        if self._have < self._size:
            self._open()  # first: whether the source can continue after the kept bytes
        if self._have:
            self._hash_kept()
        if self._opened is None:
            return  # the kept .part was complete: nothing to fetch
        assert self._out is not None
        for block in self._opened.chunks:
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

    def _hash_kept(self) -> None:
        with self._part.open("rb") as kept:
            while self.position < self._have:
                block = kept.read(min(CHUNK, self._have - self.position))
                if not block:  # the .part shrank under us: start over next attempt
                    raise TransientError(f"{self._part} changed while it was being resumed")
                self.digest.update(block)
                self.position += len(block)

    def _open(self) -> None:
        self._opened = opened = self._source.open(self._path, self._have, self._deadline)
        if opened.total is not None and opened.total != self._size:
            raise BundleRejected(
                f"{self._source.url(self._path)}: wrong size: the catalog says {self._size} "
                f"bytes, the source has {opened.total}",
                hint="the mirror's copy does not belong to this catalog; re-publish it",
            )
        if opened.offset != self._have:  # the source starts from byte 0: so do we
            self._have = 0
        if self._have:
            self._out = self._part.open("r+b")
            self._out.seek(self._have)
        else:
            # "wb", not a truncate: on ext4 truncating makes close() flush the file to disk.
            self._out = self._part.open("wb")

    def close(self) -> None:
        self.digest.hexdigest()  # stops a hashing thread
        if self._out is not None:
            self._out.close()
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
