"""Bundle archives: pack (`.tar.zst`, reproducible) and safe, verifying extraction.

Extraction trusts nothing in the archive. Its tar headers are bounded before `tarfile` parses
them (`targuard`: pax record size, header kinds, header count). `bundle.json` must come first
and list at most `MAX_BUNDLE_BYTES`, and at most `MAX_EXPANSION` times the archive's size, so a
small archive cannot fill the disk; every later member must be a regular file with a plain
relative path that `bundle.json` lists with the same size, and its bytes must hash to the listed
sha256. Links (symbolic or hard), devices, FIFOs, absolute paths, `..` components, duplicates
and unlisted files are refused before a byte of them is written. Whatever the damage, the
error is a `BundleRejected`, never a traceback.

An install extracts the archive as it downloads (`turbo_dllm.bundles.fetch`), before its
sha256 is known: the extraction goes to a staging folder that becomes a bundle only once the
whole archive matched the catalog's hash (verify before activate), so every check here holds
for any bytes at all.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from turbo_dllm.bundles.manifest import (
    MANIFEST_NAME,
    BundleManifest,
    check_relative_path,
    parse_manifest,
)
from turbo_dllm.bundles.targuard import HeaderRefused, member_chunks, open_guarded
from turbo_dllm.errors import DllmError, os_error_hint

__all__ = [
    "MAX_BUNDLE_BYTES",
    "MAX_EXPANSION",
    "MAX_FILES",
    "BundleRejected",
    "DiskWriteError",
    "NoRoom",
    "extract_bundle",
    "extract_stream",
    "pack_bundle",
    "pack_members",
    "read_archive_manifest",
]

MAX_MANIFEST_BYTES = 1024 * 1024
MAX_BUNDLE_BYTES = 16 * 1024**3  # unpacked
MAX_EXPANSION = 1000  # unpacked bytes per archive byte; kernels compress ~3-10x
MAX_FILES = 4096  # files a bundle.json may list; a bundle holds a few dozen
ZSTD_LEVEL = 10
_CHUNK = 1024 * 1024


class BundleRejected(DllmError):
    """An archive or download that failed a safety or integrity check; nothing was installed."""


class DiskWriteError(DllmError):
    """A file could not be written for this machine's reason (a full disk, a quota, a read-only
    or forbidden folder): `errno` says which. The path that failed is usually in a staging
    folder that is deleted by the time this is shown, so callers that own that folder (the
    bundle store) report the folder they own and its file system instead."""

    def __init__(
        self, message: str, hint: str | None, errno_: int | None, path: Path | None = None
    ) -> None:
        super().__init__(message, hint)
        self.errno, self.path = errno_, path


class NoRoom(DllmError):
    """The file system cannot hold what `bundle.json` says the archive unpacks to (the caller's
    `room` check, before any file is written): `needed` bytes. This machine's fault; an install
    keeps the verified download for the next run."""

    def __init__(self, message: str, hint: str | None, needed: int) -> None:
        super().__init__(message, hint)
        self.needed = needed


# Why writing a file failed when the fault is this machine's, not the archive's.
DISK_HINTS = {
    errno.ENOSPC: "the disk is full: free some space and run it again",
    errno.EDQUOT: "your disk quota is used up: free some space and run it again",
    errno.EROFS: "that file system is read-only: point DLLM_HOME at a writable one",
    errno.EACCES: "check that folder's permissions, or point DLLM_HOME at one you can write",
    errno.EPERM: "check that folder's permissions, or point DLLM_HOME at one you can write",
    errno.EIO: "the disk reported an I/O error: check it, then run it again",
}


# What to do about an archive the extractor refuses, whoever holds it (a publisher's `--out`, a
# mirror, a download whose bytes the catalog pins): `dllm bundle build` writes only archives that
# pass every check here, so one that fails a check was either made another way or changed since.
NOT_BUILT_HINT = (
    "`dllm bundle build` never writes such an archive (it was made another way, or altered): "
    "rebuild it with `dllm bundle build`, or ask its publisher for one built so"
)
DAMAGED_HINT = (
    "the archive was damaged after it was built (changed or cut short): copy it again whole "
    "from where it came from (`dllm mirror verify` checks a mirror), or rebuild it with "
    "`dllm bundle build`"
)
OVERSIZE_HINT = (
    "a bundle holds a few dozen files of a few MB; this archive is not one (a decompression "
    "bomb?): do not use it; rebuild it with `dllm bundle build`, or ask its publisher for one"
)


def unreadable_hint(error: BaseException) -> str:
    """The hint for `unreadable_archive`'s message: a file cut short, or not a bundle at all."""
    if isinstance(error, EOFError) or (
        isinstance(error, tarfile.ReadError) and str(error).startswith(_EARLY_END)
    ):
        return (
            "copy it again whole from where it came from (`dllm mirror verify` checks a "
            "mirror), or rebuild it with `dllm bundle build`"
        )
    return (
        "pass a .tar.zst that `dllm bundle build` wrote; a damaged one: copy it again whole, or "
        "rebuild it with `dllm bundle build`"
    )


def read_failure(path: Path, error: OSError) -> DllmError:
    """An archive file that could not be opened or read (missing, forbidden, an I/O error)."""
    return DllmError(
        f"cannot read {path}: {error.strerror}",
        hint=os_error_hint(error.errno or 0) or "check that path and its permissions",
    )


def write_failure(error: OSError, path: Path | str, label: str) -> DllmError:
    """The error for a file that could not be written while `label` was unpacked or
    downloaded: a full disk, a quota, a read-only or forbidden folder (this machine's fault:
    a DllmError naming the path, with the fix) or a BundleRejected (anything else: the
    archive asked for something that cannot be written)."""
    hint = DISK_HINTS.get(error.errno)
    if hint is None:
        return BundleRejected(
            f"{label}: cannot write {path}: {error.strerror or error}",
            hint="this file system cannot hold a file the archive names (a name too long?): "
            "rebuild it with `dllm bundle build`, or point DLLM_HOME at another file system",
        )
    return DiskWriteError(
        f"cannot write {path} (while unpacking {label}): {error.strerror}; nothing was installed",
        hint,
        error.errno,
    )


def make_output_dir(folder: Path) -> Path:
    """`folder`, created if needed, for written archives (`--out`, `--mirror`): a DllmError,
    not a traceback, when it is a file or cannot be made."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        reason = "it is a file" if isinstance(error, FileExistsError) else error.strerror
        raise DllmError(
            f"cannot write into {folder}: {reason}", hint="pass a folder you can write to"
        ) from None
    return folder


def pack_bundle(manifest: BundleManifest, files_root: Path, out_path: Path) -> Path:
    """Write `bundle.json` then every listed file into a reproducible `.tar.zst` at `out_path`."""
    files = [(entry.path, entry.size) for entry in manifest.files]
    return pack_members(MANIFEST_NAME, manifest.to_json().encode(), files, files_root, out_path)


def pack_members(
    first_name: str,
    first_data: bytes,
    files: list[tuple[str, int]],
    files_root: Path,
    out_path: Path,
) -> Path:
    """A reproducible `.tar.zst`: `first_name` (the archive's manifest) then `files` (relative
    path, size) from `files_root`, in the given order, with fixed times, owners and modes, so
    equal inputs give equal bytes. Written to a temporary name and renamed into place."""
    import zstandard

    make_output_dir(out_path.parent)
    tmp = out_path.with_name(f".{out_path.name}.tmp-{os.getpid()}")
    compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    try:
        with tmp.open("wb") as raw, compressor.stream_writer(raw, closefd=False) as zst:
            with tarfile.open(fileobj=zst, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                tar.addfile(_tarinfo(first_name, len(first_data)), io.BytesIO(first_data))
                for path, size in files:
                    with (files_root / path).open("rb") as handle:
                        tar.addfile(_tarinfo(path, size), handle)
        tmp.replace(out_path)
    finally:
        tmp.unlink(missing_ok=True)
    return out_path


def _tarinfo(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = 0o644
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _kind(member: tarfile.TarInfo) -> str:
    if member.issym():
        return f"a symbolic link to {member.linkname!r}"
    if member.islnk():
        return f"a hard link to {member.linkname!r}"
    if member.ischr():
        return "a character device"
    if member.isblk():
        return "a block device"
    if member.isfifo():
        return "a FIFO"
    if member.isdir():
        return "a directory"
    return "not a regular file"


def _check_member_name(name: str, archive: str) -> str:
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise BundleRejected(
            f"{archive}: member {name!r} is an absolute path; refusing to extract",
            hint=NOT_BUILT_HINT,
        )
    if ".." in name.replace("\\", "/").split("/"):
        raise BundleRejected(
            f"{archive}: member {name!r} climbs out of the bundle ('..'); refusing to extract",
            hint=NOT_BUILT_HINT,
        )
    try:
        return check_relative_path(name)
    except ValueError as error:
        raise BundleRejected(
            f"{archive}: member {error}; refusing to extract", hint=NOT_BUILT_HINT
        ) from None


def extract_bundle(
    archive_path: Path, dest: Path, *, label: str | None = None, check_files: bool = True
) -> BundleManifest:
    """Extract the `.tar.zst` at `archive_path` into the new folder `dest` (must not exist) and
    verify it; `label` names the archive in errors (default: its file name). See
    `extract_stream`."""
    label = label or archive_path.name
    try:
        raw = archive_path.open("rb")
    except OSError as error:
        raise read_failure(archive_path, error) from None
    with raw:
        size = os.fstat(raw.fileno()).st_size
        return extract_stream(raw, dest, label=label, archive_size=size, check_files=check_files)


def extract_stream(
    raw: BinaryIO,
    dest: Path,
    *,
    label: str,
    archive_size: int,
    check_files: bool = True,
    room: Callable[[BundleManifest], None] | None = None,
) -> BundleManifest:
    """Extract the `.tar.zst` read from `raw` (forward only, `archive_size` bytes at most: the
    expansion cap is a multiple of it) into the new folder `dest` (must not exist).

    The bytes may be unverified (an install extracts an archive as it downloads, and the
    result counts only once the archive's sha256 matched): every check holds for any input,
    and nothing is written outside `dest`. `check_files=False` skips re-hashing each file
    against `bundle.json`, for an archive whose own sha256 is checked against a pinned
    catalog before the extraction is used: that hash covers every byte of it, and the
    per-file hashes were checked when it was published (and are again by the kernel loader
    and `dllm bundle verify`). Every other check stays. `room(manifest)`, when given, is
    called once `bundle.json` passed the caps and before any file is written (to refuse, with
    `NoRoom`, a file system that cannot hold the files).

    Raises BundleRejected on the first problem; `dest` may then hold a partial extraction, which
    the caller (the store's staging area) removes.
    """
    import zstandard

    dest.mkdir(parents=False, exist_ok=False)
    try:
        with (
            zstandard.ZstdDecompressor().stream_reader(
                raw, read_size=_CHUNK, closefd=False
            ) as stream,
            open_guarded(stream) as tar,
        ):
            limits = _Limits(label, archive_size, check_files, room)
            return _extract_members(tar, dest, limits)
    except HeaderRefused as error:
        raise BundleRejected(
            f"{label}: {error.message}; refusing to extract", hint=error.hint or NOT_BUILT_HINT
        ) from None
    except (*_PARSE_ERRORS, zstandard.ZstdError) as error:
        raise BundleRejected(
            unreadable_archive(label, error, ".tar.zst bundle archive"),
            hint=unreadable_hint(error),
        ) from None


# What tarfile and zstandard raise on damaged or hostile input (tarfile's pax and GNU parsing
# raise ValueError and UnicodeError subclasses, a huge base-256 number OverflowError).
_PARSE_ERRORS = (EOFError, ValueError, OverflowError, RecursionError, tarfile.TarError)

# tarfile's words for data that stops before the archive does.
_EARLY_END = ("empty file", "unexpected end of data", "truncated header")


def unreadable_archive(label: str, error: BaseException, what: str) -> str:
    """The message for a `.tar.zst` that tarfile or zstandard could not read. zstandard's stream
    reader ends quietly where a frame is cut short, so a truncated file reaches tarfile as data
    that stops early ("empty file", "unexpected end of data"): name it truncated."""
    if isinstance(error, EOFError) or (
        isinstance(error, tarfile.ReadError) and str(error).startswith(_EARLY_END)
    ):
        return f"{label}: truncated or incomplete {what} (its data ends early); get a complete copy"
    return f"{label}: not a valid {what}: {error}"


class _Limits:
    """What one extraction may do: the archive's label and size, whether files are hashed."""

    def __init__(
        self,
        label: str,
        archive_size: int,
        check_files: bool,
        room: Callable[[BundleManifest], None] | None = None,
    ) -> None:
        self.label, self.archive_size, self.check_files = label, archive_size, check_files
        self.room = room

    def check_manifest(self, manifest: BundleManifest) -> None:
        """Before a byte of any file: the listed files and sizes are within the caps."""
        label, total = self.label, manifest.total_size
        if len(manifest.files) > MAX_FILES:
            raise BundleRejected(
                f"{label}: {MANIFEST_NAME} lists {len(manifest.files)} files, over the "
                f"{MAX_FILES}-file cap on a bundle",
                hint=OVERSIZE_HINT,
            )
        if total > MAX_BUNDLE_BYTES:
            raise BundleRejected(
                f"{label}: unpacks to {total} bytes, over the {MAX_BUNDLE_BYTES}-byte "
                f"({MAX_BUNDLE_BYTES // 1024**3} GiB) cap on a bundle",
                hint=OVERSIZE_HINT,
            )
        if total > MAX_EXPANSION * self.archive_size:
            raise BundleRejected(
                f"{label}: {MANIFEST_NAME} lists {total} bytes in a {self.archive_size}-byte "
                f"archive, over the {MAX_EXPANSION}x cap on expansion (a decompression bomb?)",
                hint=OVERSIZE_HINT,
            )


def _extract_members(tar: tarfile.TarFile, dest: Path, limits: _Limits) -> BundleManifest:
    label = limits.label
    manifest: BundleManifest | None = None
    expected: dict[str, tuple[str, int]] = {}
    written: set[str] = set()
    folders = {dest}  # made already: one mkdir per folder, not per file
    for member in tar:
        if manifest is None:
            if member.name != MANIFEST_NAME or not member.isreg():
                raise BundleRejected(
                    f"{label}: the first member must be {MANIFEST_NAME}, found {member.name!r}",
                    hint=NOT_BUILT_HINT,
                )
            if member.size > MAX_MANIFEST_BYTES:
                raise BundleRejected(
                    f"{label}: {MANIFEST_NAME} is larger than 1 MiB", hint=NOT_BUILT_HINT
                )
            handle = tar.extractfile(member)
            assert handle is not None
            data = handle.read()
            manifest = parse_manifest(data, f"{label}:{MANIFEST_NAME}")
            limits.check_manifest(manifest)
            if limits.room is not None:
                limits.room(manifest)
            expected = {f.path: (f.sha256, f.size) for f in manifest.files}
            try:
                (dest / MANIFEST_NAME).write_bytes(data)
            except OSError as error:
                raise write_failure(error, dest / MANIFEST_NAME, label) from None
            continue
        name = _check_member_name(member.name, label)
        if not member.isreg():
            raise BundleRejected(
                f"{label}: member {name!r} is {_kind(member)}; bundles hold only regular files",
                hint=NOT_BUILT_HINT,
            )
        if name in written or name == MANIFEST_NAME:
            raise BundleRejected(f"{label}: member {name!r} appears twice", hint=NOT_BUILT_HINT)
        if name not in expected:
            raise BundleRejected(
                f"{label}: member {name!r} is not listed in {MANIFEST_NAME}", hint=NOT_BUILT_HINT
            )
        sha256, size = expected[name]
        if member.size != size:
            raise BundleRejected(
                f"{label}: member {name!r} has {member.size} bytes, {MANIFEST_NAME} says {size}",
                hint=DAMAGED_HINT,
            )
        digest = hashlib.sha256() if limits.check_files else None
        try:
            target = dest / name
            if target.parent not in folders:
                target.parent.mkdir(parents=True, exist_ok=True)
                folders.add(target.parent)
            with open(target, "xb") as out:  # "x": never follow or overwrite anything
                for chunk in member_chunks(tar, member, _CHUNK):
                    if digest is not None:
                        digest.update(chunk)
                    out.write(chunk)
        except OSError as error:
            if error.errno in DISK_HINTS:
                raise write_failure(error, dest / name, label) from None
            raise BundleRejected(
                f"{label}: cannot extract member {name!r}: {error.strerror or error}",
                hint="this file system cannot hold a file the archive names (a name too long?): "
                "rebuild it with `dllm bundle build`, or point DLLM_HOME at another file system",
            ) from None
        if digest is not None and digest.hexdigest() != sha256:
            raise BundleRejected(
                f"{label}: member {name!r} has sha256 {digest.hexdigest()}, "
                f"{MANIFEST_NAME} says {sha256}",
                hint=DAMAGED_HINT,
            )
        written.add(name)
    if manifest is None:
        raise BundleRejected(f"{label}: empty archive", hint=DAMAGED_HINT)
    missing = sorted(set(expected) - written)
    if missing:
        raise BundleRejected(
            f"{label}: archive lacks listed files: {', '.join(missing)}", hint=DAMAGED_HINT
        )
    for path in [dest / MANIFEST_NAME, *(dest / name for name in written)]:
        path.chmod(0o444)
    return manifest


def read_archive_manifest(archive_path: Path) -> BundleManifest:
    """Only the leading `bundle.json` of an archive (cheap: stops after the first member)."""
    import zstandard

    label = archive_path.name
    try:
        with (
            archive_path.open("rb") as raw,
            zstandard.ZstdDecompressor().stream_reader(raw) as stream,
            open_guarded(stream) as tar,
        ):
            member = tar.next()
            if member is None or member.name != MANIFEST_NAME or not member.isreg():
                raise BundleRejected(
                    f"{label}: the first member must be {MANIFEST_NAME}", hint=NOT_BUILT_HINT
                )
            if member.size > MAX_MANIFEST_BYTES:
                raise BundleRejected(
                    f"{label}: {MANIFEST_NAME} is larger than 1 MiB", hint=NOT_BUILT_HINT
                )
            handle = tar.extractfile(member)
            assert handle is not None
            return parse_manifest(handle.read(), f"{label}:{MANIFEST_NAME}")
    except HeaderRefused as error:
        raise BundleRejected(
            f"{label}: {error.message}", hint=error.hint or NOT_BUILT_HINT
        ) from None
    except (*_PARSE_ERRORS, zstandard.ZstdError) as error:
        raise BundleRejected(
            unreadable_archive(label, error, ".tar.zst bundle archive"),
            hint=unreadable_hint(error),
        ) from None
    except OSError as error:
        raise read_failure(archive_path, error) from None
