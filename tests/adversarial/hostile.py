"""Crafting for adversarial tests: small valid bundles built without a compiler, hostile archives
(bad pax records, bombs), and a mirror that serves other bytes than its catalog pins."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import zstandard

from tests.bundles.crafting import member
from turbo_dllm.bundles.manifest import BuildProvenance, BundleFile, BundleManifest, archive_name
from turbo_dllm.bundles.publish import publish
from turbo_dllm.fsutil import sha256_file

RELEASE = "v-adv"


def tiny_bundle(folder: Path, files: dict[str, bytes], version: str = "0.1.1") -> Path:
    """A valid bundle for this host's target holding `files` (no ops: nothing to compile)."""
    from turbo_dllm.bundles.archive import pack_bundle
    from turbo_dllm.bundles.targets import pick_build_target
    from turbo_dllm.host import collect_fingerprint

    host = collect_fingerprint(apply_overrides=False)
    _, target = pick_build_target("auto", host)
    root = folder / f"files-{version}"
    listed = []
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
        listed.append(BundleFile(path=name, sha256=sha256_file(root / name), size=len(data)))
    manifest = BundleManifest(
        name=archive_name(version, target).removesuffix(".tar.zst"),
        version=version,
        target=target,
        files=tuple(listed),
        ops=(),
        build=BuildProvenance(turbo_dllm="0", cxx="none", cflags=(), torch="none", host=host),
    )
    return pack_bundle(manifest, root, folder / "dist" / archive_name(version, target))


def published(folder: Path, archive: Path) -> tuple[Path, str, object]:
    """`archive` published as release RELEASE in a new mirror: (mirror, catalog sha, entry)."""
    mirror = folder / "mirror"
    result = publish([archive], release=RELEASE, mirror=mirror)
    return mirror, result.catalog_sha256, result.added[0]


def manifest_of(archive: Path) -> bytes:
    from turbo_dllm.bundles.archive import read_archive_manifest

    return read_archive_manifest(archive).to_json().encode()


def tar_zst(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return zstandard.ZstdCompressor().compress(buffer.getvalue())


def hostile_pax(kind: str, manifest: bytes) -> bytes:
    """A bundle.json, then a member whose pax header crashes CPython's tarfile."""
    head = io.BytesIO()
    with tarfile.open(fileobj=head, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info, data = member("bundle.json", manifest)
        tar.addfile(info, io.BytesIO(data))
        info, data = member("lib/x.so", b"x")
        if kind == "sparse-map":
            info.pax_headers = {"GNU.sparse.map": "a,b"}
        elif kind == "sparse-realsize":
            info.pax_headers = {"GNU.sparse.realsize": "x"}
        else:
            info.pax_headers = {"hdrcharset": "Z"}
        tar.addfile(info, io.BytesIO(data))
    tar_bytes = head.getvalue().replace(b"hdrcharset=Z", b"hdrcharset=\xff")
    return zstandard.ZstdCompressor().compress(tar_bytes)


def nested_manifest() -> bytes:
    """An archive whose bundle.json is 100k nested `[`."""
    return tar_zst([member("bundle.json", b"[" * 100_000)])


def pax_bomb(manifest: bytes, record_bytes: int) -> bytes:
    """A bundle.json-first archive whose second header is a pax record of `record_bytes` digits
    (CPython's pax parsing is quadratic in them: CVE-2024-6232); compresses to a few KB."""
    info = tarfile.TarInfo("././@PaxHeader")
    info.type = tarfile.XHDTYPE
    info.size = record_bytes
    out = io.BytesIO()
    with zstandard.ZstdCompressor(level=3).stream_writer(out, closefd=False) as writer:
        writer.write(_tar_block(member("bundle.json", manifest)))
        writer.write(info.tobuf(tarfile.USTAR_FORMAT))
        chunk = b"9" * (1 << 20)
        left = record_bytes
        while left:
            writer.write(chunk[: min(left, len(chunk))])
            left -= min(left, len(chunk))
        writer.write(b"\0" * (-record_bytes % 512 + 1024))
    return out.getvalue()


def _tar_block(entry: tuple[tarfile.TarInfo, bytes]) -> bytes:
    info, data = entry
    return info.tobuf(tarfile.PAX_FORMAT) + data + b"\0" * (-len(data) % 512)


def zero_bomb(manifest: BundleManifest, name: str, size: int) -> bytes:
    """A bundle whose bundle.json honestly lists a `size`-byte file of zeros, and that file: a
    few hundred KB of archive for any `size`."""
    import hashlib

    digest = hashlib.sha256()
    zeros = b"\0" * (1 << 20)
    for start in range(0, size, len(zeros)):
        digest.update(zeros[: min(len(zeros), size - start)])
    listed = manifest.model_copy(
        update={"files": (BundleFile(path=name, sha256=digest.hexdigest(), size=size),)}
    )
    data = listed.to_json().encode()
    info = tarfile.TarInfo(name)
    info.size = size
    out = io.BytesIO()
    with zstandard.ZstdCompressor(level=3).stream_writer(out, closefd=False) as writer:
        writer.write(_tar_block(member("bundle.json", data)))
        writer.write(info.tobuf(tarfile.PAX_FORMAT))
        for start in range(0, size, len(zeros)):
            writer.write(zeros[: min(len(zeros), size - start)])
        writer.write(b"\0" * (-size % 512 + 1024))
    return out.getvalue()


def serve_instead(mirror: Path, entry, hostile: bytes) -> None:
    """The mirror keeps its pinned catalog but serves `hostile` as the bundle, padded to the
    catalog's size (so only the hash can tell)."""
    assert len(hostile) <= entry.size, (len(hostile), entry.size)
    (mirror / "bundles" / entry.file).write_bytes(hostile + b"\0" * (entry.size - len(hostile)))


# What DLLM_HOME/bundles holds besides what `leftovers` lists: the lock, the store's links.
_KEPT = {"install.lock", "install.lock.owner", "active", "previous"}


def leftovers(home: Path) -> list[str]:
    """What a failed install left under DLLM_HOME/bundles: every entry of `downloads/` and
    `store/`, hidden ones too (extractions are made in `store/.staging-<random>` since
    0cd7211, copies being replaced go to `store/.trash-*`), and anything else in `bundles/`
    but the lock and the `active`/`previous` links (the old `staging/` folder, a half-made
    `.active.*` link)."""
    root = home / "bundles"
    if not root.is_dir():
        return []
    found = [name for name in os.listdir(root) if name not in _KEPT | {"downloads", "store"}]
    for sub in ("downloads", "store"):
        if (root / sub).is_dir():
            found += [f"{sub}/{name}" for name in os.listdir(root / sub)]
    return sorted(found)
