"""Compile-cache packs: `pack.json`, making a pack, verified extraction, installed-pack records.

    turbo-dllm-compile-<python>-torch<torch>-<cpu|archs>-<spec12|any>-<content12>.tar.zst
      pack.json              format, key (PackKey), the compile-relevant spec part, every file
      inductor/<...>         TORCHINDUCTOR_CACHE_DIR's files (FX graph, AOTAutograd, kernels)
      triton/<...>           TRITON_CACHE_DIR's files

A pack is content-addressed: its name ends with the digest of its file list, its identity is the
archive's sha256, and `pack.json` pins every member's sha256 and size. Installing verifies the
whole archive in a staging folder first (nothing reaches the cache from a pack that fails a
check), refuses a pack whose key does not fit the host (the fields that differ, like a bundle),
then copies its files into the compile cache this host's runs use and records what it wrote
under `<dllm home>/compile-packs/installed/<sha256>.json` (`list`, `verify`, `remove` read it).

Why folders and not `torch.compiler.save_cache_artifacts`: the portable artifacts are collected
in the process that compiled, so they cannot pack the caches a finished run left; and on CPU
they do not carry inductor's compiled C++ kernels. The cache folders (which inductor reads
relocated: its entries are keyed by content, not path) serve both `--warm` and an earlier run.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, NamedTuple

from turbo_dllm.bundles.archive import unreadable_archive
from turbo_dllm.bundles.manifest import (
    MIN_SHA_PREFIX,
    check_relative_path,
    check_sha256,
    find_by_name_or_sha,
)
from turbo_dllm.cache.key import PackDifference, PackKey
from turbo_dllm.errors import DllmError
from turbo_dllm.formats import flatten
from turbo_dllm.fsutil import file_system, human_size, mounted_at, owned_prefix, sweep_orphans
from turbo_dllm.host import HostFingerprint
from turbo_dllm.paths import dllm_home
from turbo_dllm.records import Record, RecordError, checked

__all__ = [
    "PACK_FORMAT",
    "PACK_NAME",
    "PACKS_VARIABLE",
    "InstalledPack",
    "OfferedPack",
    "PackFile",
    "PackManifest",
    "PackRejected",
    "available_packs",
    "check_packs",
    "copy_packs",
    "find_installed",
    "install_pack",
    "installed_packs",
    "make_pack",
    "packs_locked",
    "publish_packs",
    "pack_folders",
    "fitting_pack",
    "read_pack_manifest",
    "remove_damaged_record",
    "remove_pack",
    "pack_copy",
    "repair_hint",
    "verify_pack",
    "verify_pack_archive",
]

PACK_FORMAT = "turbo_dllm.compile_pack.v1"
PACK_NAME = "pack.json"
PACK_PREFIX = "turbo-dllm-compile-"
PACKS_VARIABLE = "DLLM_PACK_PATH"  # folders (":"-separated) that hold packs to offer
CACHES = ("inductor", "triton")
MAX_PACK_JSON_BYTES = 64 * 1024 * 1024  # a large model's cache lists tens of thousands of files
MAX_PACK_BYTES = 64 * 1024**3  # unpacked; a 1.7B recipe's caches are well under 1 GB
_CHUNK = 1024 * 1024
DEFAULT_LOCK_TIMEOUT_S = 60.0

# Why writing a pack (--out, the scratch copies) or installing one (the cache, the records)
# failed when the fault is this machine's: `verb` is pack or install.
_DISK_FIXES = {
    errno.ENOSPC: "the disk is full: free some space and {verb} again",
    errno.EDQUOT: "your disk quota is used up: free some space and {verb} again",
    errno.EROFS: "that file system is read-only: {verb} into a writable one",
    errno.EACCES: "check that folder's permissions, then {verb} again",
    errno.EPERM: "check that folder's permissions, then {verb} again",
}


class PackRejected(DllmError):
    """A pack that failed an integrity or fit check; nothing was installed."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message, hint or REJECTED_HINT)


REJECTED_HINT = (
    "the pack is damaged, cut short or altered (nothing was taken from it): get a complete copy, "
    "or make it again on its host (dllm cache pack)"
)


class PackFile(Record):
    path: str = checked(check_relative_path)
    sha256: str = checked(check_sha256)
    size: int


class PackManifest(Record):
    format: Literal["turbo_dllm.compile_pack.v1"] = PACK_FORMAT
    key: PackKey
    spec: str | None = None  # the compile-relevant spec part the key digests, as canonical JSON
    created_by: str
    files: tuple[PackFile, ...]

    def _problems(self) -> Iterator[tuple[str, str]]:
        paths = [f.path for f in self.files]
        if not paths:
            yield "files", "lists no file (`dllm cache pack` never makes such a pack)"
        if len(set(paths)) != len(paths):
            yield "files", "a file is listed twice"
        for path in paths:
            if path.split("/")[0] not in CACHES:
                yield "files", f"{path!r} is in neither inductor/ nor triton/"
            elif "/" not in path:  # the cache folder itself, as a file
                yield "files", f"{path!r} is a cache folder, not a file in one"
        # A file whose path is another file's folder: extracting one breaks on the other.
        folders = {"/".join(p.split("/")[:i]) for p in paths for i in range(1, p.count("/") + 1)}
        for path in sorted(folders.intersection(paths)):
            yield "files", f"{path!r} is listed as a file and as a folder of other files"

    @property
    def content_digest(self) -> str:
        listing = "\n".join(f"{f.path} {f.sha256} {f.size}" for f in self.files)
        return hashlib.sha256(listing.encode()).hexdigest()

    @property
    def file_name(self) -> str:
        spec = (self.key.spec_sha256 or "any")[:12]
        return f"{PACK_PREFIX}{self.key.label()}-{spec}-{self.content_digest[:12]}.tar.zst"

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=1, sort_keys=True) + "\n"


class InstalledPack(NamedTuple):
    sha256: str
    manifest: PackManifest
    caches: dict[str, str]  # cache name -> the folder its files went into
    installed_at: str
    source: str
    added: tuple[str, ...]  # the pack's files this install wrote (the others were there already)

    @property
    def short_sha(self) -> str:
        return self.sha256[:12]

    def to_json(self) -> dict:
        return {
            "sha256": self.sha256,
            "file": self.manifest.file_name,
            "key": self.manifest.key.model_dump(mode="json"),
            "files": len(self.manifest.files),
            "added": len(self.added),
            "bytes": self.manifest.total_size,
            "caches": self.caches,
            "installed_at": self.installed_at,
            "source": self.source,
        }


# --- making ---------------------------------------------------------------------------------
def _skipped(relative: str) -> bool:
    """Lock files and half-written entries: never part of a pack."""
    parts = relative.split("/")
    return (
        "locks" in parts
        or relative.endswith(".lock")
        or any(p.startswith(("tmp", ".")) for p in parts)
    )


def make_pack(
    caches: dict[str, Path],
    out_dir: Path,
    key: PackKey,
    *,
    spec: dict[str, Any] | None = None,
) -> tuple[Path, PackManifest]:
    """Pack the files under `caches` ({"inductor": folder, "triton": folder}) into `out_dir`.

    The caches are live (inductor and Triton may delete a file while it is read): each file is
    copied into a scratch folder first and the pack is made of those copies; a file that
    vanishes before it is copied is left out (it is only a cache)."""
    from turbo_dllm import __version__
    from turbo_dllm.bundles.archive import make_output_dir, pack_members

    listed = [
        (relative, path)
        for name in CACHES
        if caches.get(name) is not None
        for relative, path in _cache_files(name, Path(caches[name]))
    ]
    if not listed:
        raise _empty_caches(caches)
    make_output_dir(out_dir)  # before copying: --out may be a file
    scratch = Path(tempfile.gettempdir())
    with _packing(scratch, "the scratch folder", "set TMPDIR to move it"):
        # Named by host and process, and swept once that process is gone: a pack killed
        # outright (SIGKILL, OOM) left its scratch copies of the whole cache in TMPDIR and its
        # half-written archive in --out, and no later pack removed either.
        _sweep_staging(scratch, hidden=False)
        with tempfile.TemporaryDirectory(prefix=_staging_prefix(hidden=False)) as tmp:
            root = Path(tmp)
            files = [e for relative, path in listed if (e := _copy_entry(path, relative, root))]
            if not files:
                raise _empty_caches(caches)
            text = (
                json.dumps(spec, sort_keys=True, separators=(",", ":"))
                if spec is not None
                else None
            )
            manifest = PackManifest(
                key=key, spec=text, created_by=f"turbo-dllm {__version__}", files=tuple(files)
            )
            with _packing(out_dir, "the output folder", "or pass another --out"):
                _sweep_staging(out_dir)
                # Written in a folder of this process's (swept like the scratch copies), then
                # renamed into --out: whole or not at all.
                with tempfile.TemporaryDirectory(prefix=_staging_prefix(), dir=out_dir) as part:
                    written = pack_members(
                        PACK_NAME,
                        manifest.to_json().encode(),
                        [(f.path, f.size) for f in files],
                        root,
                        Path(part) / manifest.file_name,
                    )
                    out = out_dir / manifest.file_name
                    os.replace(written, out)
    return out, manifest


def _packing(folder: Path, what: str, elsewhere: str):
    """Report a full disk, a quota, a read-only or forbidden folder met while a pack is made
    by the folder being written (the scratch copies of the caches, or --out) and its file
    system, not by a file in the scratch folder (deleted by then) or no file at all."""
    return _disk_faults(folder, what, "pack", "packing", "no pack was written", elsewhere)


def _cache_files(name: str, folder: Path) -> list[tuple[str, Path]]:
    """(member path, file) of every file a pack of cache `name` at `folder` carries, in a
    stable order. A folder that vanishes while it is walked is skipped (os.walk's default)."""
    found = []
    for parent, _, names in os.walk(folder):
        for file_name in names:
            path = Path(parent) / file_name
            relative = f"{name}/{path.relative_to(folder).as_posix()}"
            if _skipped(relative):
                continue
            try:
                check_relative_path(relative)
            except ValueError:
                continue  # a name no pack can carry safely; the cache rebuilds that entry
            found.append((relative, path))
    return sorted(found, key=lambda item: item[0].split("/"))


def _copy_entry(source: Path, relative: str, root: Path) -> PackFile | None:
    """Copy one cache file to `root/relative` (a stable copy: the cache may change while it is
    read) and describe the copy; None when the file is gone, or is a link or not a file."""
    from turbo_dllm.fsutil import sha256_file

    target = root / relative
    try:
        if source.is_symlink() or not source.is_file():
            return None
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    except FileNotFoundError:  # deleted by inductor or Triton since it was listed
        target.unlink(missing_ok=True)
        return None
    except OSError as error:
        if error.errno in _DISK_FIXES and (
            error.errno not in (errno.EACCES, errno.EPERM) or error.filename != str(source)
        ):
            raise  # writing the copy failed: `make_pack` names the scratch folder
        raise DllmError(
            f"cannot read {source}: {error.strerror}",
            hint="check that file's permissions (it is only a cache: deleting it is safe), "
            "then pack again",
        ) from None
    sha256 = sha256_file(target)
    try:
        changed = sha256_file(source) != sha256
    except FileNotFoundError:
        changed = False  # deleted after it was copied: the copy is whole (read to its end)
    if changed:
        raise DllmError(f"{source} changed while it was packed; pack again")
    return PackFile(path=relative, sha256=sha256, size=target.stat().st_size)


def _empty_caches(caches: dict[str, Path]) -> DllmError:
    listed = ", ".join(str(p) for p in caches.values())
    return DllmError(
        f"the compile caches are empty ({listed}): nothing to pack",
        hint="run the recipe once (or pass --warm to run its first step), then pack",
    )


# --- reading and verified extraction --------------------------------------------------------
def _parse(data: bytes, label: str) -> PackManifest:
    try:
        return PackManifest.model_validate_json(data)
    except RecordError as error:
        raise PackRejected(f"{label}: invalid {PACK_NAME}: {error}") from None


def read_pack_manifest(path: Path) -> PackManifest:
    """Only the leading `pack.json` (cheap: stops after the first member)."""
    import zstandard

    try:
        with path.open("rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as stream:
            with tarfile.open(fileobj=stream, mode="r|") as tar:
                member = tar.next()
                if member is None or member.name != PACK_NAME or not member.isreg():
                    raise PackRejected(f"{path.name}: the first member must be {PACK_NAME}")
                if member.size > MAX_PACK_JSON_BYTES:
                    raise PackRejected(f"{path.name}: {PACK_NAME} is too large")
                handle = tar.extractfile(member)
                assert handle is not None
                return _parse(handle.read(), path.name)
    except (tarfile.TarError, zstandard.ZstdError, EOFError) as error:
        raise _unreadable(path, error) from None
    except OSError as error:
        raise DllmError(f"cannot read {path}: {error.strerror}") from None


def _extract(path: Path, dest: Path) -> PackManifest:
    """Extract `path` into the new folder `dest`, checking every member against pack.json:
    regular files only, plain relative paths, listed, right size and sha256, none missing."""
    import zstandard

    dest.mkdir()
    manifest: PackManifest | None = None
    expected: dict[str, tuple[str, int]] = {}
    written: set[str] = set()
    label = path.name
    try:
        with path.open("rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as stream:
            with tarfile.open(fileobj=stream, mode="r|") as tar:
                for member in tar:
                    if manifest is None:
                        if member.name != PACK_NAME or not member.isreg():
                            raise PackRejected(f"{label}: the first member must be {PACK_NAME}")
                        if member.size > MAX_PACK_JSON_BYTES:
                            raise PackRejected(f"{label}: {PACK_NAME} is too large")
                        handle = tar.extractfile(member)
                        assert handle is not None
                        manifest = _parse(handle.read(), label)
                        if manifest.total_size > MAX_PACK_BYTES:
                            raise PackRejected(
                                f"{label}: unpacks to {manifest.total_size} bytes, over the cap"
                            )
                        expected = {f.path: (f.sha256, f.size) for f in manifest.files}
                        continue
                    name = member.name
                    if not member.isreg():
                        raise PackRejected(f"{label}: member {name!r} is not a regular file")
                    if name in written or name not in expected:
                        raise PackRejected(
                            f"{label}: member {name!r} is not listed in {PACK_NAME} (or twice)"
                        )
                    sha256, size = expected[name]
                    if member.size != size:
                        raise PackRejected(
                            f"{label}: member {name!r} has {member.size} bytes, "
                            f"{PACK_NAME} says {size}"
                        )
                    source = tar.extractfile(member)
                    assert source is not None
                    digest = hashlib.sha256()
                    target = dest / name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with open(target, "xb") as out:
                        while chunk := source.read(_CHUNK):
                            digest.update(chunk)
                            out.write(chunk)
                    if digest.hexdigest() != sha256:
                        raise PackRejected(
                            f"{label}: member {name!r} has sha256 {digest.hexdigest()}, "
                            f"{PACK_NAME} says {sha256}",
                            hint="the pack is damaged or was altered; get it again",
                        )
                    written.add(name)
    except (tarfile.TarError, zstandard.ZstdError, EOFError) as error:
        raise _unreadable(path, error) from None
    if manifest is None:
        raise PackRejected(f"{label}: empty archive")
    missing = sorted(set(expected) - written)
    if missing:
        raise PackRejected(f"{label}: the archive lacks listed files: {', '.join(missing[:5])}")
    return manifest


# A zstd frame's first bytes; a skippable frame's are 0x50-0x5F, 0x2A, 0x4D, 0x18.
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_A_PACK = "a .tar.zst made by `dllm cache pack`"


def _unreadable(path: Path, error: BaseException) -> PackRejected:
    """Why the archive at `path` could not be read. An empty file and one that is no zstd data
    at all are named so: "truncated" and a zstd "Unknown frame descriptor" told of a damaged
    pack where there was none."""
    try:
        with path.open("rb") as handle:
            head = handle.read(len(_ZSTD_MAGIC))
    except OSError:
        head = None
    if head == b"":
        return PackRejected(
            f"{path.name}: an empty file (0 bytes), not a compile-cache pack",
            hint=f"a copy or download that wrote nothing? name {_A_PACK}",
        )
    skippable = head is not None and head[1:] == b"\x2a\x4d\x18" and head[0] & 0xF0 == 0x50
    if head is not None and head != _ZSTD_MAGIC and not skippable:
        return PackRejected(
            f"{path.name}: not a compile-cache pack (not zstd-compressed data)",
            hint=f"name {_A_PACK}",
        )
    return PackRejected(unreadable_archive(path.name, error, "compile-cache pack"))


def _pack_file(path: Path) -> Path:
    """`path`, if there is a file to read as a pack; else a DllmError that says what is there
    instead: a folder was "no such pack", as if nothing were there."""
    offer = "(`dllm cache list --available` lists the packs on offer)"
    hint = f"name {_A_PACK} {offer}"
    if path.is_dir():
        try:
            inside = sorted(path.glob("*.tar.zst"))
        except OSError:  # a folder that cannot be listed: named without its packs
            inside = []
        if len(inside) == 1:
            hint = f"pass the pack in it: {inside[0]} (a pack is {_A_PACK})"
        elif inside:
            hint = f"pass one of the {len(inside)} packs in it, such as {inside[0]}"
        else:
            hint = f"name {_A_PACK}, not a folder {offer}"
        raise DllmError(f"{path} is a folder, not a pack file", hint=hint)
    if not path.exists():
        where = " (a link to nothing)" if path.is_symlink() else " (nothing there)"
        raise DllmError(f"no such pack: {path}{where}", hint=hint)
    if not path.is_file():
        raise DllmError(f"{path} is not a pack file (not a regular file)", hint=hint)
    return path


def verify_pack_archive(path: Path) -> PackManifest:
    """Check every member of the pack at `path` against its pack.json (extracting to a scratch
    folder that is then removed); its manifest, or PackRejected."""
    with tempfile.TemporaryDirectory(prefix="dllm-pack-check-") as tmp:
        return _extract(path, Path(tmp) / "pack")


def check_packs(packs: list[Path]) -> list[tuple[Path, str]]:
    """(path, published name) of each pack, each verified completely (PackRejected if not)."""
    checked = []
    for pack in packs:
        _pack_file(pack)
        checked.append((pack, verify_pack_archive(pack).file_name))
    return checked


def copy_packs(checked: list[tuple[Path, str]], mirror: Path) -> list[Path]:
    """Copy checked packs into `mirror/packs/`. Published bytes never change: a file of that
    name with other bytes is refused (a pack's name ends with its content digest)."""
    from turbo_dllm.fsutil import sha256_file

    published = []
    for pack, name in checked:
        dest = mirror / "packs" / name
        if dest.exists():
            if sha256_file(dest) != sha256_file(pack):
                raise DllmError(
                    f"{dest} already exists with other bytes",
                    hint="published files never change; one of the two packs is damaged",
                )
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(f".{name}.tmp-{os.getpid()}")
            try:
                shutil.copyfile(pack, tmp)
                tmp.replace(dest)
            finally:
                tmp.unlink(missing_ok=True)
        published.append(dest)
    return published


def publish_packs(packs: list[Path], mirror: Path) -> list[Path]:
    """Verify every pack, then (only if all pass) copy them into `mirror/packs/`."""
    return copy_packs(check_packs(packs), mirror)


# --- installed packs ------------------------------------------------------------------------
def _records_dir() -> Path:
    return dllm_home() / "compile-packs" / "installed"


def _orphans_dir() -> Path:
    """`<sha256>` markers: packs whose damaged record was removed, its files left in the cache."""
    return dllm_home() / "compile-packs" / "orphaned"


@contextlib.contextmanager
def packs_locked(timeout_s: float = DEFAULT_LOCK_TIMEOUT_S) -> Iterator[None]:
    """The lock that serializes pack installs and removes (`flock` on
    `<dllm home>/compile-packs/install.lock`, like the bundle store's): each reads the records
    and the cache, then changes both."""
    from turbo_dllm.bundles.store import file_lock

    lock = dllm_home() / "compile-packs" / "install.lock"
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(
                file_lock(
                    lock, timeout_s, "another compile-cache pack install or remove is running"
                )
            )
        except OSError as error:
            if error.errno not in _DISK_FIXES:
                raise
            raise _HomeUnwritable(lock, error.errno or 0) from None
        yield


class _HomeUnwritable(DllmError):
    """The packs' lock cannot be taken: DLLM_HOME (which holds it and the installed-pack
    records) cannot be written. Nothing was changed."""

    def __init__(self, lock: Path, code: int) -> None:
        fix = {
            errno.EROFS: "that file system is read-only:",
            errno.EACCES: "check that folder's permissions, or",
            errno.EPERM: "check that folder's permissions, or",
            errno.EDQUOT: "your disk quota is used up: free some space, or",
        }.get(code, "the disk is full: free some space, or")
        super().__init__(
            f"cannot take the compile-cache packs' lock {lock}: {os.strerror(code)}; nothing "
            "was changed",
            hint=f"{fix} point DLLM_HOME at a folder you can write (it holds the lock and the "
            f"installed-pack records; its file system is mounted at {mounted_at(lock.parent)})",
        )


def installed_packs() -> list[InstalledPack]:
    packs = [_read_record(path) for path in _record_paths()]
    return sorted(packs, key=lambda p: p.installed_at)


def _record_paths() -> list[Path]:
    """The installed-pack records; none before the first install, a DllmError where a file
    stands in the records folder's place (it read as "no pack installed")."""
    folder = _records_dir()
    if folder.is_dir():
        return sorted(folder.glob("*.json"))
    try:
        folder.stat()
    except FileNotFoundError:
        return []  # nothing installed yet
    except NotADirectoryError:
        pass  # a folder above it is a file
    raise DllmError(
        f"{folder} is not a folder: it (or a folder above it) is a file where the installed "
        "compile-cache pack records belong",
        hint="move that file aside; the packs installed before have to be installed again",
    )


def _read_record(path: Path) -> InstalledPack:
    """One installed-pack record (a DllmError naming the fix when it is damaged)."""
    try:
        data = json.loads(path.read_text())
        pack = InstalledPack(
            path.stem,
            PackManifest.model_validate(data["manifest"]),
            {str(name): str(folder) for name, folder in data["caches"].items()},
            str(data["installed_at"]),
            str(data["source"]),
            tuple(str(member) for member in data["added"]),
        )
        missing = {f.path.partition("/")[0] for f in pack.manifest.files} - set(pack.caches)
        if missing:
            raise ValueError(f"no cache folder for {', '.join(sorted(missing))}")
        return pack
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecordError) as error:
        if _is_sha256(path.stem):
            hint = (
                f"remove it: dllm cache remove {path.stem[:12]} (the files it added stay in "
                "the cache; they are only a cache)"
            )
        else:  # not named by a pack's sha256, so no install wrote it: `remove` cannot name it
            hint = f"it is no record dllm wrote (those are named <sha256>.json): delete {path}"
        raise DllmError(
            f"the installed-pack record {path} is damaged: {error}", hint=hint
        ) from None


def _is_sha256(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


def remove_damaged_record(ident: str) -> Path | None:
    """Delete the installed-pack record that the sha256 prefix `ident` names, if that is the
    only record it names and it is damaged (so `dllm cache remove` can take it); its path."""
    folder = _records_dir()
    named = [p for p in folder.glob("*.json") if p.stem.startswith(ident.lower())]
    if len(ident) < MIN_SHA_PREFIX or len(named) != 1:
        return None
    try:
        _read_record(named[0])
    except DllmError:
        _orphans_dir().mkdir(parents=True, exist_ok=True)
        (_orphans_dir() / named[0].stem).touch()  # installing the pack again claims its files
        named[0].unlink()
        return named[0]
    return None


def find_installed(ident: str) -> InstalledPack:
    """By sha256 prefix (6+ characters) or file name."""
    packs = installed_packs()
    matches, hint = find_by_name_or_sha(packs, ident, lambda p: p.manifest.file_name)
    if len(matches) == 1:
        return matches[0]
    known = ", ".join(p.short_sha for p in packs) or "none"
    if not matches:
        raise DllmError(
            f"no installed compile-cache pack {ident!r} (installed: {known})",
            hint=hint
            or "name one by the sha256 prefix (6+ characters) or file name `dllm cache list` shows",
        )
    raise DllmError(f"{ident!r} names several installed packs", hint="pass more of the sha256")


def install_pack(
    path: Path,
    caches: dict[str, Path],
    host: HostFingerprint,
    *,
    spec_sha256: str | None = None,
    spec: dict[str, Any] | None = None,
    lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
) -> tuple[InstalledPack, int]:
    """Verify `path`, check it fits `host` (and the run `spec_sha256`, whose compile-relevant
    part `spec` names the fields that differ from the pack's), copy its files into
    `caches`; returns the record and how many files were new there. Holds the packs' lock
    (`packs_locked`) from the first write on.

    A file already in the cache is left as it is: entries are named by content, and a live cache
    is the user's; but installing a pack again replaces the files its first install added that
    are damaged (`verify`'s fix). After the damaged record of this pack was removed
    (`remove_damaged_record`), the files already there with the pack's bytes are taken as this
    install's: that record's install most likely added them, and nothing else would remove them."""

    manifest = read_pack_manifest(_pack_file(path))
    differences = manifest.key.differences(host, spec_sha256)
    if differences:
        raise _rejected(path, manifest, differences, spec)
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(packs_locked(lock_timeout_s))
        except _HomeUnwritable:
            # Nothing can be written under DLLM_HOME; a pack installed with every file in place
            # needs nothing written (and reading its record needs no lock).
            from turbo_dllm.fsutil import sha256_file

            unchanged = _installed_intact(sha256_file(path), caches)
            if unchanged is None:
                raise
            return unchanged, 0
        return _install_locked(path, caches, host, spec_sha256)


def _rejected(
    path: Path, manifest: PackManifest, differences: list, spec: dict[str, Any] | None
) -> PackRejected:
    """Why a pack does not fit. A pack for this host made for another spec read "does not fit
    this host: spec: host ffe1d0ea4f43, pack ded1fc6fb564" with the hint to make a pack on a
    host like this one: two digests, no field, and a fix for a host that was fine."""
    host_side = [str(d) for d in differences if d.field != "spec"]
    shown = list(host_side)
    if len(host_side) < len(differences):
        shown.append(f"made for another spec{_spec_changes(manifest.spec, spec)}")
    if host_side:
        hint = (
            "make a pack on a host like this one (dllm cache pack), or let the first step compile"
        )
    else:
        hint = (
            "install it with the --config (and --set) it was packed for, or pack this spec "
            "(dllm cache pack --config F --warm), or let the first step compile"
        )
    where = "host" if host_side else "run"
    return PackRejected(
        f"compile-cache pack {path.name} does not fit this {where}: " + "; ".join(shown),
        hint=hint,
    )


def _spec_changes(packed: str | None, spec: dict[str, Any] | None, limit: int = 6) -> str:
    """' (training.compile: run false, pack true; ...)': the compile-relevant fields that differ
    between the run's spec and the one the pack was made for, where both are known."""
    if packed is None or spec is None:
        return ""
    try:
        theirs = json.loads(packed)
    except ValueError:
        return ""
    ours = json.loads(json.dumps(spec, default=str))  # as the pack's JSON has it (tuples: lists)
    mine, packs = flatten(ours), flatten(theirs)
    changes = [
        f"{key}: run {_json(mine.get(key, _UNSET))}, pack {_json(packs.get(key, _UNSET))}"
        for key in sorted(set(mine) | set(packs))
        if mine.get(key, _UNSET) != packs.get(key, _UNSET)
    ]
    if not changes:
        return ""
    more = f"; and {len(changes) - limit} more" if len(changes) > limit else ""
    return f" ({'; '.join(changes[:limit])}{more})"


_UNSET = object()  # a field one side's spec part does not have


def _json(value: Any) -> str:
    return "unset" if value is _UNSET else json.dumps(value)


def _installed_intact(sha256: str, caches: dict[str, Path]) -> InstalledPack | None:
    """The record of the pack whose archive has `sha256` when it is installed into `caches`
    with every file in place (that archive is the one checked then), else None."""
    record_path = _records_dir() / f"{sha256}.json"
    if not record_path.exists() or (_orphans_dir() / sha256).exists():
        return None
    earlier = _read_record(record_path)
    if earlier.caches != {n: str(f) for n, f in caches.items()} or verify_pack(earlier):
        return None
    return earlier


def _install_locked(
    path: Path, caches: dict[str, Path], host: HostFingerprint, spec_sha256: str | None
) -> tuple[InstalledPack, int]:
    from turbo_dllm.fsutil import sha256_file

    sha256 = sha256_file(path)
    record_path = _records_dir() / f"{sha256}.json"
    earlier = _read_record(record_path) if record_path.exists() else None
    if earlier is not None and earlier.caches != {n: str(f) for n, f in caches.items()}:
        # Its record names the files it added there: taking them over here would lose those
        # and, at `remove`, delete this cache's own copies of them.
        raise DllmError(
            f"{path.name} ({sha256[:12]}) is installed into another compile cache "
            f"({', '.join(earlier.caches.values())})",
            hint=f"remove it from there first (dllm cache remove {sha256[:12]}), then install it "
            "here",
        )
    if earlier is not None and (intact := _installed_intact(sha256, caches)) is not None:
        return intact, 0  # nothing to write (so it succeeds on a cache read-only by now)
    root = _staging_root(caches)
    with _writing(root, "the compile cache", path.name):
        _sweep_staging(root)
        _check_room(root, read_pack_manifest(path).total_size, path.name)
        return _install_staged(path, caches, host, spec_sha256, root, sha256, earlier)


def _check_room(root: Path, size: int, label: str) -> None:
    """Refuse a pack that unpacks to more than the free space of the compile cache's file
    system before a byte is written: filling that disk would break whatever else writes there
    (the runs whose caches these are) before the install fails and frees it again."""
    mount, free = file_system(root)
    if free is None or size <= free:
        return
    raise DllmError(
        f"cannot write into the compile cache {root} while installing {label}: the pack "
        f"unpacks to {human_size(size)}, its file system has {human_size(free)} free; nothing "
        "was installed",
        hint=f"free some space and install again (its file system is mounted at {mount}; "
        "DLLM_COMPILE_CACHE moves the compile cache)",
    )


def _install_staged(
    path: Path,
    caches: dict[str, Path],
    host: HostFingerprint,
    spec_sha256: str | None,
    root: Path,
    sha256: str,
    earlier: InstalledPack | None,
) -> tuple[InstalledPack, int]:
    """Extract and check `path` in a staging folder under `root`, then move its files into
    `caches` under a new record; an error (or Ctrl-C) takes everything back."""
    orphaned = _orphans_dir() / sha256
    record_path = _records_dir() / f"{sha256}.json"
    with tempfile.TemporaryDirectory(prefix=_staging_prefix(), dir=root) as tmp:
        manifest = _extract(path, Path(tmp) / "pack")
        if manifest.key.differences(host, spec_sha256):  # the checked copy must say the same
            raise PackRejected(f"{path.name}: pack.json changed between reads")
        # Installing again puts back what the first install added and is no longer intact.
        mine = set(earlier.added) if earlier else set()
        todo = [
            entry
            for entry in manifest.files
            if not _cache_path(caches, entry.path).exists()  # else kept: the cache is the user's
            or (entry.path in mine and not _intact(caches, entry))
        ]
        # Installing again keeps what the first install added (so `remove` still removes it).
        owned = (*mine, *(e.path for e in todo))
        if orphaned.exists():  # what the removed damaged record's install added
            owned += tuple(e.path for e in manifest.files if _intact(caches, e))
        earlier_bytes = record_path.read_bytes() if earlier else None
        # The record comes first, naming every file this install is about to add: a process
        # killed while moving them leaves only files a record accounts for (`remove` deletes
        # them; installing again adds the rest). Ctrl-C or an error takes all of it back.
        moved: list[tuple[Path, Path]] = []  # (file, the cache folder it went into)
        try:
            with _writing(_records_dir(), "the installed-pack records", path.name):
                record = _write_record(sha256, manifest, caches, path, owned)
            for entry in todo:
                target = _cache_path(caches, entry.path)
                cache = Path(caches[entry.path.partition("/")[0]])
                # Before the move: an interrupted move is taken back too.
                moved.append((target, cache))
                try:
                    with _writing(cache, "the compile cache", path.name):
                        _move_into(Path(tmp) / "pack" / entry.path, target)
                except (FileExistsError, IsADirectoryError, NotADirectoryError) as error:
                    raise DllmError(
                        f"cannot add {entry.path} to the compile cache: {_in_the_way(target)} "
                        f"({error.strerror})",
                        hint="move it aside (it is only a cache), then install again",
                    ) from None
            orphaned.unlink(missing_ok=True)  # its files belong to this record now
        except BaseException:
            for target, _ in moved:
                # Not there, a file in its path, or a folder (the user's): nothing to take back.
                with contextlib.suppress(FileNotFoundError, NotADirectoryError, IsADirectoryError):
                    target.unlink()
            for target, cache in moved:
                _remove_emptied_folders(target.parent, cache)
            if earlier_bytes is None:
                record_path.unlink(missing_ok=True)
            else:
                from turbo_dllm.fsutil import write_atomic

                write_atomic(record_path, earlier_bytes)
            raise
    return record, len(todo)


def _writing(folder: Path, what: str, label: str):
    """Report a full disk, a quota, a read-only or forbidden folder met while installing pack
    `label` by the folder being written (`what`: the compile cache, the records) and its file
    system: the file that failed was often in the staging folder, deleted by then, and a
    write() that fails names no file at all."""
    moves = (
        "DLLM_COMPILE_CACHE moves the compile cache"
        if what == "the compile cache"
        else "DLLM_HOME moves the records"
    )
    return _disk_faults(
        folder, what, "install", f"installing {label}", "nothing was installed", moves
    )


@contextlib.contextmanager
def _disk_faults(
    folder: Path, what: str, verb: str, doing: str, outcome: str, elsewhere: str
) -> Iterator[None]:
    """An OSError of this machine's disk (`_DISK_FIXES`) met while `doing` as a DllmError that
    names `folder` (`what` it is) and its file system, `outcome` and the fix for `verb`."""
    try:
        yield
    except OSError as error:
        fix = _DISK_FIXES.get(error.errno or 0)
        if fix is None:
            raise
        raise DllmError(
            f"cannot write into {what} {folder} while {doing}: "
            f"{os.strerror(error.errno or 0)}; {outcome}",
            hint=f"{fix.format(verb=verb)} (its file system is mounted at {mounted_at(folder)}; "
            f"{elsewhere})",
        ) from None


def _in_the_way(target: Path) -> str:
    """What in the cache stops a pack's file from moving to `target`, in words."""
    if target.is_dir():
        return f"{target} is a folder, where the pack has a file"
    for folder in reversed(target.parents):  # the outermost first
        if folder.exists() and not folder.is_dir():
            return f"{folder} is a file, where the pack has a folder"
    return f"something is in the way of {target}"


def _intact(caches: dict[str, Path], entry: PackFile) -> bool:
    """Whether the cache holds pack member `entry` with the pack's bytes."""
    from turbo_dllm.fsutil import sha256_file

    path = _cache_path(caches, entry.path)
    try:
        return path.stat().st_size == entry.size and sha256_file(path) == entry.sha256
    except OSError:
        return False


def _cache_path(caches: dict[str, Path], member: str) -> Path:
    """Where a pack member (`inductor/...`, `triton/...`) lives in the compile cache."""
    cache, _, relative = member.partition("/")
    return Path(caches[cache]) / relative


def _move_into(source: Path, target: Path) -> None:
    """Move a checked staging file into the cache: a rename where staging and cache share a file
    system; where the user put the caches on another one, a copy under a temporary name renamed
    into place, so the cache never holds half a file."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(source, target)
        return
    except OSError as error:
        if error.errno != errno.EXDEV:
            raise
    tmp = target.with_name(f".{target.name}.dllm-{os.getpid()}.tmp")  # never packed: a dot
    try:
        shutil.copy2(source, tmp)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def _write_record(
    sha256: str, manifest: PackManifest, caches: dict[str, Path], source: Path, owned
) -> InstalledPack:
    from turbo_dllm.fsutil import write_atomic

    record = InstalledPack(
        sha256,
        manifest,
        {name: str(folder) for name, folder in caches.items()},
        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        os.path.abspath(source),  # not relative to a folder the record does not name
        tuple(sorted(set(owned))),
    )
    _records_dir().mkdir(parents=True, exist_ok=True)
    write_atomic(
        _records_dir() / f"{sha256}.json",
        json.dumps(
            {
                "manifest": manifest.model_dump(mode="json"),
                "caches": record.caches,
                "installed_at": record.installed_at,
                "source": record.source,
                "added": list(record.added),
            },
            indent=1,
        ),
    )
    return record


def _staging_prefix(*, hidden: bool = True) -> str:
    """The name of a folder this process works in (an install's staging, a pack's scratch
    copies and its archive being written): the host and process, for `_sweep_staging`."""
    return owned_prefix(f"{'.' if hidden else ''}dllm-pack-")


def _sweep_staging(root: Path, *, hidden: bool = True) -> None:
    """Remove the working folders (`_staging_prefix`) under `root` of installs and packs on
    this host whose process is gone (killed before its own clean-up ran)."""
    sweep_orphans(root, f"{'.' if hidden else ''}dllm-pack-")


def _staging_root(caches: dict[str, Path]) -> Path:
    """A staging folder on the cache's file system, so files move in by rename."""
    root = Path(next(iter(caches.values()))).parent
    root.mkdir(parents=True, exist_ok=True)
    return root


def _in_cache(pack: InstalledPack, entry: PackFile) -> Path:
    cache, _, relative = entry.path.partition("/")
    return Path(pack.caches[cache]) / relative


def verify_pack(pack: InstalledPack, *, hashes: bool = True) -> list[str]:
    """Problems with an installed pack's files in the cache (empty: all present and intact).
    `hashes=False` compares sizes only: cheap enough for `dllm doctor`."""
    from turbo_dllm.fsutil import sha256_file

    problems = []
    for entry in pack.manifest.files:
        path = _in_cache(pack, entry)
        if not path.is_file():
            problems.append(f"{entry.path}: missing")
        elif path.stat().st_size != entry.size or (hashes and sha256_file(path) != entry.sha256):
            problems.append(f"{entry.path}: differs from pack.json")
    return problems


def repair_hint(pack: InstalledPack) -> str:
    """The fix for a pack `verify_pack` found problems with, as commands for this pack: install
    it again (that puts back the files it added) from the file it was installed from, or a
    copy on offer (`pack_folders`) when that file is gone; or remove it (the cache then
    compiles those entries again). With no copy to install, removing it comes first: a
    command naming a file that is gone would not run."""
    import shlex

    remove = f"dllm cache remove {pack.short_sha}"
    copy = pack_copy(pack)
    if copy is not None:
        return (
            f"install it again: dllm cache install {shlex.quote(str(copy))} puts back the files "
            f"it added; or remove it: {remove}"
        )
    return (
        f"remove it: {remove} (the runs compile the missing entries again); its pack file "
        f"{pack.manifest.file_name} is gone from {shlex.quote(str(Path(pack.source).parent))}: "
        "to put the files back instead, install a copy of it with dllm cache install FILE"
    )


def pack_copy(pack: InstalledPack) -> Path | None:
    """A file to install `pack` again from: the one it was installed from, or, when that is
    gone, a file of the same name on offer ($DLLM_PACK_PATH, a local mirror's `packs/`; the
    name carries the pack's content digest, and install verifies it anyway). None: neither."""
    source = Path(pack.source)
    if source.is_file():
        return source
    for folder in pack_folders():
        offered = folder / pack.manifest.file_name
        if offered.is_file():
            return offered.absolute()  # a command that runs from any folder
    return None


def remove_pack(pack: InstalledPack) -> int:
    """Delete the files this pack's install added that are still intact and that no other
    installed pack lists, then its record; returns how many files were deleted. Files that were
    in the cache before the install stay. An added file another installed pack lists stays for
    that pack, and becomes one its own remove deletes: it was kept as the cache's at that pack's
    install, so once both were removed no record named it and it stayed for good."""
    from turbo_dllm.fsutil import sha256_file

    others = {
        _in_cache(p, f): (p, f.path)
        for p in installed_packs()
        if p.sha256 != pack.sha256
        for f in p.manifest.files
    }
    removed = 0
    added = set(pack.added)
    folders: set[tuple[Path, Path]] = set()  # (folder a deleted file was in, its cache folder)
    handed: dict[str, set[str]] = {}  # another pack's sha256 -> its members it now owns
    for entry in pack.manifest.files:
        if entry.path not in added:
            continue
        path = _in_cache(pack, entry)
        if not path.is_file() or sha256_file(path) != entry.sha256:
            continue
        if path in others:
            other, member = others[path]
            if member not in other.added:
                handed.setdefault(other.sha256, set()).add(member)
            continue
        path.unlink()
        removed += 1
        folders.add((path.parent, Path(pack.caches[entry.path.partition("/")[0]])))
    for folder, root in sorted(folders, key=lambda pair: len(pair[0].parts), reverse=True):
        _remove_emptied_folders(folder, root)
    for sha256, members in handed.items():  # before this record goes: never owned by none
        _add_to_record(sha256, members)
    (_records_dir() / f"{pack.sha256}.json").unlink(missing_ok=True)
    # The staging folder of an install killed partway holds the files it had not moved yet
    # (hidden, and swept only by the next install): removing its pack takes them too.
    if pack.caches:
        root = Path(next(iter(pack.caches.values()))).parent
        if root.is_dir():
            _sweep_staging(root)
    return removed


def _add_to_record(sha256: str, members: set[str]) -> None:
    """Name `members` among the files the install of pack `sha256` added (its remove deletes
    them); the rest of its record stays as it is."""
    from turbo_dllm.fsutil import write_atomic

    path = _records_dir() / f"{sha256}.json"
    data = json.loads(path.read_text())
    data["added"] = sorted({*data["added"], *members})
    write_atomic(path, json.dumps(data, indent=1))


def _remove_emptied_folders(folder: Path, root: Path) -> None:
    """Remove `folder`, then each folder above it, while it is empty, up to (not including) the
    cache folder `root`: the folders a remove emptied. `rmdir` removes only an empty folder (one
    that anything, say inductor, fills meanwhile stays); a link on the way, which may lead out of
    the cache, stops it."""
    try:
        real_root = root.resolve(strict=True)
    except OSError:
        return
    while folder != root and root in folder.parents:
        try:
            if folder.resolve(strict=True) != real_root / folder.relative_to(root):
                return  # through a link: perhaps out of the cache, never ours to remove
            os.rmdir(folder)
        except OSError:  # not empty (the common stop), gone, or not ours to remove
            return
        folder = folder.parent


# --- packs on offer -------------------------------------------------------------------------
class OfferedPack(NamedTuple):
    path: Path
    manifest: PackManifest | None  # None: the pack could not be read (`error` says why)
    differences: tuple[PackDifference, ...]
    error: str | None = None

    @property
    def fits(self) -> bool:
        return self.error is None and not self.differences


def pack_folders() -> list[Path]:
    """Where packs are offered: $DLLM_PACK_PATH folders, and `packs/` of a local bundle index
    or mirror ($DLLM_BUNDLE_INDEX as a folder or file:// URL; `dllm mirror create` fills it)."""
    from turbo_dllm.bundles.sources import INDEX_VARIABLE

    folders = [Path(p) for p in os.environ.get(PACKS_VARIABLE, "").split(os.pathsep) if p]
    index = os.environ.get(INDEX_VARIABLE, "")
    if index.startswith("file://"):
        from urllib.parse import unquote, urlparse

        folders.append(Path(unquote(urlparse(index).path)) / "packs")
    elif index and "://" not in index:
        folders.append(Path(index) / "packs")
    return [f for f in folders if f.is_dir()]


def available_packs(host: HostFingerprint, spec_sha256: str | None = None) -> list[OfferedPack]:
    """Every pack on offer, with why it does or does not fit; one that cannot be read is
    offered with its error (it fits nothing), not left out without a word."""
    offered = []
    for folder in pack_folders():
        for path in sorted(folder.glob(f"{PACK_PREFIX}*.tar.zst")):
            try:
                manifest = read_pack_manifest(path)
            except DllmError as error:
                offered.append(OfferedPack(path, None, (), error.message))
                continue
            offered.append(
                OfferedPack(path, manifest, tuple(manifest.key.differences(host, spec_sha256)))
            )
    return offered


def fitting_pack(host: HostFingerprint, spec_sha256: str) -> Path | None:
    """A pack on offer made for this run's spec that fits `host` and is not installed, if any."""
    installed = {p.manifest.content_digest for p in installed_packs()}
    for offer in available_packs(host, spec_sha256):
        if offer.fits and offer.manifest.key.spec_sha256 == spec_sha256:
            if offer.manifest.content_digest not in installed:
                return offer.path
    return None
