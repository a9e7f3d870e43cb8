"""The machine's faults during an install (a full disk, a store on another file system): each is
a `dllm: error:` naming the fix, the previous bundle stays active and nothing half-done is left."""

from __future__ import annotations

import errno
import os

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
    assert_previous_still_active(installed)
    store = BundleStore()
    assert list(store.downloads_dir.iterdir()) == []
    assert list(store.staging_dir.iterdir()) == []
