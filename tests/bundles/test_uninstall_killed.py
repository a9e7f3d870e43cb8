"""`dllm bundle uninstall` killed (SIGKILL) while it deleted the bundle's files: the bundle is out
of the store (moved to a trash folder first), and the next bundle command deletes the rest. Run
again, as a user does with a command that did not finish, it said "no installed bundle" and
exited 2; it now finishes the removal and says the bundle is uninstalled. When another bundle
command ran in between (an install, a rollback), that command's sweep deleted the rest and the
uninstall run again said "no installed bundle" (exit 2): the sweep now notes what it finished
(`uninstalled/<sha256>.json`), and the uninstall run again says it was already removed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.adversarial.hostile import tiny_bundle
from turbo_dllm.bundles.publish import publish
from turbo_dllm.bundles.store import BundleStore

KILLED_WHILE_DELETING = """
import os, signal, sys
from turbo_dllm.bundles import store
real = store.remove_tree
def remove_tree(path):
    if ".trash-" in str(path):
        os.kill(os.getpid(), signal.SIGKILL)
    real(path)
store.remove_tree = remove_tree
from turbo_dllm.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("between", [None, "install", "rollback"])
def test_an_uninstall_run_again_after_a_kill_finishes_it(cli, tmp_path, between):
    mirror = tmp_path / "mirror"
    published = []
    for version in ("0.1.1", "0.1.2"):
        archive = tiny_bundle(tmp_path / version, {"lib/a.so": os.urandom(999)}, version=version)
        published.append(publish([archive], release=f"v-{version}", mirror=mirror))
    for result, version in zip(published, ("0.1.1", "0.1.2"), strict=True):
        installed = cli(
            "bundle", "install", "--release", f"v-{version}", "--auto", "--mirror", mirror,
            "--catalog-sha256", result.catalog_sha256,
        )  # fmt: skip
        assert installed.code == 0, installed.err
    first = published[0].added[0].sha256
    process = subprocess.run(
        [sys.executable, "-c", KILLED_WHILE_DELETING, "bundle", "uninstall", first[:12]],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert process.returncode == -signal.SIGKILL, process.stderr
    store = BundleStore()
    assert [b.sha256 for b in store.installed()] == [published[1].added[0].sha256]

    if between == "install":  # the active bundle's release again: changes nothing but sweeps
        result = published[1]
        assert cli(
            "bundle", "install", "--release", "v-0.1.2", "--auto", "--mirror", mirror,
            "--catalog-sha256", result.catalog_sha256,
        ).code == 0  # fmt: skip
    elif between == "rollback":  # refused (no previous bundle), after its lock's sweep
        assert cli("bundle", "rollback").code != 0
    if between:
        assert not [p for p in store.store_dir.iterdir() if p.name.startswith(".trash-")]

    again = cli("bundle", "uninstall", first[:12])
    assert again.code == 0, again.err
    assert again.out.startswith("uninstalled 0.1.1-") and first[:12] in again.out
    if between:
        assert "already removed" in again.out, again.out
    # said once: run a third time, it is simply not installed
    assert cli("bundle", "uninstall", first[:12]).code == 2
    assert [p.name for p in store.store_dir.iterdir()] == [published[1].added[0].sha256]
    assert store.active().sha256 == published[1].added[0].sha256
