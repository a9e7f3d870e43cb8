"""A mirror that serves other bytes under a pinned catalog: the install fails with a DllmError,
keeps none of the bad bytes (the next install from an honest mirror works), and parses none of
them (the archive's hash is checked before zstd or tarfile sees a byte)."""

from __future__ import annotations

import shutil

import pytest

from tests.adversarial.bounded_run import run_dllm
from tests.adversarial.hostile import (
    RELEASE,
    hostile_pax,
    leftovers,
    manifest_of,
    nested_manifest,
    serve_instead,
    zero_bomb,
)
from tests.bundles.server import MirrorServer
from turbo_dllm.bundles.archive import BundleRejected, read_archive_manifest
from turbo_dllm.bundles.install import plan_install, run_install
from turbo_dllm.bundles.store import BundleStore

HOSTILE = ["sparse-map", "sparse-realsize", "hdrcharset", "nested-manifest"]


def hostile_bytes(kind: str, archive) -> bytes:
    return (
        nested_manifest() if kind == "nested-manifest" else hostile_pax(kind, manifest_of(archive))
    )


def install(index, catalog_sha):
    plan = plan_install(RELEASE, index=str(index), catalog_sha256=catalog_sha)
    return run_install(plan, retries=1, backoff_s=0.01)


@pytest.mark.parametrize("kind", HOSTILE)
def test_hostile_bytes_are_refused_and_not_kept(honest, tmp_path, isolated_home, kind):
    mirror, catalog_sha, entry, archive = honest
    evil = tmp_path / "evil-mirror"
    shutil.copytree(mirror, evil)
    serve_instead(evil, entry, hostile_bytes(kind, archive))
    with MirrorServer(evil) as server, pytest.raises(BundleRejected, match="sha256 mismatch"):
        install(server.url, catalog_sha)
    assert leftovers(isolated_home) == []  # no .part, no staging, nothing in the store
    with MirrorServer(mirror) as server:  # the honest mirror: installs at once
        result = install(server.url, catalog_sha)
    assert result.bundle.sha256 == entry.sha256
    assert BundleStore().active().sha256 == entry.sha256


@pytest.mark.parametrize("kind", HOSTILE)
def test_a_poisoned_partial_download_is_hashed_again_not_trusted(honest, isolated_home, kind):
    """What an older dllm left after a hostile mirror: the bad bytes as a full-size .part."""
    mirror, catalog_sha, entry, archive = honest
    downloads = BundleStore().downloads_dir
    downloads.mkdir(parents=True)
    bad = hostile_bytes(kind, archive)
    (downloads / f"{entry.sha256}.part").write_bytes(bad + b"\0" * (entry.size - len(bad)))
    with MirrorServer(mirror) as server:
        result = install(server.url, catalog_sha)
        ranges = [r for path, r in server.state.requests if "/bundles/" in path]
    assert result.bundle.sha256 == entry.sha256
    assert ranges == [None]  # the kept bytes failed their hash: one fresh download
    assert leftovers(isolated_home) == [f"store/{entry.sha256}"]


def test_a_bomb_from_the_mirror_is_never_unpacked(honest, tmp_path, isolated_home, monkeypatch):
    """A few hundred KB that unpack to 256 MiB, served instead of the pinned archive: refused
    on its hash, before zstd sees a byte of it (so nothing of it reaches the disk)."""
    import zstandard

    mirror, catalog_sha, entry, archive = honest
    bomb = zero_bomb(read_archive_manifest(archive), "lib/x.so", 256 * 1024 * 1024)
    evil = tmp_path / "evil-mirror"
    shutil.copytree(mirror, evil)
    serve_instead(evil, entry, bomb)

    def tripwire(*args, **kwargs):
        raise AssertionError("zstd was given bytes that had not matched the catalog's sha256")

    monkeypatch.setattr(zstandard, "ZstdDecompressor", tripwire)
    with MirrorServer(evil) as server, pytest.raises(BundleRejected, match="sha256 mismatch"):
        install(server.url, catalog_sha)
    assert leftovers(isolated_home) == []


def test_hostile_mirror_through_the_cli_is_an_error_not_a_traceback(honest, tmp_path):
    mirror, catalog_sha, entry, archive = honest
    evil = tmp_path / "evil-mirror"
    shutil.copytree(mirror, evil)
    serve_instead(evil, entry, hostile_bytes("sparse-map", archive))
    with MirrorServer(evil) as server:
        done = run_dllm("bundle", "install", "--release", RELEASE, "--auto", "--index",
                        server.url, "--catalog-sha256", catalog_sha)  # fmt: skip
    assert done.code == 2, done.err
    assert "dllm: error:" in done.err and "sha256 mismatch" in done.err
    assert "Traceback" not in done.err
