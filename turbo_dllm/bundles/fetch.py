"""Resumable, verified downloads of bundle archives from a `Source` (see `sources`).

`download` fetches a file into `<sha256>.part` next to the store, resuming a kept partial file
with an HTTP Range request (even one a killed process left), computing the sha256 while
streaming (on a helper thread for large archives), capping the transfer at the catalog's size,
and retrying transient failures with backoff, all within one overall deadline
($DLLM_DOWNLOAD_DEADLINE_S, see `sources.transfer_deadline`). A resumed download is hashed
again from its first byte, and a file that fails verification is deleted, so bad bytes a
hostile mirror sent cannot poison the next attempt.

`download_unpacked` is how installs read an archive: one pass, verify before activate. The
bytes cross the network once and are read once: each block goes to the sha256 and the
resumable `.part` file (the hash on a helper thread for large archives) and to the unpacker,
which extracts it into staging as it arrives. What the unpacker made counts only once the
whole archive matched the catalog's sha256: on a mismatch the caller's staging and the `.part`
file are deleted and the error is the mismatch, whatever the unpacker said about those bytes.
The unpacker therefore sees unverified bytes, and must be the safe extractor (bounded headers,
sizes and files, nothing written outside its folder); see docs/bundles.md.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, TypeVar

from turbo_dllm.bundles.archive import DISK_HINTS, BundleRejected, DiskWriteError, NoRoom
from turbo_dllm.bundles.sources import (
    CHUNK,
    DEADLINE_VARIABLE,
    INDEX_VARIABLE,
    BufferPool,
    DeadlineExceeded,
    Opened,
    Source,
    TransientError,
    attempts_text,
    open_source,
    transfer_deadline,
)
from turbo_dllm.errors import DllmError

__all__ = [
    "INDEX_VARIABLE",  # re-exported with open_source: what callers of download need
    "ArchiveStream",
    "Progress",
    "download",
    "download_unpacked",
    "drop_download",
    "marked_verified",
    "open_source",
]

THREADED_HASH_BYTES = 16 * CHUNK  # archives this large are hashed on a helper thread
RECEIVE_BUFFERS = 8  # their blocks are received into this many reused buffers (BufferPool)
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
    done = dest_dir / f"{sha256}.tar.zst"
    part = dest_dir / f"{sha256}.part"
    if done.is_file() and not part.exists():
        done.replace(part)  # a finished download is a complete partial one: verified again below
    _fetch(source, path, None, sha256, size, dest_dir, retries, backoff_s, progress)
    part.replace(done)
    _mark(part).unlink(missing_ok=True)
    return done


def _mark(part: Path) -> Path:
    return part.with_name(part.name + ".verified")


def _mark_verified(part: Path) -> None:
    """Say that `part` holds the whole archive, its sha256 matched: an empty mark next to it
    with the same modification time (any later write to `part` changes its own). Only `status`
    reads it (`marked_verified`), to name the file without hashing it; an install hashes the
    file again whatever the mark says. Not writing it (a full disk) loses only that label."""
    mark = _mark(part)
    try:
        mark.touch()
        os.utime(mark, ns=(part.stat().st_atime_ns, part.stat().st_mtime_ns))
    except OSError:
        mark.unlink(missing_ok=True)


def marked_verified(part: Path) -> bool:
    """Whether `part` was verified whole and has not been written since (see `_mark_verified`)."""
    try:
        return _mark(part).stat().st_mtime_ns == part.stat().st_mtime_ns
    except OSError:
        return False


def drop_download(part: Path) -> None:
    """Delete a `.part` download and its verified mark, if there."""
    part.unlink(missing_ok=True)
    _mark(part).unlink(missing_ok=True)


PINNED_REFUSED_HINT = (
    "these are the very bytes the catalog pins (their sha256 matched), so every copy of this "
    "bundle is the same: tell the release's publisher; nothing was installed"
)


def download_unpacked(
    source: Source,
    path: str,
    *,
    unpack: Callable[[ArchiveStream], T],
    sha256: str,
    size: int,
    dest_dir: Path,
    retries: int = 4,
    backoff_s: float = 0.5,
    progress: Progress | None = None,
    keep_verified: bool = False,
) -> T:
    """`download` and `unpack` in one pass: `unpack(stream)` reads the archive's bytes as they
    arrive (once per attempt: a retried transfer starts it again from byte 0, the kept bytes
    read back from the `.part` file). Its result is returned only when the whole archive
    matched `sha256`; a mismatch raises BundleRejected naming it, even when `unpack` refused
    the bytes first (the mirror served other bytes: that is the error to report). When the
    bytes match and `unpack` refused them, its error is raised. The `.part` file is removed
    whatever happens, except when the transfer itself did not finish (the next command resumes
    it) and when `unpack` raised `NoRoom` or `DiskWriteError` for verified bytes (a disk that
    is or became full, a quota: the next command, once there is room, unpacks the kept file
    without downloading it again). `keep_verified`: the verified `.part` file is kept on
    success too, for the caller to delete once it has put `unpack`'s result in place (a process
    killed before then leaves the next run bytes to verify again instead of a new download).
    """
    part = dest_dir / f"{sha256}.part"
    result = _fetch(source, path, unpack, sha256, size, dest_dir, retries, backoff_s, progress)
    if not keep_verified:
        drop_download(part)
    return result


def _fetch(
    source: Source,
    path: str,
    unpack: Callable[[ArchiveStream], T] | None,
    sha256: str,
    size: int,
    dest_dir: Path,
    retries: int,
    backoff_s: float,
    progress: Progress | None,
) -> T | None:
    """The download loop: attempts with resume and backoff until the `.part` file holds the
    verified archive; returns what `unpack` made of it (None without `unpack`)."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    part = dest_dir / f"{sha256}.part"
    _mark(part).unlink(missing_ok=True)  # what this run verifies it marks again
    url = source.url(path)
    deadline = transfer_deadline()
    last_error = "no attempt made"
    fresh_restart_done = False
    restart_now = False  # the clean restart after a resumed mismatch: no retry of its own
    attempt = 0  # attempts made
    while restart_now or attempt <= retries:
        if restart_now:
            restart_now = False
        else:
            if attempt:
                pause = backoff_s * 2 ** (attempt - 1)
                if time.monotonic() + pause >= deadline.at:
                    break
                time.sleep(pause)
            attempt += 1
        have = part.stat().st_size if part.exists() else 0
        if have > size:
            part.unlink()
            have = 0
        transfer = _Transfer(source, path, part, have, size, progress, deadline.at)
        result: T | None = None
        refusal: DllmError | None = None
        try:
            transfer.start()
            if unpack is not None:
                try:
                    result = unpack(transfer.stream)
                except Exception as error:
                    transfer.check()  # the transfer's own failure wins: a broken connection
                    if not isinstance(error, DllmError):  # a bug, not a refusal
                        raise
                    refusal = error  # judged below, once the hash is known
                transfer.check()
            transfer.drain()
        except TransientError as error:
            last_error = str(error)
            if time.monotonic() >= deadline.at:
                break
            continue
        except DeadlineExceeded:
            break
        except BundleRejected:
            drop_download(part)
            raise
        finally:
            transfer.close()
        if transfer.position < size:
            last_error = f"the transfer stopped at {transfer.position} of {size} bytes"
            continue
        actual = transfer.hexdigest()
        if actual != sha256:
            part.unlink()
            if transfer.resumed and not fresh_restart_done:
                # The kept bytes may be the bad ones (a file changed since, a killed run's):
                # start again from byte 0 at once, whatever --retries says.
                fresh_restart_done = restart_now = True
                last_error = "sha256 mismatch after resuming"
                continue
            raise BundleRejected(
                f"{url}: sha256 mismatch: the catalog says {sha256}, the downloaded bytes hash "
                f"to {actual}",
                hint="the mirror's copy is corrupt or was tampered with; re-publish it or use "
                "another mirror",
            )
        _mark_verified(part)
        if isinstance(refusal, (NoRoom, DiskWriteError)):
            # Verified bytes this machine could not unpack (no room, a disk that filled from
            # elsewhere, a quota): the fault is not the archive's, so they are kept for the
            # next run to unpack without downloading them again.
            raise refusal
        if refusal is not None:  # the pinned bytes themselves are refused
            drop_download(part)
            if isinstance(refusal, BundleRejected):
                # Another copy or a new download would be the same bytes: only the publisher
                # can mend what the archive's own hint tells its maker to do.
                raise BundleRejected(refusal.message, hint=PINNED_REFUSED_HINT) from None
            raise refusal
        return result
    else:
        raise DllmError(
            f"download of {url} failed after {attempts_text(retries + 1)}: {last_error}",
            hint=_again_hint(part, size, "check that the server works (or use another mirror), "),
        )
    got = part.stat().st_size if part.exists() else 0
    raise DeadlineExceeded(
        f"download of {url} did not finish within the {deadline.seconds:g} s transfer deadline "
        f"({got} of {size} bytes; last problem: {last_error})",
        hint=f"the server is slow or stalled; {_again_hint(part, size, '')}, or raise "
        f"{DEADLINE_VARIABLE} (seconds)",
    )


def _again_hint(part: Path, size: int, otherwise: str) -> str:
    """What running the command again does: resume the bytes kept in `part`, if there are any
    (there are none when every answer was an error, a 5xx say)."""
    got = part.stat().st_size if part.exists() else 0
    if got:
        return f"run the same command again: it resumes the partial download ({got} of {size} bytes kept)"
    return f"nothing was downloaded; {otherwise}run the same command again"


class ArchiveStream:
    """The archive's bytes as one attempt delivers them, as a forward-only binary reader (what
    zstd's stream reader wants): the kept `.part` bytes first, then the source's. Each block is
    handed to the sink (hash, and `.part` for new bytes) as it is read. A block may be a view
    of a reused receive buffer (`BufferPool`): it is valid until the next `read`, so a reader
    that keeps bytes copies them."""

    def __init__(self, blocks: Iterator[bytes | memoryview]) -> None:
        self._blocks = blocks
        self._pending = b""

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes | memoryview:
        """Up to `n` bytes (fewer at block edges; b"" at the end)."""
        if self._pending:
            block, self._pending = self._pending, b""
        else:
            block = next(self._blocks, b"")
        if 0 <= n < len(block):
            block, self._pending = block[:n], block[n:]
        return block


class _Transfer:
    """One attempt: the `have` bytes kept in the .part file (hashed again), then what the
    source sends from there (hashed and appended). `position` counts the bytes read so far;
    more than `size`, or a source of another size, is refused."""

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
        self.position = 0
        self._source, self._path, self._part = source, path, part
        self._have, self._size, self._progress = have, size, progress
        self._deadline = deadline
        self._out: BinaryIO | None = None
        self._opened: Opened | None = None
        self._sink: _Sink | None = None
        self._failure: BaseException | None = None
        self._iterator = self._blocks()
        self.stream = ArchiveStream(self._iterator)

    @property
    def resumed(self) -> bool:
        """Whether this attempt continued a kept partial file."""
        return self._have > 0

    def start(self) -> None:
        threaded = self._size >= THREADED_HASH_BYTES
        pool = BufferPool(RECEIVE_BUFFERS) if threaded else None
        if self._have < self._size:
            self._open(pool)  # first: whether the source can continue after the kept bytes
        self._sink = (
            _ThreadedSink(self._out, self._part, pool) if threaded else _Sink(self._out, self._part)
        )

    def drain(self) -> None:
        """Read (hash and keep) whatever the unpacker left unread."""
        for _ in self._iterator:
            pass

    def check(self) -> None:
        """Raise what stopped the transfer while the unpacker read it (the unpacker may have
        turned it into an error of its own: a truncated archive, a zstd error)."""
        if self._failure is not None:
            raise self._failure

    def hexdigest(self) -> str:
        assert self._sink is not None
        return self._sink.finish()

    def _blocks(self) -> Iterator[bytes]:
        """Every block of the attempt in order, each given to the sink once; one generator,
        so `drain` continues where the unpacker stopped."""
        try:
            yield from self._all_blocks()
        except BaseException as error:
            self._failure = error
            raise

    def _all_blocks(self) -> Iterator[bytes]:
        yield from self._kept()
        if self._opened is None:
            return  # the kept .part was complete: nothing to fetch
        assert self._sink is not None
        for block in self._opened.chunks:
            self.position += len(block)
            if self.position > self._size:
                raise BundleRejected(
                    f"{self._source.url(self._path)}: wrong size: the source sent more than the "
                    f"catalog's {self._size} bytes",
                    hint="the mirror's copy does not belong to this catalog; re-publish it",
                )
            self._sink.add(block, keep=True)
            if self._progress:
                self._progress(self.position, self._size)
            yield block

    def _kept(self) -> Iterator[bytes]:
        if not self._have:
            return
        assert self._sink is not None
        with self._part.open("rb") as kept:
            while self.position < self._have:
                block = kept.read(min(CHUNK, self._have - self.position))
                if not block:  # the .part shrank under us: start over next attempt
                    raise TransientError(f"{self._part} changed while it was being resumed")
                self._sink.add(block, keep=False)
                self.position += len(block)
                yield block

    def _open(self, pool: BufferPool | None) -> None:
        self._opened = opened = self._source.open(self._path, self._have, self._deadline, pool)
        if opened.total is not None and opened.total != self._size:
            # Shorter is what an interrupted copy onto a USB stick or shared disk leaves, which
            # re-publishing does not mend.
            raise BundleRejected(
                f"{self._source.url(self._path)}: wrong size: the catalog says {self._size} "
                f"bytes, the source has {opened.total}",
                hint="the mirror's copy is cut short (an interrupted copy?): copy it again "
                "whole from where the mirror came from (`dllm mirror verify` checks a mirror)"
                if opened.total < self._size
                else "the mirror's copy does not belong to this catalog; re-publish it",
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
        if self._sink is not None:
            self._sink.stop()  # a helper thread hashes what it was given, then ends
        if self._out is not None:
            self._out.close()
        if self._opened is not None:
            self._opened.close()


class _Sink:
    """Where each block of the archive goes besides the unpacker: the sha256 of every block,
    and the `.part` file for the new ones (`keep`)."""

    def __init__(self, out: BinaryIO | None, part: Path) -> None:
        self._digest = hashlib.sha256()
        self._out, self._part = out, part
        self._hex: str | None = None

    def add(self, block: bytes | memoryview, keep: bool) -> None:
        self._hash(block)
        if keep:
            assert self._out is not None
            try:
                self._out.write(block)
            except OSError as error:
                message = f"cannot write {self._part}: {error.strerror}"
                if error.errno in DISK_HINTS:  # this machine's fault (an install says where)
                    hint = DISK_HINTS[error.errno]
                    raise DiskWriteError(message, hint, error.errno, self._part) from None
                raise DllmError(message, hint="check that folder and its free space") from None

    def _hash(self, block: bytes | memoryview) -> None:
        self._digest.update(block)

    def finish(self) -> str:
        self.stop()
        if self._hex is None:
            self._hex = self._digest.hexdigest()
        return self._hex

    def stop(self) -> None:
        pass


class _ThreadedSink(_Sink):
    """The same with the sha256 on a helper thread (hashlib releases the GIL), so hashing a
    large archive overlaps with receiving, keeping and unpacking it. The `.part` write stays on
    the receiving thread: the helper alone would then do the two costliest steps per byte and
    hold the transfer back.

    Blocks the source received into `pool`'s buffers go back to the pool once hashed. The
    unpacker is done with a block by then or soon after: it asks for the next block, which is
    when the source takes a buffer again, only once it has used up the last one (the `.part`
    write happened before it saw the block)."""

    def __init__(self, out: BinaryIO | None, part: Path, pool: BufferPool | None) -> None:
        import queue
        import threading

        super().__init__(out, part)
        self._pool = pool
        # Blocks are what the socket had (a static server's 64 KiB writes make most of them
        # small, at most CHUNK): 64 of them let the receiving side run ahead of a helper
        # thread the scheduler has set aside for a moment (the pool's size bounds its blocks).
        self._blocks: queue.Queue[bytes | memoryview | None] = queue.Queue(maxsize=64)
        self._thread = threading.Thread(target=self._run, name="dllm-sha256", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        update, pool = self._digest.update, self._pool
        while (block := self._blocks.get()) is not None:
            update(block)
            if pool is not None and isinstance(block, memoryview):
                pool.give(block.obj)

    def _hash(self, block: bytes | memoryview) -> None:
        self._blocks.put(block)

    def stop(self) -> None:
        if self._thread.is_alive():
            self._blocks.put(None)
            self._thread.join()
