"""A mirror that serves other bytes under a pinned catalog: the install fails with a DllmError
naming the hash, keeps none of the bad bytes (the next install from an honest mirror works) and
activates none of them. The bytes are unpacked as they download (verify before activate), so
the extractor's bounds hold for them: nothing written outside staging, no bomb unpacked."""

from __future__ import annotations

import os
import shutil
import tarfile

import pytest

from tests.adversarial.bounded_run import run_dllm
from tests.adversarial.hostile import (
    RELEASE,
    hostile_pax,
    leftovers,
    manifest_of,
    nested_manifest,
    serve_instead,
    tar_zst,
    tiny_bundle,
    zero_bomb,
)
from tests.bundles.crafting import member
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


def test_a_bomb_from_the_mirror_is_refused_before_a_byte_of_it_is_written(
    honest, tmp_path, isolated_home, monkeypatch
):
    """A few hundred KB that unpack to 256 MiB, served instead of the pinned archive: its
    bundle.json lists more than the expansion cap allows for the catalog's size, so no member
    byte is read or written; the error is the hash, and nothing is kept."""
    from turbo_dllm.bundles import archive as archive_module

    mirror, catalog_sha, entry, archive = honest
    bomb = zero_bomb(read_archive_manifest(archive), "lib/x.so", 256 * 1024 * 1024)
    evil = tmp_path / "evil-mirror"
    shutil.copytree(mirror, evil)
    serve_instead(evil, entry, bomb)

    def tripwire(*args, **kwargs):
        raise AssertionError("a member of an archive over the expansion cap was unpacked")

    monkeypatch.setattr(archive_module, "member_chunks", tripwire)
    with MirrorServer(evil) as server, pytest.raises(BundleRejected, match="sha256 mismatch"):
        install(server.url, catalog_sha)
    assert leftovers(isolated_home) == []


def test_a_valid_bundle_with_other_bytes_unpacks_in_staging_but_never_activates(
    honest, tmp_path, isolated_home, monkeypatch
):
    """Verify before activate: a mirror serves a whole, valid bundle that is not the pinned
    one. It unpacks completely into staging as it downloads, then fails its hash: the staging
    folder and the download are deleted and nothing is installed or active."""
    from turbo_dllm.bundles import install as install_module

    mirror, catalog_sha, entry, archive = honest
    other = tiny_bundle(tmp_path / "other", {"lib/x.so": os.urandom(60 * 1024)})
    evil = tmp_path / "evil-mirror"
    shutil.copytree(mirror, evil)
    serve_instead(evil, entry, other.read_bytes())
    unpacked = []
    extract = install_module.extract_stream

    def spy(*args, **kwargs):
        unpacked.append(extract(*args, **kwargs))
        return unpacked[-1]

    monkeypatch.setattr(install_module, "extract_stream", spy)
    with MirrorServer(evil) as server, pytest.raises(BundleRejected, match="sha256 mismatch"):
        install(server.url, catalog_sha)
    assert [m.total_size for m in unpacked] == [60 * 1024]  # it did unpack, completely
    assert leftovers(isolated_home) == []
    assert BundleStore().active() is None and BundleStore().installed() == []


def test_escaping_members_from_the_mirror_write_nothing_outside_staging(
    honest, tmp_path, isolated_home
):
    """Members that climb out or link out, served under an honest pin: refused as they are
    read (nothing lands outside staging), and the error is the hash."""
    mirror, catalog_sha, entry, archive = honest
    manifest = manifest_of(archive)
    for bad in (
        member("../escaped", b"owned"),
        member(str(tmp_path / "escaped"), b"owned"),
        member("lib/link", kind=tarfile.SYMTYPE, link=str(tmp_path)),
    ):
        evil = tmp_path / "evil-mirror"
        shutil.rmtree(evil, ignore_errors=True)
        shutil.copytree(mirror, evil)
        serve_instead(evil, entry, tar_zst([member("bundle.json", manifest), bad]))
        with MirrorServer(evil) as server, pytest.raises(BundleRejected, match="sha256 mismatch"):
            install(server.url, catalog_sha)
        assert not list(tmp_path.rglob("escaped")) and not list(isolated_home.rglob("escaped"))
        assert leftovers(isolated_home) == []


def test_leftovers_sees_every_place_an_install_writes(isolated_home):
    """The checks above trust `leftovers`: it must list what an install leaves anywhere under
    bundles/ (it looked in the old bundles/staging/ folder, by name, after staging moved)."""
    root = isolated_home / "bundles"
    for folder in ("store/.staging-0a1b2c", "store/.trash-0a1b2c", "staging/0a1b2c"):
        (root / folder).mkdir(parents=True)
    (root / "downloads").mkdir()
    (root / "downloads" / "ab.part").write_bytes(b"x")
    (root / "install.lock").touch()
    os.symlink("store/0a1b2c", root / ".active.0a1b2c")
    os.symlink("store/0a1b2c", root / "active")
    assert leftovers(isolated_home) == [
        ".active.0a1b2c",
        "downloads/ab.part",
        "staging",
        "store/.staging-0a1b2c",
        "store/.trash-0a1b2c",
    ]


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
