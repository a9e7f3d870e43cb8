"""An install needs room for the archive (the `.part` file) and for what it unpacks to, at once.
On a disk with room for one but not both it wrote until the disk was full (other programs' writes
failing meanwhile), said only "the disk is full: free some space" while `df` showed space free,
and every run did the same again. Now it is refused before a byte is written when even the
download does not fit, and when the verified `bundle.json` says the files do not, before any of
them is written: the error names both sizes and the free space, and the verified download is
kept, so the run after freeing space unpacks it without downloading it again."""

from __future__ import annotations

import os

import pytest

from tests.adversarial.hostile import published, tiny_bundle
from tests.bundles.server import MirrorServer
from tests.helpers import assert_user_error
from turbo_dllm.bundles import install
from turbo_dllm.bundles.store import BundleStore

UNPACKED = 256 * 1024


@pytest.fixture
def served(tmp_path):
    """A 256 KiB bundle (random bytes: the archive is as large) published and served on
    127.0.0.1: (server, catalog sha256, entry)."""
    archive = tiny_bundle(tmp_path, {"lib/x.so": os.urandom(UNPACKED)})
    mirror, catalog_sha, entry = published(tmp_path, archive)
    with MirrorServer(mirror) as server:
        yield server, catalog_sha, entry


def _free(monkeypatch, size: int) -> None:
    """The store's file system holds `size` bytes, less what DLLM_HOME's files take (the real
    one has plenty)."""
    from turbo_dllm.fsutil import file_system as real

    home = BundleStore().root

    def small_disk(path):
        used = sum(p.stat().st_size for p in home.rglob("*") if p.is_file())
        return real(path)[0], max(size - used, 0)

    monkeypatch.setattr(install, "file_system", small_disk, raising=False)


def _install(cli, server, catalog_sha):
    return cli(
        "bundle", "install", "--release", "v-adv", "--auto", "--index", server.url,
        "--catalog-sha256", catalog_sha, "--retries", "0",
    )  # fmt: skip


def _bundle_requests(server) -> int:
    return sum("/bundles/" in path for path, _ in server.state.requests)


def test_no_room_for_the_download_is_refused_before_a_byte_is_written(cli, served, monkeypatch):
    server, catalog_sha, entry = served
    _free(monkeypatch, entry.size // 2)
    result = _install(cli, server, catalog_sha)
    assert_user_error(result, "not enough free space to download", "nothing was installed")
    assert "free at least" in result.err and "DLLM_HOME" in result.err
    assert _bundle_requests(server) == 0
    store = BundleStore()
    assert not list(store.downloads_dir.glob("*.part")) if store.downloads_dir.exists() else True
    assert store.active() is None


def test_no_room_to_unpack_keeps_the_verified_download_for_the_next_run(cli, served, monkeypatch):
    server, catalog_sha, entry = served
    # Room for the archive, not for the archive and its files together.
    with monkeypatch.context() as small:
        _free(small, entry.size + UNPACKED // 2)
        result = _install(cli, server, catalog_sha)
    assert_user_error(result, "not enough free space to unpack", "nothing was installed")
    assert f"unpacks to {UNPACKED // 1024}.0 KiB" in result.err, result.err
    assert "the verified download is kept" in result.err
    store = BundleStore()
    assert store.active() is None and store.installed() == []
    part = store.downloads_dir / f"{entry.sha256}.part"
    assert part.stat().st_size == entry.size
    assert [p.name for p in store.store_dir.iterdir()] == []  # no staging left behind

    requests = _bundle_requests(server)
    result = _install(cli, server, catalog_sha)
    assert result.code == 0, result.err
    assert _bundle_requests(server) == requests  # unpacked from the kept file, not downloaded
    assert BundleStore().active().sha256 == entry.sha256
    assert not part.exists()
