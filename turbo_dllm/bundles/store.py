"""The bundle store under `dllm_home()/bundles`: content-addressed installs, atomic activation.

    bundles/
      store/<archive sha256>/     one verified, read-only bundle (bundle.json, install.json, lib/)
      store/.staging-<random>/    an extraction in progress (swept by the next locked operation)
      downloads/<sha256>.part     partial downloads, resumed by the next attempt
      downloads/<sha256>.part.verified   says its .part was verified whole (fetch.marked_verified)
      uninstalled/<sha256>/       records of a removal a killed uninstall began and a sweep finished
      active -> store/<sha256>    the bundle the kernel loader uses (none: `dllm bundle deactivate`)
      previous -> store/<sha256>  what `dllm bundle rollback` returns to
      install.lock                serializes installs, uninstalls, rollbacks and deactivations

A bundle becomes visible only by renaming its finished staging folder into place, and becomes
active only by renaming a new symlink over `active`; a process killed at any point leaves the
previous bundle active and no partial state visible. A damaged copy is replaced by a new one in
one atomic exchange (Linux `renameat2(RENAME_EXCHANGE)`), rollback swaps `active` and
`previous` the same way, and activation exchanges a new link with `active` before the old one
becomes `previous` (`_swap_active`); where that call is missing (another OS, a file system without it) the
old copy goes to `store/.trash-<sha256>-<random>` first, and a process killed before the new
copy took its place leaves `active` pointing at nothing only until the next bundle command (or
reader of `active`) puts that copy back.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal, NamedTuple

from turbo_dllm.bundles.archive import DISK_HINTS, BundleRejected, DiskWriteError
from turbo_dllm.bundles.manifest import (
    MANIFEST_NAME,
    BundleManifest,
    check_sha256,
    find_by_name_or_sha,
)
from turbo_dllm.bundles.target import BundleTarget
from turbo_dllm.errors import DllmError
from turbo_dllm.fsutil import mounted_at
from turbo_dllm.paths import dllm_home
from turbo_dllm.records import Record, RecordError, checked

__all__ = [
    "ActiveBundle",
    "BundleStore",
    "DamagedBundle",
    "InstallRecord",
    "InstalledBundle",
    "active_bundle",
    "exchange",
    "file_lock",
    "StoreUnwritable",
    "new_record",
    "remove_tree",
]

RECORD_NAME = "install.json"
DEFAULT_LOCK_TIMEOUT_S = 60.0
LOCK_POLL_S = 0.05
_SHA256 = re.compile(r"[0-9a-f]{64}")
_TRASH = re.compile(r"\.trash-([0-9a-f]{64})-[0-9a-f]+")


class InstallRecord(Record):
    """Where an installed bundle came from (`install.json`, next to its bundle.json)."""

    format: Literal["turbo_dllm.bundle_install.v1"] = "turbo_dllm.bundle_install.v1"
    archive_sha256: str = checked(check_sha256)
    release: str | None = None
    source: str | None = None
    catalog_sha256: str | None = None
    # "published" (downloaded from a release) or "built on this host" (`--build missing`).
    provenance: str = "published"
    installed_at: str


class InstalledBundle(NamedTuple):
    """A verified bundle in the store. `bundle_id` is `<version>-<target>`."""

    sha256: str
    path: Path
    manifest: BundleManifest
    record: InstallRecord

    @property
    def bundle_id(self) -> str:
        return f"{self.manifest.version}-{self.manifest.target}"

    @property
    def target(self) -> BundleTarget:
        return self.manifest.target

    @property
    def version(self) -> str:
        return self.manifest.version

    @property
    def short_sha(self) -> str:
        return self.sha256[:12]

    def to_json(self) -> dict:
        return {
            "bundle_id": self.bundle_id,
            "sha256": self.sha256,
            "version": self.version,
            "target": str(self.target),
            "path": str(self.path),
            "release": self.record.release,
            "source": self.record.source,
            "provenance": self.record.provenance,
            "installed_at": self.record.installed_at,
            "ops": [op.name for op in self.manifest.ops],
        }


ActiveBundle = InstalledBundle  # the contract's name for what `active_bundle()` returns


class DamagedBundle(NamedTuple):
    """A store entry that cannot be read: its bundle.json or install.json is missing or
    damaged. `uninstall` and `verify` take it by its sha256 (prefix)."""

    sha256: str
    path: Path
    problem: str

    @property
    def short_sha(self) -> str:
        return self.sha256[:12]


class BundleStore:
    def __init__(self, root: Path | None = None) -> None:
        self.root = root or dllm_home() / "bundles"
        # Store entries whose trash copy (a removal or replacement a killed command left) the
        # last sweep deleted: `uninstall` run again after a kill finishes with them.
        self._swept: dict[str, InstalledBundle | DamagedBundle] = {}
        # Set by `uninstall` when the bundle it names was removed by an earlier command's sweep.
        self.removed_earlier = False

    # --- layout -----------------------------------------------------------------------------
    @property
    def store_dir(self) -> Path:
        return self.root / "store"

    @property
    def staging_dir(self) -> Path:
        """Where extractions in progress went before they moved into `store/` (a store that is
        a link to another file system could not take them by a rename): only swept now."""
        return self.root / "staging"

    @property
    def downloads_dir(self) -> Path:
        return self.root / "downloads"

    @property
    def uninstalled_dir(self) -> Path:
        """Notes of removals a killed `uninstall` began and a later command's sweep finished
        (`uninstalled/<sha256>/`: the bundle's bundle.json and install.json), read and deleted
        by that uninstall run again."""
        return self.root / "uninstalled"

    @property
    def lock_path(self) -> Path:
        return self.root / "install.lock"

    def check_folders(self) -> None:
        """Refuse a store whose path goes through a file (a `DLLM_HOME` that is a file, say):
        readers would see an empty store ("no bundles installed") and writers a bare
        "Not a directory". Every bundle command calls it first (`locked` does for writers)."""
        for folder in (*reversed(self.store_dir.parents), self.store_dir):
            try:
                if not folder.exists() or folder.is_dir():
                    continue
            except OSError:  # a folder above that may not be searched: left to the command
                return
            home = dllm_home()
            where = "DLLM_HOME" if os.environ.get("DLLM_HOME") else "the turbo-dllm home"
            what = f"{where} {home}" if folder == home else str(folder)
            raise DllmError(
                f"the bundle store {self.root} cannot be used: {what} is a file, not a folder",
                hint=f"move the file {folder} out of the way, or set DLLM_HOME to a folder",
            )

    # --- reading ----------------------------------------------------------------------------
    def _read(self, sha256: str) -> InstalledBundle | str | None:
        """The bundle in store entry `sha256`, or what is wrong with it (None: no bundle.json)."""
        path = self.store_dir / sha256
        try:
            data = (path / MANIFEST_NAME).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as error:
            return f"{MANIFEST_NAME} cannot be read: {error.strerror}"
        try:
            manifest = BundleManifest.model_validate_json(data)
        except RecordError as error:
            return f"invalid {MANIFEST_NAME}: {error}"
        try:
            record = InstallRecord.model_validate_json((path / RECORD_NAME).read_bytes())
        except OSError as error:
            return f"{RECORD_NAME} cannot be read: {error.strerror}"
        except RecordError as error:
            return f"invalid {RECORD_NAME}: {error}"
        return InstalledBundle(sha256, path, manifest, record)

    def _load(self, sha256: str) -> InstalledBundle | None:
        found = self._read(sha256)
        if isinstance(found, str):
            raise DllmError(
                f"bundle {sha256[:12]} in {self.store_dir} is damaged: {found}",
                hint=self.repair_hint(sha256),
            )
        return found

    def repair_hint(self, sha256: str) -> str:
        """How to repair the damaged store entry `sha256` (a changed or missing file, a damaged
        bundle.json or install.json): the install command that puts it back from where it
        came, where install.json says, or removing it."""
        active = self._link("active") == sha256
        rollback = " (or `dllm bundle rollback`)" if self._can_roll_back() else ""
        remove = (
            f"`dllm bundle deactivate`{rollback}, then `dllm bundle uninstall"
            if active
            else "remove it: `dllm bundle uninstall"
        )
        command = self.reinstall_command(sha256)
        if command is None:
            again = "install its release again (`dllm bundle install` replaces a damaged copy)"
        else:
            made_active = "" if active else "; it becomes the active bundle"
            again = f"install it again: `{command}` (replaces the damaged copy{made_active})"
            from turbo_dllm.bundles.sources import HIDDEN, HIDDEN_NOTE

            if HIDDEN in command:
                again += f" ({HIDDEN_NOTE})"
        return f"{again}, or {remove} {sha256[:12]}`"

    def _can_roll_back(self) -> bool:
        """Whether `dllm bundle rollback` would run: there is an intact previous bundle (with
        none, or a damaged one, it is refused, so a hint must not offer it)."""
        previous = self._link("previous")
        return previous is not None and isinstance(self._read(previous), InstalledBundle)

    def reinstall_command(self, sha256: str) -> str | None:
        """The `dllm bundle install` command that installs store entry `sha256` again from the
        source its install.json records (a bundle built here: by building it again); None
        where install.json cannot be read or names no release and source."""
        import shlex

        path = self.store_dir / sha256
        try:
            record = InstallRecord.model_validate_json((path / RECORD_NAME).read_bytes())
        except (OSError, RecordError):
            return None
        if record.provenance != "published":
            return "dllm bundle install --auto --build missing"
        source, marker = record.source, "/bundles/"
        if not record.release or not source or marker not in source:
            return None
        root = source.rsplit(marker, 1)[0] or "/"
        where = "--index" if "://" in root else "--mirror"
        query = source.rpartition("?")[2] if where == "--index" and "?" in source else ""
        root += f"/?{query}" if query else ""  # its values recorded hidden (sources.redact_url)
        try:  # the target it was installed for: --auto could pick another bundle
            manifest = BundleManifest.model_validate_json((path / MANIFEST_NAME).read_bytes())
            choice = f"--target {manifest.target}"
        except (OSError, RecordError):
            choice = "--auto"
        command = f"dllm bundle install --release {shlex.quote(record.release)} {choice} "
        command += f"{where} {shlex.quote(root)}"
        if record.catalog_sha256 and not _pinned(record.release, record.catalog_sha256):
            command += f" --catalog-sha256 {record.catalog_sha256}"
        return command

    def states(self) -> dict[str, str]:
        """{sha256: "active" | "previous"} for the entries the store's links point at, read
        without reading the entries (a damaged one too)."""
        states = {}
        for name in ("previous", "active"):
            sha = self._link(name)
            if sha:
                states[sha] = name
        return states

    def entries(self) -> list[InstalledBundle | DamagedBundle]:
        """Every store entry, the damaged ones (a missing or unreadable bundle.json or
        install.json) as DamagedBundle instead of an error."""
        if not self.store_dir.is_dir():
            return []
        entries: list[InstalledBundle | DamagedBundle] = []
        for path in sorted(self.store_dir.iterdir()):
            if path.name.startswith(".") or not path.is_dir():
                continue
            entries.append(self._entry(path.name))
        return sorted(  # like `installed()`, the damaged ones last
            entries,
            key=lambda e: (1, "") if isinstance(e, DamagedBundle) else (0, e.record.installed_at),
        )

    def _entry(self, sha256: str) -> InstalledBundle | DamagedBundle:
        found = self._read(sha256)
        if found is None:
            found = f"{MANIFEST_NAME} is missing"
        if isinstance(found, str):
            return DamagedBundle(sha256, self.store_dir / sha256, found)
        return found

    def linked(self, name: str) -> InstalledBundle | DamagedBundle | None:
        """The entry a store link (`active`, `previous`) points at, a damaged one too."""
        sha = self._link(name)
        return self._entry(sha) if sha else None

    def _link(self, name: str) -> str | None:
        """The sha256 a store link (`active`, `previous`) points at, if any. A link to an entry
        that a killed replacement left only in the trash puts that entry back first."""
        if name == "previous" and self._activation_left():
            self._repair_unlocked()
        sha = self._pointed(name)
        if sha is None:
            return None
        if not (self.store_dir / sha).is_dir() and self._trash_of(sha):
            self._repair_unlocked()
        return sha if (self.store_dir / sha).is_dir() else None

    def _pointed(self, name: str) -> str | None:
        """The sha256 named by the store link `name`, whether that entry exists or not."""
        try:
            target = os.readlink(self.root / name)
        except OSError:
            return None
        sha = Path(target).name
        return sha if _SHA256.fullmatch(sha) else None

    def _activation_left(self) -> bool:
        """Whether an activation's link (`_swap_active`) is still there: one killed after its
        exchange, whose `previous` is yet to be written."""
        try:
            return any(self.root.glob(".active.*.*"))
        except OSError:
            return False

    def _trash_of(self, sha256: str) -> list[Path]:
        """The trash copies of store entry `sha256` (see `_replace_entry`)."""
        try:
            return sorted(self.store_dir.glob(f".trash-{sha256}-*"))
        except OSError:
            return []

    def _restore_trash(self) -> list[str]:
        """Put back each store entry that `active` or `previous` points at and that exists only
        as a trash copy: a process killed between the two renames of `_replace_entry`'s
        fallback left it so. Callers hold the lock. Returns the sha256s put back."""
        restored = []
        for name in ("active", "previous"):
            sha = self._pointed(name)
            if sha is None or (self.store_dir / sha).exists():
                continue
            for trash in self._trash_of(sha):
                os.replace(trash, self.store_dir / sha)
                restored.append(sha)
                break
        return restored

    def _repair_unlocked(self) -> None:
        """`_restore_trash` and `_finish_activation` for a reader: only when the lock is free
        at once (a holder may be between the two renames right now) and the home writable;
        otherwise left to the next bundle command, which does it first."""
        try:
            with file_lock(self.lock_path, 0, "another bundle operation is running"):
                self._restore_trash()
                self._finish_activation()
        except (OSError, DllmError):
            pass

    def active(self) -> InstalledBundle | None:
        sha = self._link("active")
        return self._load(sha) if sha else None

    def active_sha256(self) -> str | None:
        """The sha256 `active` names, read without loading (or repairing) that entry."""
        return self._pointed("active")

    def previous(self) -> InstalledBundle | None:
        sha = self._link("previous")
        return self._load(sha) if sha else None

    def installed(self) -> list[InstalledBundle]:
        if not self.store_dir.is_dir():
            return []
        bundles = []
        for path in sorted(self.store_dir.iterdir()):
            if path.name.startswith(".") or not path.is_dir():
                continue
            bundle = self._load(path.name)
            if bundle is not None:
                bundles.append(bundle)
        return sorted(bundles, key=lambda b: b.record.installed_at)

    def get(self, sha256: str) -> InstalledBundle | None:
        return self._load(sha256)

    def find(self, ident: str) -> InstalledBundle:
        """By bundle id (`0.1.0-cp312-...`) or a sha256 prefix of at least 6 characters."""
        found = self._find(ident, self.installed())
        assert isinstance(found, InstalledBundle)
        return found

    def find_entry(self, ident: str) -> InstalledBundle | DamagedBundle:
        """Like `find`, a damaged store entry too (by its sha256 prefix)."""
        return self._find(ident, self.entries())

    def _find(
        self, ident: str, bundles: list[InstalledBundle] | list[InstalledBundle | DamagedBundle]
    ) -> InstalledBundle | DamagedBundle:
        matches, hint = find_by_name_or_sha(
            bundles, ident, lambda b: b.bundle_id if isinstance(b, InstalledBundle) else b.sha256
        )
        if len(matches) == 1:
            return matches[0]
        if not matches:
            known = ", ".join(f"{b.short_sha} ({_entry_name(b)})" for b in bundles) or "none"
            raise DllmError(
                f"no installed bundle {ident!r} (installed: {known})",
                hint=hint
                or "name a bundle by its id or a sha256 prefix of 6+ characters, as "
                "`dllm bundle list` shows them",
            )
        listed = ", ".join(b.short_sha for b in matches)
        raise DllmError(
            f"{ident!r} names several installed bundles: {listed}",
            hint="pass a sha256 prefix instead",
        )

    def verify(self, bundle: InstalledBundle) -> list[str]:
        """Problems with an installed bundle's files (empty: every file matches bundle.json)."""
        from turbo_dllm.fsutil import sha256_file

        problems = []
        listed = {MANIFEST_NAME, RECORD_NAME}
        for entry in bundle.manifest.files:
            listed.add(entry.path)
            path = bundle.path / entry.path
            if not path.is_file() or path.is_symlink():
                problems.append(f"{entry.path}: missing")
            elif path.stat().st_size != entry.size:
                problems.append(f"{entry.path}: {path.stat().st_size} bytes, expected {entry.size}")
            elif sha256_file(path) != entry.sha256:
                problems.append(f"{entry.path}: sha256 differs from bundle.json")
        for path in bundle.path.rglob("*"):
            relative = path.relative_to(bundle.path).as_posix()
            if (path.is_file() or path.is_symlink()) and relative not in listed:
                problems.append(f"{relative}: not part of the bundle")
        return problems

    def leftovers(self) -> list[Leftover]:
        """What operations killed outright left (staging and trash folders, half-made links,
        `.part` downloads), with sizes and what removes them; none while an operation holds the
        lock (its folders are in use). Reads only: works on a read-only home."""
        if self._lock_held_by_another():
            return []
        sweep = (
            "the next `dllm bundle install` (or rollback, deactivate, uninstall) removes it; "
            "deleting it by hand is safe while no bundle command runs"
        )
        found = []
        for folder, pattern in ((self.store_dir, ".*"), (self.staging_dir, "*"), (self.root, ".*")):
            if not folder.is_dir():
                continue
            for path in sorted(folder.glob(pattern)):
                if folder == self.root and not path.name.startswith((".active.", ".previous.")):
                    continue
                what = (
                    "an unpack a killed install left"
                    if path.name.startswith(".staging-") or folder == self.staging_dir
                    else "a copy a killed command was replacing or removing"
                    if path.name.startswith(".trash-")
                    else "a half-made link a killed command left"
                )
                fix = (
                    sweep.replace(
                        "removes it",
                        "removes it (or puts it back where `active` or `previous` needs it)",
                    )
                    if path.name.startswith(".trash-")
                    else sweep
                )
                found.append(Leftover(path, _size_of(path), what, fix))
        from turbo_dllm.bundles.fetch import marked_verified

        for path in self._downloads():
            sha = path.name.removesuffix(".part")
            if self._installed_whole(sha):
                what, fix = "a download of a bundle that is installed", sweep
            elif marked_verified(path):  # kept after a full disk or a kill before the rename
                what = "a complete, verified download"
                fix = (
                    f"the `dllm bundle install` of bundle {sha[:12]} unpacks it without "
                    "downloading it again (it hashes it again first); delete it to free its "
                    "space if you will not install that bundle"
                )
            else:
                what = "a partial download"
                fix = (
                    f"the `dllm bundle install` of bundle {sha[:12]} resumes it; delete it to "
                    "free its space if you will not install that bundle"
                )
            found.append(Leftover(path, _size_of(path), what, fix))
        return found

    def _downloads(self) -> list[Path]:
        """The `.part` files in `downloads/`."""
        try:
            return sorted(self.downloads_dir.glob("*.part"))
        except OSError:
            return []

    def _installed_whole(self, sha256: str) -> bool:
        """Whether store entry `sha256` is a complete bundle (its records read): its download
        is no longer needed (a process killed between the rename into the store and deleting
        the `.part` file left it)."""
        return _SHA256.fullmatch(sha256) is not None and isinstance(
            self._read(sha256), InstalledBundle
        )

    def _lock_held_by_another(self) -> bool:
        """Whether a bundle command holds the lock now (a shared lock cannot be had at once)."""
        import fcntl

        try:
            fd = os.open(self.lock_path, os.O_RDONLY)
        except OSError:  # no lock file: no command ever ran (or it cannot be read)
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True
        except OSError:
            return False
        finally:
            os.close(fd)  # releases the shared lock

    # --- changing (callers hold the lock) ---------------------------------------------------
    @contextlib.contextmanager
    def locked(self, timeout_s: float = DEFAULT_LOCK_TIMEOUT_S) -> Iterator[None]:
        """The install lock: `flock` on install.lock, released by the kernel when the holder
        dies, so it is never stale. Waits up to `timeout_s`, then names the holder. A store
        that cannot be written (its lock file cannot be made) is `StoreUnwritable`."""
        self.check_folders()
        with contextlib.ExitStack() as held:
            try:
                held.enter_context(
                    file_lock(
                        self.lock_path,
                        timeout_s,
                        "another bundle operation is running",
                        waiting=_say_waiting,
                        owner_optional=True,
                    )
                )
            except OSError as error:
                if error.errno not in DISK_HINTS:
                    raise
                raise StoreUnwritable(self, error) from None
            self._sweep_staging()
            yield

    def _sweep_staging(self) -> None:
        """Repair and remove what killed operations left: a store entry `active` or `previous`
        points at that is only in the trash is put back; then staging/trash folders, half-made
        symlinks and the downloads of bundles that are in the store are removed."""
        self._restore_trash()
        self._finish_activation()
        for folder, pattern in ((self.staging_dir, "*"), (self.store_dir, ".*")):
            if folder.is_dir():
                for path in folder.glob(pattern):
                    trashed = _TRASH.fullmatch(path.name)
                    if trashed and not (self.store_dir / trashed[1]).exists():
                        self._swept[trashed[1]] = self._trashed(trashed[1], path)
                        self._note_uninstalled(trashed[1], path)
                    remove_tree(path)
        for pattern in (".active.*", ".previous.*"):
            for path in self.root.glob(pattern):
                path.unlink(missing_ok=True)
        from turbo_dllm.bundles.fetch import drop_download

        for path in self._downloads():
            if self._installed_whole(path.name.removesuffix(".part")):
                drop_download(path)
        with contextlib.suppress(OSError):  # verified marks whose download is gone
            for mark in self.downloads_dir.glob("*.part.verified"):
                if not mark.with_suffix("").exists():
                    mark.unlink(missing_ok=True)

    @contextlib.contextmanager
    def writing(self, label: str) -> Iterator[None]:
        """Report a failure to write into the store while `label` is installed (a full disk, a
        quota, a read-only or forbidden folder) by the store and its file system: the file that
        failed was in a staging folder, deleted by the time the error is shown."""
        try:
            yield
        except DiskWriteError as error:
            raise self.write_error(error.errno or 0, label) from None
        except OSError as error:
            inside = error.filename and str(error.filename).startswith(str(self.root))
            if error.errno not in DISK_HINTS or not inside:
                raise
            raise self.write_error(error.errno, label) from None

    def write_error(
        self, code: int, label: str, *, kept: str | None = None, folder: Path | None = None
    ) -> DllmError:
        """The error for a failed write into the store while `label` was installed (`code`:
        its errno); `kept`, when given, says what of the install was kept for the next run;
        `folder`: the store's folder that was written (default: `store/`)."""
        where = folder or (self.store_dir if self.store_dir.exists() else self.root)
        fix = DISK_HINTS.get(code, "check that folder")
        moves = "" if "DLLM_HOME" in fix else "; DLLM_HOME moves the store"
        return DllmError(
            f"cannot write into the bundle store {where} while installing {label}: "
            f"{os.strerror(code)}; nothing was installed",
            hint=f"{fix} (the store's file system is mounted at {mounted_at(where)}{moves})"
            + (f"; {kept}" if kept else ""),
        )

    @contextlib.contextmanager
    def staging(self) -> Iterator[Path]:
        """A new folder to extract one bundle into: `store/.staging-<random>`, hidden (no reader
        lists a dot-name in `store/`, which shows only complete bundles) and in the same folder
        as the bundles, so the rename that installs it works wherever `store/` is, a link to
        another file system too. Removed on exit, or by the next locked operation when this
        process dies first."""
        self.store_dir.mkdir(parents=True, exist_ok=True)
        staging = self.store_dir / f".staging-{os.urandom(6).hex()}"
        staging.mkdir()
        try:
            yield staging
        finally:
            remove_tree(staging)

    def add_extracted(
        self,
        folder: Path,
        manifest: BundleManifest,
        sha256: str,
        *,
        label: str,
        expect_target: BundleTarget | None,
        expect_version: str | None,
        record: InstallRecord,
    ) -> InstalledBundle:
        """Rename a verified extraction (in `staging()`) into the store as bundle `sha256`.

        A copy of the same bundle already there is replaced (the caller found it damaged).
        `expect_*` are the catalog's word for what the archive `label` holds.
        """
        if expect_target is not None and manifest.target != expect_target:
            raise BundleRejected(
                f"{label} holds a bundle for target {manifest.target}, but the catalog lists it "
                f"for {expect_target}",
                hint="the mirror serves a bundle for another target under this name; "
                "re-publish the release",
            )
        if expect_version is not None and manifest.version != expect_version:
            raise BundleRejected(
                f"{label} holds bundle version {manifest.version}, the catalog says "
                f"{expect_version}",
                hint="the mirror serves another version's bundle under this name; re-publish "
                "the release",
            )
        (folder / RECORD_NAME).write_text(record.model_dump_json(indent=2))
        (folder / RECORD_NAME).chmod(0o444)
        final = self.store_dir / sha256
        if final.exists():
            self._replace_entry(folder, final, sha256)
        else:
            os.replace(folder, final)
        # What was just written, without reading it back (bundle.json is `manifest`'s bytes).
        return InstalledBundle(sha256, final, manifest, record)

    def _replace_entry(self, folder: Path, final: Path, sha256: str) -> None:
        """Put the new copy `folder` in place of the store entry `final` (a damaged copy) so
        that `final` is never missing: one atomic exchange where the system has it, the old
        copy then at `folder`, to delete. Elsewhere two renames through
        `.trash-<sha256>-<random>`: a process killed between them leaves the old copy there,
        which `_restore_trash` puts back (the next bundle command, or a reader of `active`)."""
        if exchange(folder, final):
            remove_tree(folder)
            return
        trash = self.store_dir / f".trash-{sha256}-{os.urandom(6).hex()}"
        os.replace(final, trash)
        os.replace(folder, final)
        remove_tree(trash)

    def activate(self, sha256: str) -> InstalledBundle:
        bundle = self.get(sha256)
        if bundle is None:
            raise DllmError(
                f"bundle {sha256[:12]} is not installed",
                hint="`dllm bundle list` shows the installed bundles; `dllm bundle install` adds one",
            )
        return self.make_active(bundle)

    def make_active(self, bundle: InstalledBundle) -> InstalledBundle:
        """Point `active` at `bundle` (an entry of this store, already read) and `previous` at
        the bundle that was active. With none active (`deactivate`) and `bundle` the previous
        one, `previous` itself becomes `active`, in one rename: it no longer names the bundle
        rollback would return to."""
        current = self._link("active")
        if current is None and self._link("previous") == bundle.sha256:
            os.replace(self.root / "previous", self.root / "active")
        elif current != bundle.sha256 and not (current and self._swap_active(bundle.sha256)):
            if current:  # (no exchange on this system: two steps)
                self._set_link("previous", current)
            self._set_link("active", bundle.sha256)
        return bundle

    def _swap_active(self, sha256: str) -> bool:
        """Point `active` at store entry `sha256` and `previous` at the one `active` named, the
        first in one atomic step: a new link `.active.<sha256>.<random>` to the entry trades
        places with `active` (so it then points at the bundle that was active), then is renamed
        over `previous`. Two links written one after the other left both naming the old bundle
        when killed between them. A process killed after the exchange leaves the new bundle
        active and that link, which `_finish_activation` renames over `previous` (the next
        bundle command, or reader of `previous`). False where the system has no exchange
        (nothing changed)."""
        pending = self.root / f".active.{sha256}.{os.urandom(6).hex()}"
        os.symlink(f"store/{sha256}", pending)
        try:
            swapped = exchange(pending, self.root / "active")
        except OSError:
            pending.unlink(missing_ok=True)
            raise
        if not swapped:
            pending.unlink()
            return False
        os.replace(pending, self.root / "previous")
        return True

    def _finish_activation(self) -> None:
        """Complete an activation a killed process left after its exchange (`_swap_active`):
        its link names the bundle `active` points at and points at another, the one to be
        `previous`. Callers hold the lock."""
        active = self._pointed("active")
        for path in self.root.glob(".active.*.*"):
            parts = path.name.split(".")  # "", "active", sha256, random
            if len(parts) != 4 or active is None or parts[2] != active:
                continue  # killed before the exchange: only swept
            try:
                before = Path(os.readlink(path)).name
            except OSError:
                continue
            if before != active and _SHA256.fullmatch(before):
                os.replace(path, self.root / "previous")

    def deactivate(self) -> InstalledBundle | DamagedBundle | None:
        """Make no bundle active: `active` becomes `previous` in one rename (a process killed at
        any point leaves either both links as they were or the new ones), so `rollback` or an
        install of the same bundle makes it active again; the bundle stays in the store. A
        damaged active bundle is deactivated too. Returns the bundle that was active, None when
        none was (a link left pointing at a missing entry is removed). Callers hold the lock."""
        link = self.root / "active"
        sha = self._link("active")
        if sha is None:
            if link.is_symlink():  # points at nothing (a removed entry) or at no store entry
                link.unlink()
            return None
        entry = self._entry(sha)
        os.replace(link, self.root / "previous")
        return entry

    def rollback(self) -> InstalledBundle:
        previous, current = self._link("previous"), self._link("active")
        if previous is None:
            raise DllmError(
                "there is no previous bundle to roll back to",
                hint="`dllm bundle list` shows installed bundles",
            )
        bundle = self.get(previous)  # a damaged one is an error here, before anything changes
        if bundle is None:
            raise DllmError(
                f"the previous bundle {previous[:12]} is damaged: its {MANIFEST_NAME} is missing",
                hint=f"remove it (dllm bundle uninstall {previous[:12]}) and install the bundle "
                "to return to again",
            )
        if current and exchange(self.root / "active", self.root / "previous"):
            return bundle  # one step: a process killed here has swapped both or neither
        if current is None:  # nothing active (`deactivate`): previous becomes active, one step
            os.replace(self.root / "previous", self.root / "active")
            return bundle
        self._set_link("active", previous)
        if current:
            self._set_link("previous", current)
        return bundle

    def _note_uninstalled(self, sha256: str, trash: Path) -> None:
        """Before the sweep deletes `trash`, the copy a killed uninstall of `sha256` left (no
        store entry and no link names it), note its records, so that uninstall run again after
        another command (an install, a rollback) says it was removed rather than "no installed
        bundle". A note that cannot be written (a full disk) loses only that message."""
        import shutil

        if _SHA256.fullmatch(sha256) is None:
            return
        note = self.uninstalled_dir / sha256
        try:
            note.mkdir(parents=True, exist_ok=True)
            for name in (MANIFEST_NAME, RECORD_NAME):
                with contextlib.suppress(FileNotFoundError):
                    shutil.copyfile(trash / name, note / name)
        except OSError:
            remove_tree(note)

    def _trashed(self, sha256: str, path: Path) -> InstalledBundle | DamagedBundle:
        """What the trash copy `path` of store entry `sha256` was, read before it is deleted."""
        try:
            manifest = BundleManifest.model_validate_json((path / MANIFEST_NAME).read_bytes())
            record = InstallRecord.model_validate_json((path / RECORD_NAME).read_bytes())
        except (OSError, RecordError):
            return DamagedBundle(sha256, self.store_dir / sha256, "partly deleted already")
        return InstalledBundle(sha256, self.store_dir / sha256, manifest, record)

    def uninstall(self, ident: str) -> InstalledBundle | DamagedBundle:
        """Remove an inactive store entry, a damaged one too (what verify reports FAIL). One
        whose removal a killed command began (its trash copy, which this command's lock just
        swept) is returned as removed: running the killed uninstall again finishes it."""
        try:
            bundle = self.find_entry(ident)
        except DllmError:
            finished = self._finished_removal(ident)
            if finished is None:
                raise
            return finished
        remove_tree(self.uninstalled_dir / bundle.sha256)  # a note from an earlier removal
        if self._link("active") == bundle.sha256:
            what = (
                f"bundle {bundle.bundle_id}"
                if isinstance(bundle, InstalledBundle)
                else "the damaged bundle"
            )
            rollback = "`dllm bundle rollback`, or " if self._can_roll_back() else ""
            raise DllmError(
                f"{what} ({bundle.short_sha}) is active",
                hint=f"`dllm bundle deactivate` (or {rollback}install another bundle) first",
            )
        if self._link("previous") == bundle.sha256:
            (self.root / "previous").unlink(missing_ok=True)
        # No link points at it now, so a trash copy left by a kill here is swept, not put back.
        trash = self.store_dir / f".trash-{bundle.sha256}-{os.urandom(6).hex()}"
        os.replace(bundle.path, trash)
        remove_tree(trash)
        return bundle

    def _finished_removal(self, ident: str) -> InstalledBundle | DamagedBundle | None:
        """The store entry `ident` names whose removal a killed uninstall began and a sweep
        finished: this command's (`_swept`), or an earlier command's (its note, deleted once
        read: said once, like the uninstall it finishes; `removed_earlier` set)."""

        def names(sha: str, entry: InstalledBundle | DamagedBundle) -> bool:
            return (len(ident) >= 6 and sha.startswith(ident.lower())) or (
                isinstance(entry, InstalledBundle) and entry.bundle_id == ident
            )

        noted = {}
        with contextlib.suppress(OSError):
            for note in self.uninstalled_dir.iterdir():
                if _SHA256.fullmatch(note.name):
                    noted[note.name] = self._trashed(note.name, note)
        swept = [entry for sha, entry in self._swept.items() if names(sha, entry)]
        earlier = [entry for sha, entry in noted.items() if names(sha, entry)]
        found = swept or earlier
        if len({entry.sha256 for entry in found}) != 1:
            return None
        self.removed_earlier = not swept
        remove_tree(self.uninstalled_dir / found[0].sha256)
        return found[0]

    def _set_link(self, name: str, sha256: str) -> None:
        tmp = self.root / f".{name}.{os.urandom(6).hex()}"
        os.symlink(f"store/{sha256}", tmp)
        os.replace(tmp, self.root / name)


RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100
_NOT_SUPPORTED = {errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP}


def exchange(first: Path, second: Path) -> bool:
    """Swap the two existing paths `first` and `second` in one atomic step (Linux
    `renameat2(RENAME_EXCHANGE)`, glibc 2.28+): True when done, False where this system or
    file system has no such call (then nothing changed, and the caller falls back)."""
    renameat2 = _renameat2()
    if renameat2 is None:
        return False
    import ctypes

    if renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), RENAME_EXCHANGE):
        code = ctypes.get_errno()
        if code in _NOT_SUPPORTED:
            return False
        raise OSError(code, os.strerror(code), str(first), None, str(second))
    return True


@functools.cache
def _renameat2():
    """libc's renameat2, or None (not Linux, or a libc without it)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    function.argtypes = [
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_uint,
    ]
    function.restype = ctypes.c_int
    return function


def _pinned(release: str, catalog_sha256: str) -> bool:
    """Whether the releases.lock shipped in this package pins `release` to `catalog_sha256`."""
    from turbo_dllm.bundles.catalog import read_releases_lock

    try:
        pin = read_releases_lock().releases.get(release)
    except DllmError:
        return False
    return pin is not None and pin.catalog_sha256 == catalog_sha256


def _entry_name(entry: InstalledBundle | DamagedBundle) -> str:
    """A bundle's id, or "damaged" for a store entry that has none to read."""
    return entry.bundle_id if isinstance(entry, InstalledBundle) else "damaged"


@contextlib.contextmanager
def file_lock(
    path: Path,
    timeout_s: float,
    busy: str,
    *,
    waiting: Callable[[float, str], None] | None = None,
    owner_optional: bool = False,
) -> Iterator[None]:
    """An exclusive `flock` on `path` (released by the kernel when the holder dies, so never
    stale), its holder written to `<path>.owner`. Waits up to `timeout_s` (telling
    `waiting(timeout_s, holder)` first, when it has to wait), then raises a DllmError that
    starts with `busy` and names the holder. `owner_optional`: on a full disk (or quota) the
    lock is taken without the owner file (a waiting command then names the holder "unknown"),
    so that a command that frees space can run."""
    path.parent.mkdir(parents=True, exist_ok=True)
    owner = path.with_name(f"{path.name}.owner")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        taken = _flock(fd, 0)
        if not taken and waiting is not None and timeout_s > 0:
            waiting(timeout_s, _holder(owner))
        if not taken and not _flock(fd, timeout_s):
            holder = _holder(owner)
            raise DllmError(
                f"{busy} ({holder}); waited {timeout_s:g} s for {path}",
                hint="wait for it to finish and run the command again (or raise --lock-timeout)",
            )
        try:
            owner.write_text(f"pid {os.getpid()} since {_now()}\n")
        except OSError as error:
            if not owner_optional or error.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            owner.unlink(missing_ok=True)  # not another holder's pid, left by a killed one
        try:
            yield
        finally:
            owner.unlink(missing_ok=True)
    finally:
        os.close(fd)  # releases the lock


def _holder(owner: Path) -> str:
    try:
        return owner.read_text().strip() or "unknown"
    except OSError:  # released (and its owner file removed) since the last try
        return "unknown"


def _say_waiting(timeout_s: float, holder: str) -> None:
    print(
        f"dllm: waiting up to {timeout_s:g} s for another bundle operation to finish ({holder}; "
        "--lock-timeout sets how long)",
        file=sys.stderr,
        flush=True,
    )


def _flock(fd: int, timeout_s: float) -> bool:
    """An exclusive flock on `fd`, polling until `timeout_s` has passed (False: not taken)."""
    import fcntl

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(LOCK_POLL_S)


def remove_tree(path: Path) -> None:
    """Remove a file, link or folder if it exists (a staging leftover: errors ignored)."""
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    elif path.is_dir():
        import shutil

        shutil.rmtree(path, ignore_errors=True)


class Leftover(NamedTuple):
    """A file or folder in the store that a killed operation left, and what removes it."""

    path: Path
    bytes: int
    what: str
    fix: str

    def to_json(self) -> dict:
        return {"path": str(self.path), "bytes": self.bytes, "what": self.what, "fix": self.fix}


def _size_of(path: Path) -> int:
    """Bytes of the file, or of the files under the folder (links not followed)."""
    try:
        if path.is_symlink() or not path.is_dir():
            return path.lstat().st_size if not path.is_symlink() else 0
        return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())
    except OSError:
        return 0


class StoreUnwritable(DllmError):
    """The store's lock file cannot be made or opened (a read-only or forbidden DLLM_HOME, a
    full disk): no command can change the store, and this one changed nothing. `errno` says
    why."""

    def __init__(self, store: BundleStore, error: OSError) -> None:
        self.errno = error.errno
        moves = "" if "DLLM_HOME" in DISK_HINTS[error.errno] else "; DLLM_HOME moves the store"
        super().__init__(
            f"cannot take the bundle store's lock {store.lock_path}: {error.strerror}; nothing "
            "was changed",
            hint=f"{DISK_HINTS[error.errno]} (the store's file system is mounted at "
            f"{mounted_at(store.root)}{moves})",
        )


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def new_record(**fields) -> InstallRecord:
    return InstallRecord(installed_at=_now(), **fields)


def active_bundle() -> InstalledBundle | None:
    """The active bundle of this DLLM_HOME, or None (the cross-issue contract)."""
    return BundleStore().active()
