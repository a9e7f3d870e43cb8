"""Read raw records from every supported source, in a fixed order, in chunks for the workers.

A source yields `RawChunk`s: a list of items plus where each came from (file and line or row, for
error messages), and how far the progress bar advances. JSONL lines travel to the workers as raw
bytes so JSON parsing happens in parallel too. Provenance (file names relative to their common
folder, sizes, sha256; dataset names and fingerprints) never holds a local path.
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import json
import os
import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from turbo_dllm.data.spec import (
    MAX_SEQ_LEN,
    HuggingFaceSource,
    JsonlSource,
    ParquetSource,
    TextSource,
    TokenIdsSource,
)
from turbo_dllm.errors import DllmError, os_error_hint

__all__ = [
    "MAX_ITEM_BYTES",
    "Oversized",
    "Payload",
    "RawChunk",
    "Source",
    "expand_paths",
    "open_source",
]

# What a chunk's items are: raw JSON lines (bytes), record dicts, plain texts (raw bytes, decoded
# by the workers), token id arrays, or raw JSON lines that each hold a list of ids.
Payload = Literal["json", "record", "text", "ids", "json_ids"]

UTF8_BOM = b"\xef\xbb\xbf"  # what some editors write before UTF-8 text (Windows Notepad)
CHUNK_BYTES = 1 << 20
CHUNK_ITEMS = 1024
# A document of token ids longer than this reaches the workers in pieces of this many ids, one
# chunk each: a 1-D token file without a separator is one document, and processed whole it took
# ~18x its size in memory. Never below the longest sequence, so a cut document is longer than any
# row: packing.overflow truncate keeps part of its first piece only, reject refuses it there.
PIECE_IDS = MAX_SEQ_LEN
# Separator scans of a 1-D id array go this many ids at a time (no array-sized temporary).
SCAN_IDS = 1 << 24
# The largest line (JSONL, text lines) or whole-file document read into memory: far past any real
# record, and it bounds what one item costs a worker (a runaway or corrupt file has no newline).
MAX_ITEM_BYTES = 32 << 20


@dataclass(frozen=True)
class Oversized:
    """Stands for an item longer than MAX_ITEM_BYTES, which is never held in memory whole.

    It travels to the worker like any item and becomes a bad record there (stop or skip).
    """

    bytes: int  # how long the item is (a line: up to its newline)

    def message(self) -> str:
        return f"{self.bytes:,} bytes, more than the {MAX_ITEM_BYTES >> 20} MiB a record may have"


@dataclass
class RawChunk:
    payload: Payload
    items: list[Any]
    label: str  # file or dataset shown in error messages
    numbers: list[int]  # line (1-based) or row (0-based) of each item
    style: Literal["line", "row", "file"]
    advance: int = 0  # progress units covered by this chunk
    # One label per item: style "file" (each item is a file), or style "row" when the items
    # come from several files (datasets' data_files), `numbers` then counting within each.
    labels: list[str] | None = None
    # (offset, length) where the chunk's one item is a piece of a longer document of token ids
    # (see PIECE_IDS): the piece starts `offset` ids into a document of `length` ids.
    piece: tuple[int, int] | None = None

    def where(self, index: int) -> str:
        if self.style == "line":
            return f"{self.label}:{self.numbers[index]}"
        if self.style == "row":
            label = self.labels[index] if self.labels else self.label
            return f"{label} row {self.numbers[index]}"
        return self.labels[index] if self.labels else self.label


class _FileLog:
    """What prepare knows of each source file: how it looked before it was read (size,
    modification time, inode), and the size and sha256 of its bytes where a reader read it
    whole, front to back, hashing as it went (JSONL and text files, plain or `.gz`)."""

    def __init__(self, files: list[Path]) -> None:
        self.before = {path: _identity(path) for path in files}
        self.read: dict[Path, tuple[int, str]] = {}

    def record(self, path: Path, reader: _HashingReader) -> None:
        if reader.whole:
            self.read[path] = (reader.size, reader.digest.hexdigest())

    def hash_whole(self, path: Path) -> tuple[int, str]:
        """Read `path` front to back now and record its size and sha256 (an unreadable file
        is left to the reader that comes next to report)."""
        hashed = _hash_file(path)
        if hashed is None:
            return 0, hashlib.sha256().hexdigest()
        self.read[path] = hashed
        return hashed


def _hash_file(path: Path) -> tuple[int, str] | None:
    """`path`'s size and sha256, read front to back; None where it cannot be read."""
    digest = hashlib.sha256()
    size = 0
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 22), b""):
                digest.update(block)
                size += len(block)
    except OSError:
        return None
    return size, digest.hexdigest()


def _identity(path: Path) -> tuple[int, int, int, int] | None:
    try:
        info = path.stat()
    except OSError:
        return None
    return (info.st_size, info.st_mtime_ns, info.st_ino, info.st_dev)


class _HashingReader:
    """A binary file read front to back (as `open` gives it, or under a GzipFile) that hashes
    every byte read from it, so the provenance hash is of what was read, without a second read.

    `whole` once a read reached the end of the file; a seek makes the hash unusable.
    """

    def __init__(self, raw) -> None:
        self._raw = raw
        self.digest = hashlib.sha256()
        self.size = 0
        self.whole = False
        self._sought = False

    def _take(self, data: bytes, at_end: bool) -> bytes:
        if not self._sought:
            self.digest.update(data)
            self.size += len(data)
            self.whole = self.whole or at_end
        return data

    def read(self, size: int | None = -1) -> bytes:
        data = self._raw.read(size)
        # A buffered file returns fewer bytes than asked for only at its end.
        return self._take(data, size is None or size < 0 or len(data) < size)

    def readline(self, size: int | None = -1) -> bytes:
        data = self._raw.readline(size)
        return self._take(data, not data and size != 0)

    def seek(self, *args) -> int:
        self._sought = True
        self.whole = False
        return self._raw.seek(*args)

    def tell(self) -> int:
        return self._raw.tell()

    def readable(self) -> bool:
        return True


@dataclass
class Source:
    """An opened source: `chunks()` iterates it once; `total`/`unit` drive the progress bar."""

    kind: str
    chunks: Any  # Callable[[], Iterator[RawChunk]]
    total: int | None
    unit: str
    files: list[Path] = field(default_factory=list)
    dataset: dict[str, Any] | None = None
    log: _FileLog | None = None  # made before the files were read (open_source)

    def provenance(self) -> dict[str, Any]:
        """The source's record for the manifest, once every file has been read: a file that
        changed meanwhile is an error (the artifact would not match its hash)."""
        return {
            "kind": self.kind,
            "files": _file_provenance(self.files, self.log or _FileLog(self.files)),
            "dataset": self.dataset,
        }


def expand_paths(
    patterns: list[str], output: Path | None = None, files: str = "*.jsonl"
) -> list[Path]:
    """Files matching each pattern, sorted per pattern, first occurrence kept (`files`: the glob
    of the source's files, for the hint on a folder named as a file).

    No file inside `output` (the artifact folder the job writes, which it replaces) is a
    source: a pattern reaching into it (`data/**/*` with output `data/prepared`) leaves its
    files out, or a rerun would read the last run's artifact as data; a pattern that matches
    nothing else, or names such a file, is an error.
    """
    seen: set[Path] = set()
    out: list[Path] = []
    for pattern in patterns:
        if glob.has_magic(pattern):
            matches = sorted(Path(p) for p in glob.glob(pattern, recursive=True))
            matches = [p for p in matches if _regular_file(p, pattern)]
            if not matches and _regular_file(Path(pattern), pattern):
                matches = [Path(pattern)]  # a file named with [ ] * ?, as in `corpus[v2].jsonl`
        else:
            named = _regular_file(Path(pattern), pattern, named=True, files=files)
            matches = [Path(pattern)] if named else []
        kept = [p for p in matches if not _inside(p, output)]
        if matches and not kept:
            what = "matches only files" if glob.has_magic(pattern) else "is a file"
            raise DllmError(
                f"source path {_shown(pattern)} {what} inside output.path "
                f"{_shown(str(output))}, the artifact this job replaces",
                hint="point source paths at the input files, or output.path elsewhere",
            )
        matches = kept
        if not matches:
            what = "no file matches" if glob.has_magic(pattern) else "file not found:"
            raise DllmError(
                f"{what} {_shown(pattern)}",
                # The path may come from --set, taken against the current folder: "relative to
                # the file's folder" sent the user to look in the wrong place.
                hint="a path written in prepare.yaml is taken against that file's folder, one "
                "given with --set against the current folder; fix it, or the command's folder",
            )
        for path in matches:
            if path not in seen:
                seen.add(path)
                out.append(path)
            elif not glob.has_magic(pattern):
                # Named outright again (to weight it?): say so, rather than read it once
                # silently. Globs that overlap (`*.jsonl` and `extra.jsonl`) are not told.
                print(
                    f"dllm: note: source path {_shown(pattern)} names a file listed before; "
                    "each file is read once (to read its records twice, name a copy of it)",
                    file=sys.stderr,
                )
    return out


def _inside(path: Path, folder: Path | None) -> bool:
    """Whether `path` lies inside `folder` (both as the file system resolves them)."""
    if folder is None or not folder.is_dir():
        return False
    try:
        return folder in path.resolve().parents
    except OSError:  # a loop of links: _regular_file has let it through, it is no artifact's
        return False


# A file a parquet source lists that pyarrow cannot open (cut short, or of another format).
_PARQUET_FIX = (
    "check that the file is complete (a download or copy cut short?) and is Parquet; a file of "
    "another format takes its own source.kind (jsonl, text, token_ids)"
)

_NOT_REGULAR = {
    stat.S_IFDIR: "a directory",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFIFO: "a pipe",
    stat.S_IFSOCK: "a socket",
}


def _regular_file(path: Path, pattern: str, named: bool = False, files: str = "*.jsonl") -> bool:
    """Whether `path` is a regular file; a file named outright that is something else (a
    device such as /dev/zero, a folder) is an error, not a missing file."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return False
    except OSError as error:  # a name too long, a loop of links, no permission
        raise DllmError(
            f"cannot read {_shown(pattern)}: {error.strerror}",
            hint=os_error_hint(error.errno or 0) or "check that path in source.paths",
        ) from None
    if stat.S_ISREG(mode):
        return True
    if named:
        what = _NOT_REGULAR.get(stat.S_IFMT(mode), "not a regular file")
        hint = (
            f"name the files inside it, e.g. {str(Path(pattern) / _files_glob(path, files))!r}"
            if stat.S_ISDIR(mode)
            else "sources read regular files"
        )
        raise DllmError(f"source path {_shown(pattern)} is {what}, not a regular file", hint=hint)
    return False


def _files_glob(folder: Path, files: str) -> str:
    """A glob of the files a folder holds, by their most common ending (`*.txt`, `*.jsonl.gz`),
    else `files` (the source kind's), under `**/` where it holds folders only: the hint said
    `*.jsonl` for any folder, which matched nothing in a folder of text or Parquet files."""
    endings: dict[str, int] = {}
    folders = False
    try:
        for entry in os.scandir(folder):
            if entry.name.startswith("."):
                continue
            if entry.is_file():
                suffixes = Path(entry.name).suffixes
                ending = "".join(suffixes[-2:] if suffixes[-1:] == [".gz"] else suffixes[-1:])
                endings[ending] = endings.get(ending, 0) + 1
            folders = folders or entry.is_dir()
    except OSError:
        pass
    if ending := max(endings, key=lambda e: (bool(e), endings[e]), default=""):
        return f"*{ending}"
    return f"**/{files}" if folders and not endings else files


def _shown(pattern: str, limit: int = 200) -> str:
    """A path as error messages quote it: whole, unless absurdly long."""
    if len(pattern) <= limit:
        return repr(pattern)
    return repr(f"{pattern[: limit // 2]}...{pattern[-limit // 2 :]}") + f" ({len(pattern)} chars)"


def _unreadable(label: str, path: Path, error: BaseException) -> DllmError:
    """A source file that failed mid-read: most often a .gz that is damaged or cut short."""
    hint = "check that the file reads whole (`cat FILE > /dev/null`)"
    if path.name.endswith(".gz"):
        hint = (
            "the file is damaged or cut short (an interrupted copy?): `gzip -t FILE` checks "
            "it; copy it again, or leave it out of source.paths"
        )
    return DllmError(f"{label}: cannot read: {error}", hint=hint)


def _label(path: Path) -> str:
    """How error messages name a file: relative to the working directory when under it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _file_provenance(files: list[Path], log: _FileLog) -> list[dict[str, Any]]:
    """Name, size and sha256 of every file: as its reader hashed it, else hashed here (a
    reader that does not read a file whole, front to back: parquet, arrays, datasets'
    builders). A file that is not as it was before it was read is refused, since the
    artifact could no longer be traced to it."""
    if not files:
        return []
    root = Path(os.path.commonpath([str(p.parent) for p in files]))
    out = []
    for path in files:
        # else hashed here; an unreadable one is refused below (it was readable before)
        size, sha256 = log.read.get(path) or _hash_file(path) or (0, "")
        _check_unchanged(path, log.before.get(path))
        out.append({"name": path.relative_to(root).as_posix(), "bytes": size, "sha256": sha256})
    return out


def _check_unchanged(path: Path, before: tuple[int, int, int, int] | None) -> None:
    now = _identity(path)
    if now == before and now is not None:
        return
    if now is None:
        what = "it is gone"
    elif before is None or now[2:] != before[2:]:
        what = "another file took its name"
    elif now[0] != before[0]:
        what = f"{before[0]:,} bytes when prepare opened it, {now[0]:,} bytes now"
    else:
        what = "it was modified"
    raise DllmError(
        f"{_label(path)}: the source file changed while prepare read it ({what}); the "
        "artifact would not match it, so none was written",
        hint="run prepare again once nothing writes to the source files",
    )


# --- line-oriented files ------------------------------------------------------------------------


# Byte order marks of the encodings a text file may be in that are not UTF-8 (UTF-32 first: its
# little-endian mark starts with UTF-16's). PowerShell 5's `>` and Notepad's "Unicode" write them.
_OTHER_BOMS = (
    (b"\xff\xfe\x00\x00", "UTF-32"),
    (b"\x00\x00\xfe\xff", "UTF-32"),
    (b"\xff\xfe", "UTF-16"),
    (b"\xfe\xff", "UTF-16"),
)


# How much of a text file's start is looked at for NUL bytes (`_refuse_other_encodings`), and
# the share of NULs there that no UTF-8 text has (an occasional NUL in real text is kept).
_HEAD_BYTES = 1 << 16
_NUL_SHARE = 0.25
_MIN_NULS = 16


def _unmarked_encoding(head: bytes) -> str | None:
    """The encoding of text whose first bytes are `head`, where a quarter or more of them (16
    at least) are NUL bytes, which UTF-8 text does not hold, in the pattern of UTF-16 or
    UTF-32 without a byte order mark (each ASCII character with NUL bytes beside it: every
    other byte, or three of four), named with its byte order. None for text with no more than
    a few NULs, and for NULs in no such pattern (a binary file: read as UTF-8 text, as before;
    where it is not UTF-8 it is a bad record)."""
    nuls = head.count(0)
    if nuls < _MIN_NULS or nuls < _NUL_SHARE * len(head):
        return None
    share = [head[k::4].count(0) / len(head[k::4]) for k in range(4)]
    if min(share[1:]) > 0.9 and share[0] < 0.5:
        return "UTF-32LE"
    if min(share[:3]) > 0.9 and share[3] < 0.5:
        return "UTF-32BE"
    even, odd = head[0::2].count(0), head[1::2].count(0)
    if odd > 0.9 * nuls:
        return "UTF-16LE"
    if even > 0.9 * nuls:
        return "UTF-16BE"
    return None


def _refuse_other_encodings(head: bytes, label: str) -> None:
    """Stop at a file that starts with a UTF-16 or UTF-32 byte order mark, or whose first
    bytes (`head`, from its start) are UTF-16 or UTF-32 text without one (a quarter or more of
    them NUL): read as UTF-8, its lines would be bad records or, worse, text with a NUL between
    every character."""
    for mark, encoding in _OTHER_BOMS:
        if head.startswith(mark):
            raise DllmError(
                f"{label}: the file is {encoding} text (it starts with a {encoding} byte order "
                "mark); sources read UTF-8",
                hint=f"convert it to UTF-8, e.g. `iconv -f {encoding} -t UTF-8 FILE > NEW`",
            )
    head = head[:_HEAD_BYTES]
    encoding = _unmarked_encoding(head)
    if encoding is None:
        return
    nuls = f"{head.count(0) / len(head):.0%} of its first {len(head):,} bytes are NUL"
    raise DllmError(
        f"{label}: {nuls}: the file looks like {encoding} text without a byte order mark (NUL "
        "bytes beside each character); read as UTF-8 it would be text with NULs between its "
        "characters. Sources read UTF-8",
        hint=f"convert it to UTF-8, e.g. `iconv -f {encoding} -t UTF-8 FILE > NEW`",
    )


def _lines(stream, label: str) -> Iterator[tuple[int, bytes | Oversized]]:
    """(line number, line) of a binary stream, each line read with a bounded buffer; a UTF-8
    byte order mark that starts the stream is dropped (it marks the encoding, it is no text),
    a UTF-16 or UTF-32 one is an error, and so is UTF-16 or UTF-32 text without one: the
    stream's first 64 KiB are checked before any line is handed on."""
    number = 0
    start = b""  # the stream's first bytes, until checked
    held: list[tuple[int, bytes | Oversized]] = []
    checked = False
    while line := stream.readline(MAX_ITEM_BYTES + 1):
        number += 1
        if not checked:
            start += line[: _HEAD_BYTES - len(start)]
        item: bytes | Oversized
        if len(line) <= MAX_ITEM_BYTES or line.endswith(b"\n"):
            item = line.removeprefix(UTF8_BOM) if number == 1 else line
        else:
            size = len(line)  # read the rest of this line in bounded pieces, keeping none of it
            while (rest := stream.readline(MAX_ITEM_BYTES)) and not rest.endswith(b"\n"):
                size += len(rest)
            item = Oversized(size + len(rest))
        if checked:
            yield number, item
            continue
        held.append((number, item))
        if len(start) >= _HEAD_BYTES or isinstance(item, Oversized):
            _refuse_other_encodings(start, label)
            checked = True
            yield from held
            held = []
    if held:
        _refuse_other_encodings(start, label)
        yield from held


def _line_chunks(files: list[Path], payload: Payload, log: _FileLog) -> Iterator[RawChunk]:
    """Non-blank lines of (possibly gzipped) files, as raw bytes; progress in on-disk bytes."""
    for path in files:
        label = _label(path)
        with open(path, "rb") as handle:
            raw = _HashingReader(handle)
            stream = gzip.GzipFile(fileobj=raw) if path.name.endswith(".gz") else raw
            items: list[bytes | Oversized] = []
            numbers: list[int] = []
            size = 0
            position = 0
            first = payload == "json"  # the first record line is checked for a JSON document
            try:
                for number, line in _lines(stream, label):
                    if isinstance(line, bytes) and not line.strip():
                        continue
                    if first:
                        _refuse_json_document(line, label)
                        first = False
                    items.append(line)
                    numbers.append(number)
                    size += len(line) if isinstance(line, bytes) else MAX_ITEM_BYTES
                    if size >= CHUNK_BYTES or len(items) >= CHUNK_ITEMS:
                        now = raw.tell()
                        yield RawChunk(payload, items, label, numbers, "line", now - position)
                        position, items, numbers, size = now, [], [], 0
            except (OSError, EOFError) as error:  # a corrupt .gz
                raise _unreadable(label, path, error) from None
            end = raw.tell()
            log.record(path, raw)
            if items or end > position:
                yield RawChunk(payload, items, label, numbers, "line", end - position)


def _refuse_json_document(line: bytes | Oversized, label: str) -> None:
    """Stop at a JSONL file that is one JSON document instead: an array of records (what
    `json.dump(rows, f)` writes, how Alpaca's data ships), on one line or pretty-printed, or a
    pretty-printed object. Its first line (`line`) was a bad record, with 'fix that record, or
    set on_error: skip' as the way out, and under skip every line was one."""
    if isinstance(line, Oversized):
        return
    stripped = line.strip()
    if stripped == b"{":
        raise DllmError(
            f"{label}: the file is one JSON object written over several lines (its first line "
            "is '{'), not JSON Lines (one object per line)",
            hint="write one record per line, e.g. `jq -c '.KEY[]' FILE > NEW.jsonl` for the "
            "records in its list KEY, and read NEW.jsonl",
        )
    if not stripped.startswith(b"["):
        return
    if stripped != b"[":
        try:
            document = json.loads(stripped)
        except (ValueError, RecursionError):
            return  # a line cut short or mistyped: a bad record like any other
        if not isinstance(document, list):
            return
    raise DllmError(
        f"{label}: the file is a JSON array (it starts with '['), not JSON Lines (one object "
        "per line)",
        hint="read it with source {kind: huggingface, data_files: [FILE]} (datasets' json "
        "builder reads an array of records), or write it as JSON Lines: "
        "`jq -c '.[]' FILE > NEW.jsonl`",
    )


def _text_chunks(files: list[Path], unit: str, log: _FileLog) -> Iterator[RawChunk]:
    """Texts as raw bytes: the workers decode them, so a line or file that is not UTF-8 is a
    bad record like any other (stop, or skip and count)."""
    if unit == "line":
        for chunk in _line_chunks(files, "text", log):
            chunk.items = [
                line if isinstance(line, Oversized) else line.rstrip(b"\r\n")
                for line in chunk.items
            ]
            yield chunk
        return
    items: list[bytes | Oversized] = []
    labels: list[str] = []
    size = advance = 0
    for path in files:
        data, on_disk = _read_document(path, log)
        items.append(data)
        labels.append(_label(path))
        size += MAX_ITEM_BYTES if isinstance(data, Oversized) else len(data)
        advance += on_disk
        if size >= CHUNK_BYTES or len(items) >= CHUNK_ITEMS:
            yield _file_chunk("text", items, labels, advance)
            items, labels, size, advance = [], [], 0, 0
    if items:
        yield _file_chunk("text", items, labels, advance)


def _read_document(path: Path, log: _FileLog) -> tuple[bytes | Oversized, int]:
    """A whole file as one document (without a leading UTF-8 byte order mark), or Oversized,
    and the bytes it took on disk (progress).

    `.gz` files are decompressed, as the line reader does; reads are bounded, since the file
    may grow meanwhile or inflate far past its size on disk.
    """
    with open(path, "rb") as handle:
        raw = _HashingReader(handle)
        stream = gzip.GzipFile(fileobj=raw) if path.name.endswith(".gz") else raw
        try:
            data = stream.read(MAX_ITEM_BYTES + 1)
            _refuse_other_encodings(data, _label(path))
            if len(data) <= MAX_ITEM_BYTES:
                document: bytes | Oversized = data.removeprefix(UTF8_BOM)
            elif stream is raw:  # the rest is not read (its provenance hash reads it)
                document = Oversized(max(path.stat().st_size, len(data)))
            else:
                size = len(data)  # count the rest in bounded pieces, keeping none of it
                while piece := stream.read(MAX_ITEM_BYTES):
                    size += len(piece)
                document = Oversized(size)
        except (OSError, EOFError) as error:  # a corrupt .gz
            raise _unreadable(_label(path), path, error) from None
        log.record(path, raw)
        return document, raw.tell()


def _file_chunk(payload: Payload, items: list[Any], labels: list[str], advance: int) -> RawChunk:
    """A chunk whose items are whole files, each labelled by its own file name."""
    return RawChunk(payload, items, "", list(range(len(items))), "file", advance, labels)


# --- parquet ------------------------------------------------------------------------------------


def _parquet_chunks(files: list[Path], columns: list[str] | None) -> Iterator[RawChunk]:
    import pyarrow.parquet as pq

    for path in files:
        label = _label(path)
        try:
            parquet = pq.ParquetFile(path)
        except Exception as error:  # pyarrow raises ArrowInvalid / OSError for bad files
            raise DllmError(
                f"{label}: not a readable parquet file: {error}", hint=_PARQUET_FIX
            ) from None
        names = set(parquet.schema_arrow.names)
        # Read only the needed columns; where one is missing, read all so the error lists
        # every column (the misnamed one among them), not just those that were read.
        wanted = columns if columns is not None and set(columns) <= names else None
        row = 0
        for batch in parquet.iter_batches(batch_size=CHUNK_ITEMS, columns=wanted or None):
            for start, stop in _row_slices(batch.num_rows, batch.nbytes):
                rows = batch.slice(start, stop - start).to_pylist()
                yield RawChunk(
                    "record", rows, label, list(range(row, row + len(rows))), "row", len(rows)
                )
                row += len(rows)


def _row_slices(rows: int, nbytes: int) -> list[tuple[int, int]]:
    """Row ranges that cut an Arrow batch of `rows` rows and `nbytes` bytes into chunks of
    about CHUNK_BYTES (at least one row each), as the line readers cut theirs: a batch of long
    documents becomes several chunks for the workers to share, not one that a single worker
    tokenizes while the others wait (and that every worker in flight holds in memory)."""
    if rows <= 0:
        return []
    parts = max(1, min(rows, -(-nbytes // CHUNK_BYTES)))
    step = -(-rows // parts)
    return [(start, min(start + step, rows)) for start in range(0, rows, step)]


# --- token ids ----------------------------------------------------------------------------------


def _split_ids(array: np.ndarray, separator: int | None) -> Iterator[np.ndarray]:
    """The documents of a 1-D id array (views of it), split at `separator`. A separator at the
    very start or end of the array marks where the first document starts or the last one ends
    (files that put one before every document, or after every one), not an empty document
    beyond it; two in a row anywhere else do hold an empty one."""
    if separator is None:
        yield array
        return
    cuts = np.concatenate(
        [np.zeros(0, np.int64)]
        + [
            np.flatnonzero(array[start : start + SCAN_IDS] == separator) + start
            for start in range(0, len(array), SCAN_IDS)
        ]
    )
    starts = np.concatenate([[0], cuts + 1])
    ends = np.concatenate([cuts, [len(array)]])
    first = 1 if len(cuts) and cuts[0] == 0 else 0
    last = len(starts) - (1 if len(cuts) and cuts[-1] == len(array) - 1 else 0)
    for start, end in zip(starts[first:last], ends[first:last], strict=True):  # no list copies
        yield array[start:end]


def _id_chunks(docs: Iterator[np.ndarray], label: str) -> Iterator[RawChunk]:
    """Documents of token ids in chunks of up to CHUNK_ITEMS documents or CHUNK_BYTES; one longer
    than PIECE_IDS in pieces, one chunk each (`RawChunk.piece`)."""
    part: list[np.ndarray] = []
    numbers: list[int] = []
    size = 0
    for number, doc in enumerate(docs):
        if len(doc) > PIECE_IDS:
            if part:
                yield RawChunk("ids", part, label, numbers, "row", size)
                part, numbers, size = [], [], 0
            for offset in range(0, len(doc), PIECE_IDS):
                piece = doc[offset : offset + PIECE_IDS]
                yield RawChunk(
                    "ids", [piece], label, [number], "row", piece.nbytes, piece=(offset, len(doc))
                )
            continue
        part.append(doc)
        numbers.append(number)
        size += doc.nbytes
        if len(part) >= CHUNK_ITEMS or size >= CHUNK_BYTES:
            yield RawChunk("ids", part, label, numbers, "row", size)
            part, numbers, size = [], [], 0
    if part:
        yield RawChunk("ids", part, label, numbers, "row", size)


def _load_npy(path: Path, label: str) -> np.ndarray:
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, EOFError, OSError) as error:  # empty, truncated, pickled, bad header
        raise DllmError(
            f"{label}: not a readable .npy array: {error}",
            hint="write it with numpy.save(path, ids) from an integer array (an object array "
            "needs pickle, which is not read), and check that the copy is complete",
        ) from None
    if not isinstance(array, np.ndarray):  # an .npz archive under an .npy name
        raise DllmError(
            f"{label}: not a .npy array (an .npz archive?)",
            hint="save each array of the .npz as its own .npy (numpy.save) and list those",
        )
    return array


def _map_bin(path: Path, label: str, dtype: str | None) -> np.ndarray:
    if dtype is None:  # a glob matched it, so the spec check could not see the .bin name
        raise DllmError(
            f"{label}: a .bin token file needs its element type",
            hint="set source.dtype (uint16, uint32, int32 or int64)",
        )
    element = np.dtype(dtype).newbyteorder("<")
    size = path.stat().st_size
    if size == 0:
        raise DllmError(
            f"{label}: empty file (no token ids)",
            hint="leave that file out of source.paths (or out of the folder its glob matches)",
        )
    if size % element.itemsize:
        raise DllmError(
            f"{label}: {size} bytes is not a whole number of {dtype} ids "
            f"({element.itemsize} bytes each)",
            hint="check source.dtype, or whether the file was cut short",
        )
    return np.memmap(path, dtype=element, mode="r")


def _check_id_width(
    array: np.ndarray, label: str, bin_file: bool, text_ids: int | None, separator: int | None
) -> None:
    """Refuse a file whose element type cannot hold every id the tokenizer encodes text to, or
    the `document_separator_id` it is split at.

    Such a file was written by cutting wider ids down (nanoGPT's `arr[i:j] = ids` into a uint16
    memmap, `.astype(np.uint16)`): an id past the type's range wrapped around to another
    token's, which reads as a valid id, so nothing after would notice. A separator past the
    range (an eos id above 65,535 of a tokenizer whose other ids fit) is never found in it: the
    file read as one document, its wrapped separators as text.
    """
    largest = int(np.iinfo(array.dtype).max)
    what = f"source.dtype {array.dtype.name}" if bin_file else f"a {array.dtype.name} array"
    if separator is not None and separator > largest and array.ndim == 1:
        raise DllmError(
            f"{label}: {what} holds ids up to {largest:,}, but source.document_separator_id is "
            f"{separator:,}: the file cannot hold it, so it would be read as one document, and "
            f"separators written into it as {array.dtype.name} wrapped around to other tokens' "
            "ids, which would be read as text",
            hint="write the ids again from the tokenizer's output (this file has lost any "
            "separator) as "
            + ("uint32, and set source.dtype: uint32" if bin_file else "uint32 (or int64)")
            + "; or set source.document_separator_id to the id that separates its documents",
        )
    if text_ids is None or text_ids - 1 <= largest:
        return
    raise DllmError(
        f"{label}: {what} holds ids up to {largest:,}, but the tokenizer encodes text to ids up "
        f"to {text_ids - 1:,}: written as {array.dtype.name}, its larger ids wrapped around to "
        "other tokens' ids, which would be read as those tokens",
        hint="write the ids again from the tokenizer's output (this file has lost them) as "
        + ("uint32, and set source.dtype: uint32" if bin_file else "uint32 (or int64)"),
    )


def _token_id_chunks(
    source: TokenIdsSource, files: list[Path], log: _FileLog, text_ids: int | None = None
) -> Iterator[RawChunk]:
    for path in files:
        label = _label(path)
        name = path.name
        if name.endswith((".jsonl", ".jsonl.gz")):
            yield from _line_chunks([path], "json_ids", log)
            continue
        if name.endswith(".npy"):
            array = _load_npy(path, label)
        elif name.endswith(".bin"):
            array = _map_bin(path, label, source.dtype)
        else:
            raise DllmError(
                f"{label}: unknown token file type",
                hint="token_ids sources read .npy, .bin, .jsonl and .jsonl.gz files",
            )
        if array.dtype.kind not in "iu" or array.ndim not in (1, 2):
            raise DllmError(
                f"{label}: expected a 1-D or 2-D integer array, got {array.dtype} "
                f"with shape {tuple(array.shape)}",
                hint="save the token ids as integers: 2-D, one document per row, or 1-D, "
                "documents split at source.document_separator_id (docs/data.md, Token ids)",
            )
        _check_id_width(array, label, name.endswith(".bin"), text_ids, source.document_separator_id)
        if array.ndim == 2:
            docs = (np.asarray(row) for row in array)
        else:
            docs = _split_ids(np.asarray(array), source.document_separator_id)
        yield from _id_chunks(docs, label)


# --- Hugging Face datasets ----------------------------------------------------------------------

_BUILDERS = {
    ".jsonl": "json",
    ".json": "json",
    ".parquet": "parquet",
    ".csv": "csv",
    ".txt": "text",
}


def _builder_for(files: list[str]) -> str:
    for suffix, builder in _BUILDERS.items():
        if all(f.removesuffix(".gz").endswith(suffix) for f in files):
            return builder
    raise DllmError(
        "cannot tell the dataset builder from source.data_files",
        hint="set source.name to json, parquet, csv or text",
    )


def _has_content(path: Path) -> bool:
    """Whether a data file holds anything but whitespace (a `.gz` file: once decompressed).

    Reads only up to the first byte that is not whitespace; an unreadable file counts as
    having content, so that the builder reports what is wrong with it.
    """
    try:
        with open(path, "rb") as raw:
            stream = gzip.GzipFile(fileobj=raw) if path.name.endswith(".gz") else raw
            while block := stream.read(1 << 16):
                if block.strip():
                    return True
    except (OSError, EOFError):
        return True
    return False


def _file_head(path: Path) -> bytes:
    """The first `_HEAD_BYTES` of a data file (a `.gz` file: decompressed); what can be read of
    them (the builder reports an unreadable file)."""
    try:
        with open(path, "rb") as raw:
            stream = gzip.GzipFile(fileobj=raw) if path.name.endswith(".gz") else raw
            return stream.read(_HEAD_BYTES)
    except (OSError, EOFError):
        return b""


# The builders that read data files as UTF-8 text: one in UTF-16 without a byte order mark is
# read as text with a NUL between its characters (the text builder raises nothing).
_TEXT_BUILDERS = ("text", "json", "csv")


def _some_files(files: list[Path], limit: int = 5) -> str:
    """File names for an error message: the first `limit`, then how many more."""
    names = ", ".join(repr(_label(p)) for p in files[:limit])
    return names + (f" and {len(files) - limit} more" if len(files) > limit else "")


def _no_rows(error: BaseException) -> bool:
    """Whether `datasets` failed because the files gave no rows at all (it says so only as a
    StopIteration from streaming's first peek, or as a split that "corresponds to no data")."""
    return isinstance(error, StopIteration) or "corresponds to no data" in str(error)


def _describe(error: BaseException) -> str:
    """`Type: message` of an error, with its root cause when it wraps one (datasets'
    DatasetGenerationError says only "An error occurred while generating the dataset")."""
    text = f"{type(error).__name__}: {error}"
    cause, seen = error, {id(error)}
    while (inner := cause.__cause__ or cause.__context__) is not None and id(inner) not in seen:
        seen.add(id(inner))
        cause = inner
    if cause is not error:
        text += f" (caused by {type(cause).__name__}: {cause})"
    return text


def _file_locator(dataset, split: str, loaded: list[Path]):
    """For rows of `data_files` read through a builder: a function from rows counted across
    all files to (file labels, rows within each file), or None where datasets does not say
    how many rows each file gave (a streaming load; a load from a cache built without that
    record). One file needs no record: every row is its."""
    if len(loaded) == 1:
        return None
    info = getattr(dataset, "info", None)
    splits = getattr(info, "splits", None) or {}
    lengths = getattr(splits.get(split), "original_shard_lengths", None)
    total = getattr(dataset, "num_rows", None)
    # The builders read one shard per data file, in order (files that give no rows at the
    # end are not listed); anything else (a sliced split) is not trusted.
    if not lengths or len(lengths) > len(loaded) or sum(lengths) != total:
        return None
    starts = np.cumsum([0, *lengths])
    labels = [_label(p) for p in loaded]

    def locate(rows: list[int]) -> tuple[list[str], list[int]]:
        index = np.minimum(np.searchsorted(starts, rows, side="right") - 1, len(lengths) - 1)
        return [labels[i] for i in index], [
            r - int(starts[i]) for r, i in zip(rows, index, strict=True)
        ]

    return locate


def _open_huggingface(
    source: HuggingFaceSource, columns: list[str] | None, output: Path | None = None
) -> Source:
    try:
        import datasets
    except ImportError as error:
        raise DllmError(
            f"a huggingface source needs the datasets library: {error}",
            hint="pip install 'turbo-dllm[data]'",
        ) from None
    from turbo_dllm.paths import dllm_home

    datasets.disable_progress_bars()
    # A builder that fails logs the error before raising it; the DllmError below names the
    # cause, so the log line would only say it twice (and ahead of `dllm: error:`).
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    files: list[Path] = []
    log = None
    given: list[Path] = []  # the data files given to the builder (the others are empty)
    builder = source.name
    described: dict[str, Any] = {"split": source.split}
    try:
        if source.path is not None:
            if not Path(source.path).is_dir():
                if Path(source.path).exists():
                    what = "a file" if Path(source.path).is_file() else "not a folder"
                    raise DllmError(
                        f"source.path {source.path!r} is {what}, not a dataset folder",
                        hint="source.path is a folder written by Dataset.save_to_disk; to read "
                        "data files (json, parquet, csv, text), list them in source.data_files",
                    )
                raise DllmError(
                    f"dataset folder not found: {source.path!r}",
                    hint="source.path is a folder written by Dataset.save_to_disk",
                )
            loaded = datasets.load_from_disk(source.path)
            if isinstance(loaded, datasets.DatasetDict):
                if source.split not in loaded:
                    raise DllmError(
                        f"split {source.split!r} not in {source.path!r} "
                        f"(splits: {', '.join(sorted(loaded))})",
                        hint="set source.split",
                    )
                loaded = loaded[source.split]
            elif "split" in source.model_fields_set and source.split != str(
                loaded.split or "train"
            ):
                # One Dataset has no splits to choose from: reading all of it would be wrong.
                saved = f" (saved from split {str(loaded.split)!r})" if loaded.split else ""
                raise DllmError(
                    f"split {source.split!r}: {source.path!r} is one dataset without splits{saved}",
                    hint="leave source.split out to read it, or set source.path to the "
                    "DatasetDict folder that has that split",
                )
            described["fingerprint"] = loaded._fingerprint
            dataset = loaded.to_iterable_dataset() if source.streaming else loaded
        else:
            data_files = None
            if source.data_files is not None:
                files = expand_paths(source.data_files, output)
                log = _FileLog(files)  # before the builder reads them
                # An empty file holds no records, and the builders fail on one (StopIteration,
                # "no columns to parse"), so it is left out of the load; all empty is an error.
                given = [p for p in files if _has_content(p)]
                data_files = [str(p) for p in given]
                if not data_files:
                    raise DllmError(
                        f"source.data_files: {_some_files(files)} "
                        + ("is empty" if len(files) == 1 else "are all empty")
                        + ": there are no records to read",
                        hint="point source.data_files at files that hold records (was a "
                        "download or export cut short?)",
                    )
            builder = source.name or _builder_for([str(p) for p in files])
            cache = dllm_home() / "cache" / "datasets"
            if given and log is not None:
                # datasets keys its cache of a local file on its path and mtime alone: a file
                # replaced by another of the same mtime (`cp -p`, `rsync -a`, an archive that
                # fixes mtimes) was read from the old one's cache. A folder per content keeps
                # each build to the bytes it read; the hashes are the provenance's too.
                key = hashlib.sha256()
                for path in given:
                    size, sha256 = log.hash_whole(path)
                    key.update(f"{size} {sha256}\n".encode())
                cache = cache / f"files-{key.hexdigest()[:24]}"
            if builder in _TEXT_BUILDERS:  # as the text source checks its files
                for path in given:
                    _refuse_other_encodings(_file_head(path), _label(path))
            if source.data_files is None:
                described.update(name=source.name, config=source.config, revision=source.revision)
            else:
                described["builder"] = builder
            # With it, a build records how many rows each data file gave (its "original
            # shards"), which lets errors name the file a bad row is in.
            was = datasets.config.SAVE_ORIGINAL_SHARD_LENGTHS
            datasets.config.SAVE_ORIGINAL_SHARD_LENGTHS = True
            try:
                dataset = datasets.load_dataset(
                    builder,
                    source.config,
                    # The files expand_paths found, escaped: datasets globs each name again.
                    data_files=[glob.escape(f) for f in data_files] if data_files else None,
                    split=source.split,
                    revision=source.revision,
                    streaming=source.streaming,
                    cache_dir=str(cache),
                )
            finally:
                datasets.config.SAVE_ORIGINAL_SHARD_LENGTHS = was
    except DllmError:
        raise
    except Exception as error:  # datasets raises many types (network, missing split, format)
        what = f"the dataset {source.path or source.name!r}"
        if files and _no_rows(error):
            raise DllmError(
                f"source.data_files: {_some_files(files)} "
                + ("holds" if len(files) == 1 else "hold")
                + f" no records (the {builder} builder found no rows)",
                hint="point source.data_files at files that hold records",
            ) from None
        if source.path is not None:
            hint = (
                "source.path is a folder written by Dataset.save_to_disk or "
                "DatasetDict.save_to_disk: check that it is one, whole, and source.split"
            )
        elif files:
            what = f"source.data_files {_some_files(files)} ({builder} builder)"
            hint = (
                f"check that the files are {builder} files (source.name sets the builder) and "
                "source.split"
            )
        else:
            hint = (
                "check source.name / config / revision / split; Hub datasets need network "
                "access or a copy in the Hugging Face cache"
            )
        raise DllmError(f"cannot load {what}: {_describe(error)}", hint=hint) from None
    names = getattr(dataset, "column_names", None)
    # Only the columns the records need; where one is missing, all of them, so that the error
    # lists every column (the misnamed one among them), as for Parquet.
    if columns is not None and names is not None and set(columns) <= set(names):
        dataset = dataset.select_columns(columns)
    total = getattr(dataset, "num_rows", None) if not source.streaming else None
    if total is not None:
        described["num_rows"] = int(total)
    label = Path(source.path).name if source.path else (source.name or "dataset")
    locate = None
    if given:
        label = _label(given[0]) if len(given) == 1 else "source.data_files"
        locate = _file_locator(dataset, source.split, given)

    def chunks() -> Iterator[RawChunk]:
        row = 0
        try:
            # Arrow batches as plain Python values, whatever format the dataset was saved
            # with: after set_format("numpy" | "torch" | "pandas") its rows would come as
            # arrays, tensors or a DataFrame, which no records kind reads.
            for batch in dataset.with_format("arrow").iter(batch_size=CHUNK_ITEMS):
                for start, stop in _row_slices(batch.num_rows, batch.nbytes):
                    rows = batch.slice(start, stop - start).to_pylist()
                    numbers = list(range(row, row + len(rows)))
                    labels = None
                    if locate is not None:
                        labels, numbers = locate(numbers)
                    yield RawChunk("record", rows, label, numbers, "row", len(rows), labels)
                    row += len(rows)
        except DllmError:
            raise
        except Exception as error:  # streaming reads can fail midway
            where = f"{label} row {row}"
            if locate is not None:
                (name,), (number,) = locate([row])
                where = f"{name} row {number}"
            raise DllmError(f"{where}: reading failed: {error}") from None

    return Source("huggingface", chunks, total, "rows", files, described, log)


# --- entry --------------------------------------------------------------------------------------


def open_source(
    source,
    columns: list[str] | None = None,
    output: Path | None = None,
    text_ids: int | None = None,
) -> Source:
    """Open `source` (a prepare.yaml source section). `columns` limits what tabular sources
    read; no file inside `output`, the artifact folder the job writes, is read. A token id
    file whose type cannot hold ids below `text_ids` (the ids the tokenizer encodes text to)
    is refused: its larger ids were wrapped around when it was written."""
    if isinstance(source, HuggingFaceSource):
        return _open_huggingface(source, columns, output)
    kinds = {"jsonl": "*.jsonl", "parquet": "*.parquet", "text": "*.txt", "token_ids": "*.npy"}
    files = expand_paths(source.paths, output, kinds.get(source.kind, "*.jsonl"))
    log = _FileLog(files)  # before anything reads them
    if isinstance(source, JsonlSource):
        return Source(
            "jsonl",
            lambda: _line_chunks(files, "json", log),
            sum(p.stat().st_size for p in files),
            "bytes",
            files,
            log=log,
        )
    if isinstance(source, TextSource):
        return Source(
            "text",
            lambda: _text_chunks(files, source.unit, log),
            sum(p.stat().st_size for p in files),
            "bytes",
            files,
            log=log,
        )
    if isinstance(source, ParquetSource):
        import pyarrow.parquet as pq

        total = 0
        for path in files:
            try:
                total += pq.ParquetFile(path).metadata.num_rows
            except Exception as error:  # pyarrow raises ArrowInvalid / OSError for bad files
                raise DllmError(
                    f"{_label(path)}: not a readable parquet file: {error}", hint=_PARQUET_FIX
                ) from None
        return Source(
            "parquet", lambda: _parquet_chunks(files, columns), total, "rows", files, log=log
        )
    if isinstance(source, TokenIdsSource):
        return Source(
            "token_ids",
            lambda: _token_id_chunks(source, files, log, text_ids),
            sum(p.stat().st_size for p in files),
            "bytes",
            files,
            log=log,
        )
    raise AssertionError(f"unhandled source {source!r}")
