"""Bounds on untrusted tar headers, checked before `tarfile` parses what they announce.

`tarfile` trusts the headers it reads: a pax record of any size is read whole and parsed with
regular expressions that are quadratic on crafted input (CVE-2024-6232: a 32 KB archive with a
1 GB pax record took 295 s and 1 GB of memory), and malformed pax values (`GNU.sparse.map=a,b`,
`hdrcharset=\\xff`) raise ValueError and UnicodeError from deep inside it. `open_guarded` gives
`tarfile` a reader and a `TarInfo` subclass that look at each header block first and refuse, as
`HeaderRefused`: header kinds a bundle never holds (GNU long names and sparse files, pax global
headers, two pax headers in a row), a pax header over `MAX_PAX_BYTES`, a pax record that is not
a well-formed `LEN key=value` with an allowed key and value, and more than `MAX_HEADERS` headers.

`tarfile` has no public hook between reading a header block and processing it; `_proc_member`
is that step (the same in every CPython 3 release), so the subclass extends it.
"""

from __future__ import annotations

import re
import tarfile
from collections.abc import Iterator
from typing import BinaryIO

from turbo_dllm.errors import DllmError

__all__ = ["MAX_HEADERS", "MAX_PAX_BYTES", "HeaderRefused", "member_chunks", "open_guarded"]

# 1 KiB holds any bundle path (they are short) and keeps tarfile's quadratic pax regex under a
# millisecond per header; a bundle has a few dozen members.
MAX_PAX_BYTES = 1024
MAX_HEADERS = 8200  # two per file (pax + ustar) at the 4096-file cap, and bundle.json
_SKIP_CHUNK = 1024 * 1024

_REFUSED = {
    tarfile.GNUTYPE_LONGNAME: "a GNU long-name header",
    tarfile.GNUTYPE_LONGLINK: "a GNU long-link header",
    tarfile.GNUTYPE_SPARSE: "a GNU sparse file",
    tarfile.XGLTYPE: "a pax global header",
    tarfile.SOLARIS_XHDTYPE: "a Solaris extended header",
}
_DIGITS = re.compile(rb"[0-9]{1,20}")
_TIME = re.compile(rb"-?[0-9]{1,20}(\.[0-9]{1,9})?")
_TEXT = None  # any UTF-8 text
# What tarfile's PAX_FORMAT writes for a regular file, and the link target (so that a link is
# refused by name, not as a header error). Anything else (GNU.sparse.*, hdrcharset, SCHILY.*,
# comment) has no place in a bundle.
_PAX_KEYS = {
    b"path": _TEXT,
    b"linkpath": _TEXT,
    b"uname": _TEXT,
    b"gname": _TEXT,
    b"size": _DIGITS,
    b"uid": _DIGITS,
    b"gid": _DIGITS,
    b"mtime": _TIME,
    b"atime": _TIME,
    b"ctime": _TIME,
}
_RECORD_LENGTH = re.compile(rb"([1-9][0-9]{0,5}) ")  # bounded: no backtracking on digit runs

# What to do about a refused header: `dllm bundle build` writes one short pax header (path, size,
# times, owner) and one ustar header per file, so an archive with others was made another way.
TOO_MANY_HINT = (
    "a bundle holds a few dozen files; this archive is not one: rebuild it with `dllm bundle "
    "build`, or ask its publisher for one built so"
)
OTHER_TAR_HINT = (
    "another tar program (GNU tar, bsdtar) wrote it: rebuild it with `dllm bundle build`, or ask "
    "its publisher for one built so"
)
PAX_HINT = (
    "`dllm bundle build` writes only short pax headers (path, size, times, owner): the archive "
    "was made another way or altered; rebuild it with `dllm bundle build`, or ask its publisher "
    "for one built so"
)


class HeaderRefused(DllmError):
    """A tar header outside the bounds; the caller names the archive."""


class _GuardedReader:
    """The decompressed archive as `tarfile` reads it (forward only), with `peek` so a pax
    payload can be checked before tarfile reads it, and the per-archive header state."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._pending = b""
        self._position = 0
        self.headers = 0
        self.after_pax = False

    def tell(self) -> int:
        return self._position

    def read(self, n: int) -> bytes:
        if n < 0:  # tarfile always asks for a size; an unbounded read of hostile data is a bug
            raise ValueError("unbounded read of an untrusted archive")
        if self._pending:
            data, self._pending = self._pending[:n], self._pending[n:]
            if len(data) < n:
                data += self._stream.read(n - len(data))
        else:
            data = self._stream.read(n)
        self._position += len(data)
        return data

    def readinto(self, buffer: memoryview) -> int:
        if self._pending:
            data = self.read(len(buffer))
            buffer[: len(data)] = data
            return len(data)
        got = self._stream.readinto(buffer)
        self._position += got
        return got

    def peek(self, n: int) -> bytes:
        data = self.read(n)
        self._pending = data + self._pending
        self._position -= len(data)
        return data

    def seek(self, position: int, whence: int = 0) -> int:
        if whence != 0 or position < self._position:
            raise ValueError("a bundle archive is read forward only")
        while self._position < position:
            if not self.read(min(position - self._position, _SKIP_CHUNK)):
                break
        return self._position


class _GuardedTarInfo(tarfile.TarInfo):
    def _proc_member(self, tarfile):  # noqa: ANN001 - tarfile's own signature
        _check_header(self, tarfile.fileobj)
        return super()._proc_member(tarfile)


def _check_header(info: tarfile.TarInfo, reader: _GuardedReader) -> None:
    reader.headers += 1
    if reader.headers > MAX_HEADERS:
        raise HeaderRefused(f"more than {MAX_HEADERS} tar headers (the cap)", TOO_MANY_HINT)
    if info.type in _REFUSED:
        raise HeaderRefused(
            f"{_REFUSED[info.type]} ({info.name!r}); bundles hold only regular files",
            OTHER_TAR_HINT,
        )
    after_pax, reader.after_pax = reader.after_pax, info.type == tarfile.XHDTYPE
    if info.type != tarfile.XHDTYPE:
        return
    if after_pax:
        raise HeaderRefused("two pax headers in a row", PAX_HINT)
    if info.size > MAX_PAX_BYTES:
        raise HeaderRefused(
            f"a {info.size}-byte pax header, over the {MAX_PAX_BYTES}-byte cap", PAX_HINT
        )
    _check_pax_records(reader.peek(info.size))


def _check_pax_records(payload: bytes) -> None:
    """Every record `LEN key=value\\n` well formed, the records tiling the payload exactly."""
    position = 0
    while position < len(payload):
        match = _RECORD_LENGTH.match(payload, position)
        end = position + int(match.group(1)) if match else 0
        if match is None or end > len(payload) or payload[end - 1 : end] != b"\n":
            raise HeaderRefused(
                f"a malformed pax record at byte {position} of its header", PAX_HINT
            )
        key, equals, value = payload[match.end() : end - 1].partition(b"=")
        if not equals or key not in _PAX_KEYS:
            shown = key.decode("ascii", "backslashreplace")
            raise HeaderRefused(f"pax keyword {shown!r} is not allowed in a bundle", PAX_HINT)
        if not _valid_value(value, _PAX_KEYS[key]):
            shown = value[:40].decode("ascii", "backslashreplace")
            raise HeaderRefused(f"pax record {key.decode()}={shown!r} is not valid", PAX_HINT)
        position = end


def _valid_value(value: bytes, pattern: re.Pattern[bytes] | None) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return pattern is None or pattern.fullmatch(value) is not None


def open_guarded(stream: BinaryIO) -> tarfile.TarFile:
    """`tarfile` over `stream` (the decompressed archive, read forward only), every header
    checked first; a refused header raises `HeaderRefused` from whichever call reads it."""
    return tarfile.open(fileobj=_GuardedReader(stream), mode="r:", tarinfo=_GuardedTarInfo)


def member_chunks(
    tar: tarfile.TarFile, member: tarfile.TarInfo, chunk: int
) -> Iterator[memoryview]:
    """A regular member's bytes, `chunk` at a time, read straight from the archive stream
    (tarfile's own file object copies every block once more into its buffer) into one reused
    buffer: each block is valid until the next is asked for. A fresh 1 MiB bytes object per
    block would cost a page fault per 4 KiB in a new process (glibc serves them with mmap
    until its threshold adapts): 30,000 faults, more CPU than zstd itself, for 64 MiB."""
    reader = tar.fileobj
    assert isinstance(reader, _GuardedReader)
    reader.seek(member.offset_data)
    buffer = memoryview(bytearray(min(chunk, member.size)))
    left = member.size
    while left:
        got = reader.readinto(buffer[: min(chunk, left)])
        if not got:
            raise tarfile.ReadError(f"unexpected end of data in {member.name!r}")
        left -= got
        yield buffer[:got]
