"""The machine's faults during an install (a full disk, a store on another file system): each is
a `dllm: error:` naming the fix, the previous bundle stays active and nothing half-done is left."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.bundles.test_adversarial import assert_previous_still_active, bundle_b  # noqa: F401
from tests.helpers import assert_user_error
from turbo_dllm.bundles import archive
from turbo_dllm.bundles.store import BundleStore


def install_b(cli, bundle_b, *extra):  # noqa: F811 - the fixture's value
    mirror, catalog_sha, _ = bundle_b
    return cli(
        "bundle", "install", "--release", "v-b", "--auto", "--mirror", mirror,
        "--catalog-sha256", catalog_sha, "--retries", "0", *extra,
    )  # fmt: skip


def test_a_full_disk_while_unpacking_is_a_disk_error_not_a_rejected_archive(
    cli,
    bundle_b,  # noqa: F811
    installed,
    monkeypatch,
):
    """ENOSPC while a verified archive's files were written read "<archive>: cannot extract
    member ...", a refusal of the archive, with no hint; it is the disk's fault."""
    real_open = open

    def full_disk(path, mode="r", *args, **kwargs):
        if "x" in mode:  # the extractor's exclusive creates
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(archive, "open", full_disk, raising=False)
    result = install_b(cli, bundle_b)
    assert_user_error(result, "No space left on device", "nothing was installed", "disk is full")
    assert "cannot extract member" not in result.err
    # It named the file in the staging folder, deleted by then: it names the store, and where
    # that is (the file system and its free space), which is what the user has to fix.
    store = BundleStore()
    assert ".staging-" not in result.err
    assert f"cannot write into the bundle store {store.store_dir}" in result.err
    assert "the store's file system is mounted at" in result.err and " free" in result.err
    assert_previous_still_active(installed)  # and no staging left
    # The archive's bytes verified: they are kept for the next run (not downloaded again).
    entry = bundle_b[2]
    assert sorted(p.name for p in store.downloads_dir.iterdir()) == [
        f"{entry.sha256}.part",
        f"{entry.sha256}.part.verified",  # what `status` reads to call it verified
    ]
    assert "the verified download is kept" in result.err


def test_a_full_disk_while_recording_the_install_names_the_store(
    cli,
    bundle_b,  # noqa: F811 - the fixture's value
    installed,
    monkeypatch,
):
    """ENOSPC writing install.json, after the whole archive was unpacked: a traceback-free
    error naming the store, not the staging folder's file, and nothing installed."""
    from pathlib import Path as RealPath

    real_write_text = RealPath.write_text

    def full_disk(self, *args, **kwargs):
        if self.name == "install.json":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
        return real_write_text(self, *args, **kwargs)

    monkeypatch.setattr(RealPath, "write_text", full_disk)
    result = install_b(cli, bundle_b)
    assert_user_error(result, "No space left on device", "nothing was installed", "disk is full")
    assert f"cannot write into the bundle store {BundleStore().store_dir}" in result.err
    assert ".staging-" not in result.err
    assert_previous_still_active(installed)


@pytest.fixture
def read_only_home(monkeypatch):
    """DLLM_HOME/bundles on a read-only file system, as far as opening files for writing goes
    (tests run as root, whom file modes do not stop; a read-only mount needs privileges)."""
    root = str(BundleStore().root)
    real_open = os.open
    writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT

    def read_only(path, flags, *args, **kwargs):
        if str(path).startswith(root) and flags & writing:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *args, **kwargs)

    def enable():
        monkeypatch.setattr(os, "open", read_only)

    return enable


def test_a_read_only_home_installs_the_active_bundle_again_as_a_no_op(
    cli,
    bundle_b,  # noqa: F811 - the fixture's value
    installed,
    mirror,
    read_only_home,
):
    """Installing the bundle that is already active and intact changes nothing, yet failed on
    a read-only DLLM_HOME because the lock file could not be opened for writing. Anything that
    has to change still fails, naming the read-only file system."""
    read_only_home()
    root, catalog_sha = mirror
    again = cli("bundle", "install", "--release", "v-test", "--auto", "--mirror", root,
                "--catalog-sha256", catalog_sha)  # fmt: skip
    assert again.code == 0, again.err
    assert installed.short_sha in again.out and "already installed and active" in again.out
    other = install_b(cli, bundle_b)
    assert_user_error(other, "Read-only file system", "install.lock")
    assert BundleStore().active().sha256 == installed.sha256


def _other_file_system(near: Path) -> Path | None:
    """A new folder on another file system than `near` (/dev/shm is a tmpfs on Linux), or None."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK):
        return None
    if shm.stat().st_dev == near.stat().st_dev:
        return None
    return Path(tempfile.mkdtemp(prefix="dllm-store-", dir=shm))


def test_a_store_linked_to_another_file_system_installs(cli, mirror, tmp_path):
    """`bundles/store` a link to another disk (a big scratch volume): the finished extraction was
    in `bundles/staging/`, on the home's file system, and its rename into the store failed with
    EXDEV ("Invalid cross-device link") after the whole download; extractions are made inside
    `store/` now."""
    elsewhere = _other_file_system(tmp_path)
    if elsewhere is None:
        pytest.skip("needs a second file system (/dev/shm)")
    try:
        store = BundleStore()
        store.root.mkdir(parents=True)
        store.store_dir.symlink_to(elsewhere)
        root, catalog_sha = mirror
        result = cli("bundle", "install", "--release", "v-test", "--auto", "--mirror", root,
                     "--catalog-sha256", catalog_sha)  # fmt: skip
        assert result.code == 0, result.err
        active = store.active()
        assert active is not None and active.path.resolve().parent == elsewhere.resolve()
        assert cli("bundle", "verify").code == 0
        assert [p.name for p in elsewhere.iterdir()] == [active.sha256]  # no staging left
        assert not store.staging_dir.exists()
    finally:
        shutil.rmtree(elsewhere, ignore_errors=True)
