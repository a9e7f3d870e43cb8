"""`dllm bundle install`: catalog -> trust check -> resolve -> download+extract -> verify -> activate.

`plan_install` does everything that needs no lock (fetch and check the catalog, pick the bundle);
`--dry-run` stops there. `run_install` then holds the store lock while it downloads the archive
in one pass: each block goes to the sha256, the resumable `.part` file and the safe extractor,
which unpacks it into a private staging folder as it arrives. Only when the whole archive
matched the catalog's sha256 is the staging folder renamed into the store and `active` swapped;
on a mismatch or any refusal of the bytes the staging folder and the `.part` file are deleted
and nothing is installed. A verified `.part` file is deleted only once the bundle is in the
store: a process killed before then (SIGKILL, the OOM killer) leaves it for the same command to
hash again and unpack, without downloading it again.

Verify before activate: bytes a mirror sent reach zstd and tarfile before their hash is known,
so the extractor trusts nothing (tar headers bounded, regular files with plain paths listed in
`bundle.json` only, sizes and file counts capped, nothing written outside staging), and
nothing it made is visible until the hash matched. The extractor does not hash each file again
against `bundle.json` (the archive's hash covers those bytes, and publish, the kernel loader and
`dllm bundle verify` check them); every other check stays.

`build_and_install` is the explicit alternative (`--build missing`) when no published bundle can
serve the host (`BundleUnavailable`: no index, an unreachable one, or no fitting entry): it builds
the bundle from the package's native sources with the local toolchain (each op's self-test runs
in the build), verifies the archive like a download, and installs it marked "built on this host".
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from turbo_dllm.bundles.archive import BundleRejected, DiskWriteError, NoRoom, extract_stream
from turbo_dllm.bundles.catalog import (
    MAX_CATALOG_BYTES,
    Catalog,
    CatalogEntry,
    ReleasesLock,
    catalog_path,
    check_release,
    parse_catalog,
    read_releases_lock,
    sha256_bytes,
    trusted_catalog_sha256,
)
from turbo_dllm.bundles.fetch import ArchiveStream, Progress, download_unpacked, drop_download
from turbo_dllm.bundles.manifest import BundleManifest
from turbo_dllm.bundles.resolve import (
    BUILD_MISSING_HINT,
    BundleUnavailable,
    Resolution,
    select_bundle,
)
from turbo_dllm.bundles.sources import (
    INDEX_VARIABLE,
    NotFound,
    Source,
    index_root_hint,
    open_source,
)
from turbo_dllm.bundles.store import (
    DEFAULT_LOCK_TIMEOUT_S,
    BundleStore,
    InstalledBundle,
    StoreUnwritable,
    new_record,
    remove_tree,
)
from turbo_dllm.bundles.target import BundleTarget
from turbo_dllm.errors import DllmError
from turbo_dllm.fsutil import file_system, human_size
from turbo_dllm.host import HostFingerprint, collect_fingerprint
from turbo_dllm.sigterm import signals_deferred

__all__ = [
    "BUILT_HERE",
    "InstallPlan",
    "InstallResult",
    "build_and_install",
    "check_build_fits_described_host",
    "install",
    "plan_install",
    "run_install",
]

BUILT_HERE = "built on this host"


class InstallPlan(NamedTuple):
    release: str
    source: Source
    catalog: Catalog
    catalog_sha256: str
    entry: CatalogEntry
    resolution: Resolution

    def to_json(self) -> dict:
        return {
            "release": self.release,
            "index": self.source.location,
            "catalog_sha256": self.catalog_sha256,
            "bundle": {
                "target": str(self.entry.target),
                "version": self.entry.version,
                "file": self.entry.file,
                "size": self.entry.size,
                "sha256": self.entry.sha256,
            },
            "candidates": [
                {
                    "target": str(c.entry.target),
                    "fits": c.fits,
                    "differences": [str(d) for d in c.differences],
                }
                for c in self.resolution.candidates
            ],
        }


class InstallResult(NamedTuple):
    plan: InstallPlan | None  # None for a bundle built on this host
    bundle: InstalledBundle
    previous: InstalledBundle | None
    reused: bool  # the store already held this bundle; nothing was downloaded
    already_active: bool = False  # ... and it was the active one: nothing changed


def plan_install(
    release: str,
    *,
    index: str | None = None,
    target: BundleTarget | None = None,
    catalog_sha256: str | None = None,
    fingerprint: HostFingerprint | None = None,
    releases_lock: ReleasesLock | None = None,
    offline: bool = False,
    retries: int = 4,
    backoff_s: float = 0.5,
) -> InstallPlan:
    """Fetch and verify the release's catalog and pick the bundle (auto, or `target`). The
    catalog fetch retries a transient failure `retries` times (0: one attempt), like the
    archive's download in `run_install` (`dllm bundle install --retries` is both)."""
    check_release(release)
    if not (index or os.environ.get(INDEX_VARIABLE)):
        raise BundleUnavailable(
            "no bundle index given",
            hint=f"pass --index URL or --mirror PATH, or set {INDEX_VARIABLE}; "
            + BUILD_MISSING_HINT,
        )
    source = open_source(index, offline=offline)
    lock = releases_lock or read_releases_lock()
    expected = trusted_catalog_sha256(release, lock, catalog_sha256)
    path = catalog_path(release)
    try:
        data = source.read_small(path, MAX_CATALOG_BYTES, retries=retries, backoff_s=backoff_s)
    except BundleRejected:
        raise
    except DllmError as error:  # missing or unreachable: nothing published can be read
        inside = index_root_hint(source.location) if isinstance(error, NotFound) else None
        fix = inside or error.hint or "check the index"
        raise BundleUnavailable(error.message, hint=f"{fix}; {BUILD_MISSING_HINT}") from None
    actual = sha256_bytes(data)
    if actual != expected:
        pinned_by = "--catalog-sha256" if catalog_sha256 else "releases.lock"
        raise BundleRejected(
            f"catalog {source.url(path)} has sha256 {actual}, but {pinned_by} pins {expected}",
            hint="the index serves a different catalog than the one this release was published "
            "with; use the official index or a faithful mirror",
        )
    catalog = parse_catalog(data, source.url(path))
    if catalog.release != release:
        raise BundleRejected(
            f"{source.url(path)} is the catalog of release {catalog.release!r}, not {release!r}",
            hint="the index serves another release's catalog under this release's name: use "
            "the official index or a faithful mirror (`dllm mirror verify DIR` checks a mirror)",
        )
    host = fingerprint or collect_fingerprint()
    entry, resolution = select_bundle(catalog, host, target=target)
    return InstallPlan(release, source, catalog, actual, entry, resolution)


def run_install(
    plan: InstallPlan,
    *,
    store: BundleStore | None = None,
    lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
    retries: int = 4,
    backoff_s: float = 0.5,
    progress: Progress | None = None,
) -> InstallResult:
    store = store or BundleStore()
    entry = plan.entry
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(store.locked(lock_timeout_s))
        except StoreUnwritable as error:  # the lock file cannot be written: a read-only home
            unchanged = _already_active(store, plan, error.errno)
            if unchanged is None:
                raise
            return unchanged
        previous = _readable(store.active)
        existing = _readable(lambda: store.get(entry.sha256))
        reused = existing is not None and not store.verify(existing)
        if reused:
            bundle = existing
        else:
            path = f"bundles/{entry.file}"
            room = _Room(store, entry)
            room.check_download()
            with store.writing(entry.file), store.staging() as staging:
                folder = staging / "bundle"

                def unpack(stream: ArchiveStream) -> BundleManifest:
                    # Each attempt extracts from byte 0 into a fresh folder. The result is used
                    # only once the archive matched the catalog's sha256, so its files need no
                    # second hash.
                    remove_tree(folder)
                    try:
                        return extract_stream(
                            stream,
                            folder,
                            label=entry.file,
                            archive_size=entry.size,
                            check_files=False,
                            room=room.check_unpack,
                        )
                    except DiskWriteError:
                        # The disk filled while unpacking: give back what was unpacked, so
                        # the rest of the download still has room in `.part`.
                        remove_tree(folder)
                        raise

                try:
                    manifest = download_unpacked(
                        plan.source,
                        path,
                        unpack=unpack,
                        sha256=entry.sha256,
                        size=entry.size,
                        dest_dir=store.downloads_dir,
                        retries=retries,
                        backoff_s=backoff_s,
                        progress=progress,
                        keep_verified=True,  # deleted below, once the bundle is in the store
                    )
                except NotFound as error:  # the catalog was there, so the index is right
                    raise BundleUnavailable(
                        f"{error.message}: the release's catalog lists it, but the index does "
                        "not hold it",
                        hint="the index is incomplete (a copy or sync that stopped?): copy its "
                        "bundles/ again whole (`dllm mirror verify DIR` checks a mirror), or use "
                        f"another index; {BUILD_MISSING_HINT}",
                    ) from None
                except NoRoom as error:  # the archive verified: say so with today's free space
                    raise room.unpack_error(error.needed) from None
                except DiskWriteError as error:  # writing `.part` or the files: what is kept
                    raise store.write_error(
                        error.errno or 0,
                        entry.file,
                        kept=room.kept(),
                        folder=store.downloads_dir if error.path == room.part else None,
                    ) from None
                # From here on Ctrl-C or SIGTERM waits until the bundle is in the store and
                # active: an interrupted install changed nothing, or it finished.
                held.enter_context(signals_deferred())
                bundle = store.add_extracted(
                    folder,
                    manifest,
                    entry.sha256,
                    label=entry.file,
                    expect_target=entry.target,
                    expect_version=entry.version,
                    record=new_record(
                        archive_sha256=entry.sha256,
                        release=plan.release,
                        source=plan.source.url(path),
                        catalog_sha256=plan.catalog_sha256,
                    ),
                )
                # Kept until the bundle was in the store: a process killed before then left the
                # verified archive for the next run to hash again and unpack, not to download.
                drop_download(room.part)
        with signals_deferred():
            store.make_active(bundle)
        # (A copy already in the store: a download a killed install left is not needed.)
        drop_download(store.downloads_dir / f"{entry.sha256}.part")
    already = reused and previous is not None and previous.sha256 == bundle.sha256
    if previous is not None and previous.sha256 == bundle.sha256:
        previous = None
    return InstallResult(plan, bundle, previous, reused, already)


class _Room:
    """Whether the store's file system can hold an install: the archive (`downloads/`) and its
    files (`store/`) are on disk at once. Checked before the download (the archive alone: what
    it unpacks to is not known yet) and once `bundle.json` is read, before any file is written;
    a full disk met half way would fail other programs' writes meanwhile, and the bare "No
    space left" said nothing of how much is needed."""

    def __init__(self, store: BundleStore, entry: CatalogEntry) -> None:
        self.store, self.entry = store, entry
        self.part = store.downloads_dir / f"{entry.sha256}.part"

    def _left_to_download(self) -> int:
        try:
            have = self.part.stat().st_size
        except OSError:
            have = 0
        return self.entry.size - have if have <= self.entry.size else self.entry.size

    def check_download(self) -> None:
        need = self._left_to_download()
        mount, free = file_system(self.store.root)
        if free is None or need <= free:
            return
        raise DllmError(
            f"not enough free space to download {self.entry.file}: {human_size(need)} to "
            f"download into {self.store.downloads_dir}, {human_size(free)} free on {mount}, "
            "and its files need more to unpack; nothing was installed",
            hint=f"free at least {human_size(need - free)} there (and as much as the bundle "
            "unpacks to), or point DLLM_HOME at a file system with room",
        )

    def check_unpack(self, manifest: BundleManifest) -> None:
        """Room for the files `bundle.json` lists and the rest of the archive still to come
        (when `downloads/` is on the same file system); unverified until the hash matched."""
        need = manifest.total_size
        _, free = file_system(self.store.store_dir)
        if _same_file_system(self.store.store_dir, self.store.downloads_dir):
            need += self._left_to_download()
        if free is not None and need > free:
            raise NoRoom(f"{self.entry.file} needs {need} bytes free", None, manifest.total_size)

    def kept(self) -> str | None:
        """What the hint of an install stopped by a disk error says of the download it kept:
        the whole archive (a disk error while unpacking is raised only once its bytes
        verified), or the bytes a disk error while downloading left for the next run to resume."""
        try:
            have = self.part.stat().st_size
        except OSError:
            return None
        if have == self.entry.size:
            return (
                f"the verified download is kept ({self.part}): once there is room, the same "
                "command unpacks it without downloading it again"
            )
        if 0 < have < self.entry.size:
            return (
                f"the partial download is kept ({have} of {self.entry.size} bytes, {self.part}): "
                "the same command resumes it"
            )
        return None

    def unpack_error(self, needed: int) -> DllmError:
        mount, free = file_system(self.store.store_dir)
        shown = f"{human_size(free)} free" if free is not None else "too little free"
        short = f"at least {human_size(max(needed - free, 1))}" if free is not None else "space"
        return DllmError(
            f"not enough free space to unpack {self.entry.file}: it unpacks to "
            f"{human_size(needed)}, and {self.store.store_dir} has {shown} (on {mount}); "
            "nothing was installed",
            hint=f"free {short} there, or point DLLM_HOME at a file system with room; the "
            f"verified download is kept ({self.part}), so running the same command again "
            "unpacks it without downloading it",
        )


def _same_file_system(first: Path, second: Path) -> bool:
    try:
        return os.stat(first).st_dev == os.stat(second).st_dev
    except OSError:
        return True  # one is not made yet: it will be made beside the other


def build_and_install(
    *,
    store: BundleStore | None = None,
    lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
    log: Callable[[str], None] | None = None,
) -> InstallResult:
    """Build this host's bundle from the package's sources, verify it and make it active."""
    from turbo_dllm.bundles.archive import extract_bundle
    from turbo_dllm.bundles.build import build_bundle

    check_build_fits_described_host()
    store = store or BundleStore()
    with store.locked(lock_timeout_s), contextlib.ExitStack() as deferred:
        previous = _readable(store.active)
        with store.writing("the bundle built on this host"), store.staging() as staging:
            built = build_bundle(staging / "out", log=log)
            folder = staging / "bundle"
            # The same checks a downloaded archive gets, so a broken build is never installed.
            manifest = extract_bundle(built.archive, folder)
            deferred.enter_context(signals_deferred())  # (as in run_install)
            bundle = store.add_extracted(
                folder,
                manifest,
                built.sha256,
                label=built.archive.name,
                expect_target=built.target,
                expect_version=built.manifest.version,
                record=new_record(
                    archive_sha256=built.sha256, source=BUILT_HERE, provenance=BUILT_HERE
                ),
            )
        store.make_active(bundle)
    if previous is not None and previous.sha256 == bundle.sha256:
        previous = None
    return InstallResult(None, bundle, previous, False)


def check_build_fits_described_host() -> None:
    """Refuse to build when DLLM_OVERRIDE_* describe a host this one's bundle does not fit: a
    build is for the host it runs on, so on a login node resolving for GPU nodes (a shared
    DLLM_HOME) it built and activated a CPU bundle that those nodes cannot load."""
    from turbo_dllm.bundles.targets import pick_build_target

    described = collect_fingerprint()
    if not described.overrides:
        return
    _, built = pick_build_target("auto", collect_fingerprint(apply_overrides=False))
    differences = built.differences(described)
    if differences:
        raise DllmError(
            f"--build missing builds this host's bundle ({built}), which does not fit the host "
            f"DLLM_OVERRIDE_* describe: {'; '.join(map(str, differences))}",
            hint="build it on a host like that one (`dllm bundle build`, then `dllm bundle "
            "publish`), or unset DLLM_OVERRIDE_* to build and install this host's bundle",
        )


def _already_active(
    store: BundleStore, plan: InstallPlan, code: int | None
) -> InstallResult | None:
    """The result of an install that changes nothing, for a store whose lock cannot be taken
    because it cannot be written (`code`: a read-only or forbidden DLLM_HOME): when the plan's
    bundle is the active one and every file of it verifies, there is nothing to write, so it
    needs no lock. None otherwise (the caller raises the error)."""
    if code not in (errno.EROFS, errno.EACCES, errno.EPERM):
        return None
    active = _readable(store.active)
    if active is None or active.sha256 != plan.entry.sha256 or store.verify(active):
        return None
    return InstallResult(plan, active, None, True, True)


def _readable(load: Callable[[], InstalledBundle | None]) -> InstalledBundle | None:
    """`load()`, or None when that store entry's bundle.json or install.json is damaged: an
    install replaces a damaged copy of its own bundle (`add_extracted`) instead of stopping on
    the damage it was run to repair."""
    try:
        return load()
    except DllmError:
        return None


def install(
    release: str,
    *,
    index: str | None = None,
    target: BundleTarget | None = None,
    catalog_sha256: str | None = None,
    **options,
) -> InstallResult:
    """Plan and run in one call (the library equivalent of `dllm bundle install --auto`);
    `retries` and `backoff_s`, when given, rule the catalog fetch and the download alike."""
    fetching = {key: options[key] for key in ("retries", "backoff_s") if key in options}
    plan = plan_install(
        release, index=index, target=target, catalog_sha256=catalog_sha256, **fetching
    )
    return run_install(plan, **options)
