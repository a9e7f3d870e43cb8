"""An install stopped (SIGTERM) before it downloaded anything, here while it waited for another
bundle command's lock, said "the partial download is kept: the same command resumes it" when
`downloads/` held any `.part` at all (another bundle's, left days ago). It says so now only for
bytes this install downloaded."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.adversarial.hostile import published, tiny_bundle
from turbo_dllm.bundles.store import BundleStore


def test_a_stop_before_any_download_does_not_claim_one_was_kept(tmp_path):
    mirror, catalog_sha, _ = published(tmp_path, tiny_bundle(tmp_path, {"lib/a.so": b"x"}))
    store = BundleStore()
    store.downloads_dir.mkdir(parents=True)
    stale = store.downloads_dir / f"{'ab' * 32}.part"
    stale.write_bytes(b"x" * 1000)  # another bundle's, from an install stopped a day ago
    os.utime(stale, (time.time() - 86400,) * 2)
    with store.locked(0):  # another bundle command runs
        process = subprocess.Popen(
            [sys.executable, "-m", "turbo_dllm", "bundle", "install", "--release", "v-adv",
             "--auto", "--mirror", mirror, "--catalog-sha256", catalog_sha],
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        waiting = process.stderr.readline()
        assert "waiting up to" in waiting, waiting
        os.kill(process.pid, signal.SIGTERM)
        err = process.stderr.read()
        process.wait(timeout=60)
    assert process.returncode == -signal.SIGTERM
    assert "bundle install interrupted by SIGTERM: nothing changed" in err, err
    assert "partial download is kept" not in err
