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


def publish(archives: list[Path], *, release: str, mirror: Path) -> PublishResult:
    check_release(release)
    if not archives:
        raise DllmError("nothing to publish: pass one or more bundle archives")
    make_output_dir(mirror)
    catalog_file = mirror / catalog_path(release)
    if catalog_file.exists():
        catalog = parse_catalog(catalog_file.read_bytes(), str(catalog_file))
        if catalog.release != release:
            raise DllmError(f"{catalog_file} belongs to release {catalog.release!r}")
    else:
        catalog = Catalog(release=release)
    entries = {str(e.target): e for e in catalog.bundles}
    added, unchanged = [], []
    for archive in archives:
        entry = _checked_entry(archive)
        current = entries.get(str(entry.target))
        if current is not None and current != entry:
            raise DllmError(
                f"release {release} already lists a bundle for {entry.target} with sha256 "
                f"{current.sha256}; {archive.name} has {entry.sha256}",
                hint="published bundles never change: publish a new release",
            )
        _copy_immutable(archive, mirror / "bundles" / entry.file)
        if current is None:
            entries[str(entry.target)] = entry
            added.append(entry)
        else:
            unchanged.append(entry)
    text = dump_catalog(Catalog(release=release, bundles=tuple(entries.values())))
    data = text.encode()
    # Validate what we are about to publish with the same parser installs use.
    parse_catalog(data, str(catalog_file))
    catalog_file.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(catalog_file, data)
    return PublishResult(release, catalog_file, sha256_bytes(data), added, unchanged)


def _checked_entry(archive: Path) -> CatalogEntry:
    if not archive.is_file():
        raise DllmError(f"no such archive: {archive}")
    with tempfile.TemporaryDirectory(prefix="dllm-publish-") as tmp:
        manifest = extract_bundle(archive, Path(tmp) / "bundle")
    return CatalogEntry(
        target=manifest.target,
        version=manifest.version,
        file=archive_name(manifest.version, manifest.target),
        size=archive.stat().st_size,
        sha256=sha256_file(archive),
    )


def _copy_immutable(source: Path, dest: Path) -> None:
    if dest.exists():
        if sha256_file(dest) == sha256_file(source):
            return
        raise DllmError(
            f"{dest} already exists with other bytes",
            hint="published files never change: publish a new version or release",
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    try:
        shutil.copyfile(source, tmp)
        tmp.replace(dest)
    finally:
        tmp.unlink(missing_ok=True)
