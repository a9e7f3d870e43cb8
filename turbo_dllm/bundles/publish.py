"""`dllm bundle publish`: add built archives to a mirror folder and (re)write the release catalog.

Mirror layout (served as is over HTTP, or used as a folder / file:// index):

    MIRROR/bundles/turbo-dllm-kernels-<version>-<target>.tar.zst
    MIRROR/releases/<release>/catalog.toml

Every archive is fully extracted and verified before it is published. Published bytes never
change: an existing file or catalog entry with other bytes is refused, not replaced.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from turbo_dllm.bundles.archive import extract_bundle, make_output_dir
from turbo_dllm.bundles.catalog import (
    Catalog,
    CatalogEntry,
    catalog_path,
    check_release,
    dump_catalog,
    parse_catalog,
    sha256_bytes,
)
from turbo_dllm.bundles.manifest import archive_name
from turbo_dllm.errors import DllmError
from turbo_dllm.fsutil import sha256_file, write_atomic

__all__ = ["PublishResult", "publish"]


@dataclass(frozen=True)
class PublishResult:
    release: str
    catalog: Path
    catalog_sha256: str
    added: list[CatalogEntry] = field(default_factory=list)
    unchanged: list[CatalogEntry] = field(default_factory=list)


def publish(
    archives: list[Path],
    *,
    release: str,
    mirror: Path,
    check_catalog: Callable[[str], None] | None = None,
) -> PublishResult:
    """Add `archives` to release `release` of the mirror folder `mirror`.

    All or nothing for what the caller can get wrong: every archive is verified, and checked
    against the release's catalog and the files already in the mirror, before anything is
    written (a broken second archive left the first one copied; a mirror that is a file was
    made only after that). `check_catalog(sha256)`, given the new catalog's hash, may refuse
    it before it is written (`dllm bundle publish --lock`: a release pinned to another hash).
    """
    check_release(release)
    if not archives:
        raise DllmError(
            "nothing to publish: pass one or more bundle archives",
            hint="pass the .tar.zst files `dllm bundle build --out DIR` wrote",
        )
    _check_mirror(mirror)
    checked = [(archive, _checked_entry(archive)) for archive in archives]
    catalog_file = mirror / catalog_path(release)
    if catalog_file.exists():
        catalog = parse_catalog(catalog_file.read_bytes(), str(catalog_file))
        if catalog.release != release:
            raise DllmError(
                f"{catalog_file} belongs to release {catalog.release!r}",
                hint=f"that mirror's catalog for {release} names another release (copied from "
                "another one?): publish into a fresh --mirror DIR, or remove that catalog.toml",
            )
    else:
        catalog = Catalog(release=release)
    entries = {str(e.target): e for e in catalog.bundles}
    given: dict[str, Path] = {}  # target -> the archive of this call that gave it
    added, unchanged, copies = [], [], []
    for archive, entry in checked:
        current = entries.get(str(entry.target))
        if current is not None and current != entry:
            if str(entry.target) in given:
                raise DllmError(
                    f"{given[str(entry.target)].name} and {archive.name} are two different "
                    f"bundles for {entry.target}",
                    hint="a release holds one bundle per target: publish one of them",
                )
            raise DllmError(
                f"release {release} already lists a bundle for {entry.target} with sha256 "
                f"{current.sha256}; {archive.name} has {entry.sha256}",
                hint="published bundles never change: publish a new release",
            )
        dest = mirror / "bundles" / entry.file
        if dest.exists() and sha256_file(dest) != entry.sha256:
            raise DllmError(
                f"{dest} already exists with other bytes",
                hint="published files never change: publish a new version or release",
            )
        if not dest.exists() and dest not in (d for _, d in copies):
            copies.append((archive, dest))
        if current is None:
            entries[str(entry.target)] = entry
            given[str(entry.target)] = archive
            added.append(entry)
        elif entry not in added:
            unchanged.append(entry)
    text = dump_catalog(Catalog(release=release, bundles=tuple(entries.values())))
    data = text.encode()
    # Validate what we are about to publish with the same parser installs use.
    parse_catalog(data, str(catalog_file))
    if check_catalog is not None:
        check_catalog(sha256_bytes(data))
    _check_room(mirror, copies)
    make_output_dir(mirror)
    for archive, dest in copies:
        _copy_immutable(archive, dest)
    catalog_file.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(catalog_file, data)
    return PublishResult(release, catalog_file, sha256_bytes(data), added, unchanged)


# What `dllm mirror create` writes last into an offline mirror (turbo_dllm.mirror.layout, a
# layer above this one): every file of the mirror with its sha256.
_OFFLINE_MIRROR_FILE = "MIRROR.json"


def _check_mirror(mirror: Path) -> None:
    """Refuse a mirror that is a file, or under one, before any archive is verified; nothing
    is created (`make_output_dir` does that once everything is checked). Refuse an offline
    mirror that `dllm mirror create` made too: files published into it are in no MIRROR.json,
    so `dllm mirror verify` failed it afterwards (and a catalog it lists changed under it)."""
    existing = next((p for p in (mirror, *mirror.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        make_output_dir(mirror)  # raises, naming what is in the way
    if (mirror / _OFFLINE_MIRROR_FILE).is_file():
        raise DllmError(
            f"{mirror} is an offline mirror made by `dllm mirror create` (it has "
            f"{_OFFLINE_MIRROR_FILE}); publishing into it would leave that file out of date",
            hint="publish into the bundle index the mirror was made from (or a new folder), "
            "then make the mirror again: dllm mirror create DIR --release RELEASE --from INDEX "
            "--force",
        )


def _checked_entry(archive: Path) -> CatalogEntry:
    if not archive.is_file():
        raise DllmError(
            f"no such archive: {archive}",
            hint="pass the .tar.zst files `dllm bundle build --out DIR` wrote",
        )
    with tempfile.TemporaryDirectory(prefix="dllm-publish-") as tmp:
        manifest = extract_bundle(archive, Path(tmp) / "bundle")
    return CatalogEntry(
        target=manifest.target,
        version=manifest.version,
        file=archive_name(manifest.version, manifest.target),
        size=archive.stat().st_size,
        sha256=sha256_file(archive),
    )


def _check_room(mirror: Path, copies: list[tuple[Path, Path]]) -> None:
    """Refuse, before anything is made, a publish whose archives do not fit the mirror's file
    system: the copy failed midway with the raw OS error of its temporary file and left an
    empty `bundles/` folder (found by the bundle crash audit)."""
    from turbo_dllm.fsutil import file_system, human_size

    need = sum(archive.stat().st_size for archive, _ in copies)
    mount, free = file_system(mirror)
    if free is not None and need > free:
        raise DllmError(
            f"the archives to publish hold {human_size(need)}, and the file system of "
            f"{mirror} (mounted at {mount}) has {human_size(free)} free; nothing was written",
            hint="free space there, or publish into a --mirror on a larger disk",
        )


def _copy_immutable(source: Path, dest: Path) -> None:
    """Copy `source` to `dest` (checked absent, or with the same bytes, by `publish`) through a
    temporary file, so a reader never sees part of it."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    try:
        shutil.copyfile(source, tmp)
        tmp.replace(dest)
    finally:
        tmp.unlink(missing_ok=True)
