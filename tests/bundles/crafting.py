"""Helpers that craft bundles, archives and catalogs for tests (valid and malicious)."""

from __future__ import annotations

import dataclasses
import io
import tarfile
from pathlib import Path

from turbo_dllm.bundles.archive import extract_bundle, pack_bundle
from turbo_dllm.bundles.catalog import ReleasesLock, sha256_bytes
from turbo_dllm.bundles.manifest import BundleManifest, archive_name

NO_PINS = ReleasesLock()


@dataclasses.dataclass
class Unpacked:
    manifest: BundleManifest
    root: Path


def unpack(archive: Path, dest: Path) -> Unpacked:
    manifest = extract_bundle(archive, dest)
    for path in dest.rglob("*"):
        if path.is_file():
            path.chmod(0o644)
    return Unpacked(manifest, dest)


def variant(cpu_bundle, tmp_path: Path, *, version: str = "0.1.1", **manifest_changes) -> Path:
    """A valid archive like the built one, with another version (so another sha256) and any
    manifest fields replaced (e.g. target=..., ops=...)."""
    unpacked = unpack(cpu_bundle.archive, tmp_path / f"unpacked-{version}")
    fields = {"version": version, **manifest_changes}
    target = fields.get("target", unpacked.manifest.target)
    fields["name"] = archive_name(fields["version"], target).removesuffix(".tar.zst")
    manifest = unpacked.manifest.model_copy(update=fields)
    manifest = BundleManifest.model_validate(manifest.model_dump(mode="json"))
    out = tmp_path / "variants" / archive_name(manifest.version, manifest.target)
    return pack_bundle(manifest, unpacked.root, out)


def raw_archive(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    """A .tar.zst with exactly these members, in this order (for malicious archives)."""
    import zstandard

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(zstandard.ZstdCompressor().compress(buffer.getvalue()))
    return path


def member(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, link: str = "") -> tuple:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    return info, (data if kind == tarfile.REGTYPE else None)


def write_catalog(mirror: Path, release: str, entries: list[dict]) -> str:
    """Write a catalog by hand (no validation: adversarial tests need broken ones)."""
    import tomlkit

    document = tomlkit.document()
    document["format"] = "turbo_dllm.catalog.v1"
    document["release"] = release
    table = tomlkit.aot()
    for entry in entries:
        item = tomlkit.table()
        item.update(entry)
        table.append(item)
    document["bundles"] = table
    path = mirror / "releases" / release / "catalog.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = tomlkit.dumps(document).encode()
    path.write_bytes(data)
    return sha256_bytes(data)


def serve_archive(mirror: Path, release: str, archive: Path, *, as_target: str) -> str:
    """Put `archive` into `mirror` listed under `as_target` (whatever its bundle.json says)."""
    from turbo_dllm.bundles.target import BundleTarget
    from turbo_dllm.fsutil import sha256_file

    target = BundleTarget.parse(as_target)
    name = archive_name("0.1.1", target)
    dest = mirror / "bundles" / name
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(archive.read_bytes())
    return write_catalog(
        mirror,
        release,
        [
            {
                "target": str(target),
                "version": "0.1.1",
                "file": name,
                "size": dest.stat().st_size,
                "sha256": sha256_file(dest),
            }
        ],
    )


def damage_library(installed) -> None:
    """Flip one byte of the installed bundle's merge op library (modified after install)."""
    library = installed.path / "lib" / "merge_attention_partials.so"
    library.chmod(0o644)
    with library.open("r+b") as handle:
        handle.seek(100)
        byte = handle.read(1)
        handle.seek(100)
        handle.write(bytes([byte[0] ^ 0xFF]))
