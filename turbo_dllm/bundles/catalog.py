"""Release catalogs (`releases/<release>/catalog.toml`) and the releases lock (the trust root).

Trust chain: the package's `releases.lock` pins each release's catalog sha256 (or the user passes
`--catalog-sha256`); the catalog pins each bundle archive's sha256 and size; the archive's
`bundle.json` pins every file inside. The catalog hash is over its exact bytes, so it does not
depend on how the file travelled (HTTPS, a USB stick, a mirror).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from turbo_dllm.bundles.manifest import SHA256, archive_name, canonical_version, check_sha256
from turbo_dllm.bundles.target import BundleTarget
from turbo_dllm.errors import DllmError
from turbo_dllm.records import Record, RecordError, checked

__all__ = [
    "CATALOG_FORMAT",
    "LOCK_FORMAT",
    "MAX_CATALOG_BYTES",
    "Catalog",
    "CatalogEntry",
    "ReleasePin",
    "ReleasesLock",
    "catalog_path",
    "check_pin",
    "check_release",
    "dump_catalog",
    "parse_catalog",
    "pin_release",
    "read_releases_lock",
    "trusted_catalog_sha256",
]

CATALOG_FORMAT = "turbo_dllm.catalog.v1"
LOCK_FORMAT = "turbo_dllm.releases.v1"
MAX_CATALOG_BYTES = 1024 * 1024
_RELEASE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")


def check_release(name: str) -> str:
    if not _RELEASE.match(name):
        raise DllmError(
            f"invalid release name: {name!r}", hint="use letters, digits and . _ + -, e.g. v0.1.0"
        )
    return name


def catalog_path(release: str) -> str:
    """Where a release's catalog lives relative to a mirror or index root."""
    return f"releases/{check_release(release)}/catalog.toml"


class CatalogEntry(Record):
    """One bundle of a release; `file` is the archive's name under the mirror's bundles/."""

    target: BundleTarget
    version: str = checked(canonical_version)
    file: str
    size: int
    sha256: str = checked(check_sha256)

    def _problems(self) -> Iterator[tuple[str, str]]:
        if self.size <= 0:
            yield "size", f"must be > 0, got {self.size}"
        expected = archive_name(self.version, self.target)
        if self.file != expected:
            yield "file", f"file {self.file!r} should be {expected!r}"


class Catalog(Record):
    format: Literal["turbo_dllm.catalog.v1"] = CATALOG_FORMAT
    release: str
    bundles: tuple[CatalogEntry, ...] = ()

    def _problems(self) -> Iterator[tuple[str, str]]:
        for key, label in ((lambda e: str(e.target), "target"), (lambda e: e.file, "file")):
            seen: dict[str, int] = {}
            for entry in self.bundles:
                seen[key(entry)] = seen.get(key(entry), 0) + 1
            for value, n in seen.items():
                if n > 1:
                    yield "bundles", f"duplicate catalog entry: {label} {value} is listed {n} times"


def parse_catalog(data: bytes, source: str) -> Catalog:
    from turbo_dllm.bundles.toml import TomlError, loads

    try:
        document = loads(data.decode("utf-8"))
    except (TomlError, UnicodeDecodeError) as error:
        raise DllmError(
            f"{source}: not a valid catalog.toml: {error}",
            hint="the release catalog is damaged or not one: use the catalog.toml `dllm bundle "
            "publish` wrote (releases/RELEASE/catalog.toml), or ask its publisher for it",
        ) from None
    try:
        return Catalog.model_validate(document)
    except RecordError as error:
        raise DllmError(
            f"{source}: invalid catalog: {error}",
            hint="the release catalog is malformed; ask its publisher to fix it",
        ) from None


def dump_catalog(catalog: Catalog) -> str:
    """Deterministic TOML: entries sorted by target, so equal catalogs have equal hashes."""
    import tomlkit

    document = tomlkit.document()
    document.add(
        tomlkit.comment("turbo-dllm release catalog; its sha256 is pinned in releases.lock")
    )
    document["format"] = catalog.format
    document["release"] = catalog.release
    entries = tomlkit.aot()
    for entry in sorted(catalog.bundles, key=lambda e: str(e.target)):
        table = tomlkit.table()
        for key, value in entry.model_dump(mode="json").items():
            table[key] = value
        entries.append(table)
    document["bundles"] = entries
    return tomlkit.dumps(document)


class ReleasePin(Record):
    catalog_sha256: str = checked(check_sha256)


class ReleasesLock(Record):
    format: Literal["turbo_dllm.releases.v1"] = LOCK_FORMAT
    releases: dict[str, ReleasePin] = {}


def read_releases_lock(path: Path | None = None) -> ReleasesLock:
    """The lock shipped inside this package (or the one at `path`)."""
    from turbo_dllm.bundles.resources import releases_lock_path
    from turbo_dllm.bundles.toml import loads

    path = path or releases_lock_path()
    try:
        document = loads(path.read_text(encoding="utf-8"))
        return ReleasesLock.model_validate(document)
    except Exception as error:  # unreadable, not TOML, or not a lock: all mean a broken install
        raise DllmError(
            f"cannot read the releases lock {path}: {error}",
            hint="reinstall turbo-dllm; the lock is part of the package",
        ) from None


def trusted_catalog_sha256(release: str, lock: ReleasesLock, explicit: str | None) -> str:
    """The hash the catalog of `release` must have: the lock's pin and/or `--catalog-sha256`."""
    pinned = lock.releases.get(release)
    if explicit is not None:
        explicit = explicit.strip().lower()
        if not re.match(SHA256, explicit):
            raise DllmError(
                f"--catalog-sha256 {explicit!r} is not a sha256 hex digest",
                hint="pass the 64 hex digits `dllm bundle publish` printed as the catalog's sha256",
            )
        if pinned and pinned.catalog_sha256 != explicit:
            raise DllmError(
                f"--catalog-sha256 {explicit} contradicts the pin of release {release} in "
                f"releases.lock ({pinned.catalog_sha256})",
                hint="drop --catalog-sha256: this release is pinned by turbo-dllm itself",
            )
        return explicit
    if pinned is None:
        known = ", ".join(sorted(lock.releases)) or "none"
        raise DllmError(
            f"release {release} is not pinned in this turbo-dllm's releases.lock (pinned: {known})",
            hint="pass --catalog-sha256 SHA with the hash its publisher gave you "
            "(`dllm bundle publish` prints it)",
        )
    return pinned.catalog_sha256


def read_lock_to_pin(path: Path):
    """(tomlkit document, ReleasesLock) of the lock file `--lock` names; a DllmError when it
    cannot be read or is not a releases lock (`dllm bundle publish` checks it before writing)."""
    import tomlkit

    try:
        document = tomlkit.parse(path.read_text(encoding="utf-8"))
        return document, ReleasesLock.model_validate(document.unwrap())
    except OSError as error:
        reason = error.strerror
    except Exception as error:  # tomlkit's parse errors, RecordError: not a releases lock
        reason = str(error)
    raise DllmError(
        f"--lock {path} is not a readable releases lock: {reason}",
        hint=f'a releases lock is a TOML file with the line format = "{LOCK_FORMAT}" and a '
        "[releases] table, like bundles/releases.lock",
    )


def check_pin(path: Path, lock: ReleasesLock, release: str, sha256: str) -> bool:
    """Whether `lock` (read from `path`) already pins `release` to `sha256`; a DllmError when
    it pins the release to another hash (published releases are immutable)."""
    current = lock.releases.get(release)
    if current is None:
        return False
    if current.catalog_sha256 == sha256:
        return True
    raise DllmError(
        f"release {release} is already pinned to {current.catalog_sha256} in {path}",
        hint="a published release never changes; publish under a new release name",
    )


def pin_release(path: Path, release: str, sha256: str) -> bool:
    """Add `release = sha256` to the lock file at `path`, keeping its comments.

    Returns False when the same pin is already there; a release pinned to another hash is
    refused: published releases are immutable.
    """
    import tomlkit

    check_release(release)
    document, lock = read_lock_to_pin(path)
    if check_pin(path, lock, release, sha256):
        return False
    releases = document.setdefault("releases", tomlkit.table())
    pin = tomlkit.inline_table()
    pin["catalog_sha256"] = sha256
    releases[release] = pin
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(tomlkit.dumps(document), encoding="utf-8")
    tmp.replace(path)
    return True


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
