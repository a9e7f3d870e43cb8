"""On a full disk (or a used-up quota) no bundle command could take the store's lock: the lock
file existed, but writing its holder's pid into `install.lock.owner` failed with ENOSPC, so
`dllm bundle uninstall`, the command that frees space in the store, was refused with "No space
left on device" (a real 130 MiB tmpfs filled to the last byte), as were rollback and
deactivate, which need no space. The owner file only names the holder for a waiting command:
the lock is taken without it."""

from __future__ import annotations

import errno
import os
import pathlib

from tests.adversarial.hostile import published, tiny_bundle
from turbo_dllm.bundles.install import plan_install, run_install
from turbo_dllm.bundles.store import BundleStore


def _install(folder, version: str):
    archive = tiny_bundle(folder, {"lib/x.so": os.urandom(1024)}, version=version)
    mirror, catalog_sha, _ = published(folder, archive)
    return run_install(plan_install("v-adv", index=str(mirror), catalog_sha256=catalog_sha))


def test_a_full_disk_still_lets_uninstall_rollback_and_deactivate_run(cli, tmp_path, monkeypatch):
    first = _install(tmp_path / "a", "0.1.1").bundle
    _install(tmp_path / "b", "0.1.2")
    real_write_text = pathlib.Path.write_text

    def full_disk(self, *args, **kwargs):
        if self.name.endswith(".owner"):  # a new file's first block: ENOSPC on a full disk
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
        return real_write_text(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "write_text", full_disk)
    rollback = cli("bundle", "rollback")
    assert rollback.code == 0, rollback.err
    assert BundleStore().active().sha256 == first.sha256
    assert cli("bundle", "deactivate").code == 0
    removed = cli("bundle", "uninstall", first.short_sha)
    assert removed.code == 0, removed.err
    assert first.sha256 not in [b.sha256 for b in BundleStore().installed()]
