"""A bundle command killed between the steps of a store change: `active` never points at nothing.

Each test runs a real `dllm bundle ...` in a child process that pauses at one point of the change
(patched in from the child's own script, not a hook in the store), kills it there with SIGKILL,
and checks what the next reader and the next command find.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from tests.bundles.test_adversarial import bundle_b  # noqa: F401
from turbo_dllm.bundles.store import BundleStore

# The child: argv[1] says where it pauses (prints PAUSED, then sleeps until killed); the rest is
# the dllm command line.
CHILD = """
import os, sys, time
from turbo_dllm.bundles import store

def pause():
    sys.stdout.write("PAUSED\\n")
    sys.stdout.flush()
    time.sleep(300)

where = sys.argv[1]
if where == "after-exchange":  # the atomic exchange done, the old copy not yet deleted
    real_exchange = store.exchange

    def exchange(first, second):
        done = real_exchange(first, second)
        if done:
            pause()
        return done

    store.exchange = exchange
elif where == "between-renames":  # no exchange on this system: between the two renames
    store.exchange = lambda first, second: False

    class Os:
        def __getattr__(self, name):
            return getattr(os, name)

        @staticmethod
        def replace(src, dst):
            os.replace(src, dst)
            if ".trash-" in os.fspath(dst):
                pause()

    store.os = Os()
elif where == "between-links":  # a store link written, the next one not yet
    real_set_link = store.BundleStore._set_link

    def set_link(self, name, sha256):
        real_set_link(self, name, sha256)
        pause()

    store.BundleStore._set_link = set_link
from turbo_dllm.cli import main

sys.exit(main(sys.argv[2:]))
"""


def run_child(where: str, *command: str) -> tuple[bool, int, str]:
    """Run `dllm COMMAND` in a child that pauses at `where`; SIGKILL it if it gets there.
    Returns (whether it paused, its exit status, its stderr)."""
    process = subprocess.Popen(
        [sys.executable, "-c", CHILD, where, *map(str, command)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    watchdog = threading.Timer(120, process.kill)
    watchdog.start()
    try:
        paused = any(line == "PAUSED\n" for line in process.stdout)
        if paused:
            os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=60)
        err = process.stderr.read()
    finally:
        watchdog.cancel()
        process.stdout.close()
        process.stderr.close()
    return paused, process.returncode, err


def killed_at(where: str, *command: str) -> None:
    """`run_child`, which must have been killed at `where`."""
    paused, code, err = run_child(where, *command)
    assert paused, f"the child never reached {where} (exit {code}): {err}"
    assert code == -signal.SIGKILL


def install_command(mirror):
    root, catalog_sha = mirror
    return ("bundle", "install", "--release", "v-test", "--auto", "--mirror", root,
            "--catalog-sha256", catalog_sha)  # fmt: skip


def damage(bundle) -> None:
    """Change one library of an installed bundle: `verify` fails, and installing its release
    again replaces the copy."""
    library = bundle.path / "lib" / "merge_attention_partials.so"
    library.chmod(0o644)
    library.write_bytes(library.read_bytes() + b"\0")
    assert BundleStore().verify(BundleStore().get(bundle.sha256))


def exchange_works(folder) -> bool:
    from turbo_dllm.bundles.store import exchange

    (folder / "x").mkdir()
    (folder / "y").mkdir()
    return exchange(folder / "x", folder / "y")


def hidden(store: BundleStore) -> list[str]:
    return sorted(p.name for p in store.store_dir.iterdir() if p.name.startswith("."))


def test_killed_while_replacing_a_damaged_copy_leaves_it_active(cli, installed, mirror, tmp_path):
    """Installing a damaged active bundle's release again swaps in the fresh copy with one
    atomic exchange: killed right after it, `active` is the fresh copy; what is left (the old
    copy, in staging) is swept by the next command."""
    if not exchange_works(tmp_path):
        pytest.skip("this file system has no renameat2(RENAME_EXCHANGE)")
    damage(installed)
    killed_at("after-exchange", *install_command(mirror))
    store = BundleStore()
    assert store.active() is not None and store.active().sha256 == installed.sha256
    assert not store.verify(store.active())  # the fresh copy is in place already
    assert cli("bundle", "status").code == 0
    assert [h for h in hidden(store) if not h.startswith(".staging-")] == []
    again = cli(*install_command(mirror))
    assert again.code == 0, again.err
    assert hidden(store) == [] and cli("bundle", "verify").code == 0


@pytest.mark.parametrize("next_step", ["reader", "command"])
def test_killed_between_the_two_renames_the_next_step_puts_the_copy_back(
    cli, installed, mirror, next_step
):
    """Without the atomic exchange (another OS, a file system without it) a damaged copy is
    replaced by two renames: killed between them, `active` pointed at a missing folder and read
    as "no active bundle", and the next command deleted the only copy with the trash. The next
    reader of `active`, or the next bundle command, puts it back."""
    damage(installed)
    killed_at("between-renames", *install_command(mirror))
    store = BundleStore()
    assert not (store.store_dir / installed.sha256).exists()  # killed in the window
    assert len([h for h in hidden(store) if h.startswith(".trash-")]) == 1
    if next_step == "reader":  # the kernel loader, `dllm bundle status`
        active = store.active()
        assert active is not None and active.sha256 == installed.sha256
        status = cli("bundle", "status")
        assert status.code == 0 and installed.bundle_id in status.out, status.err
    else:  # any bundle command: it takes the lock, which sweeps the trash (it deleted the copy)
        with store.locked():
            pass
    assert (store.store_dir / installed.sha256).is_dir()
    assert not [h for h in hidden(store) if h.startswith(".trash-")]  # the copy is back
    assert store.active().sha256 == installed.sha256
    again = cli(*install_command(mirror))
    assert again.code == 0, again.err
    assert store.active().sha256 == installed.sha256 and hidden(store) == []
    assert cli("bundle", "verify").code == 0


def test_a_rollback_killed_midway_keeps_both_bundles(
    cli,
    bundle_b,  # noqa: F811 - the fixture's value
    installed,
    tmp_path,
):
    """Rollback wrote `active` and then `previous`: killed between the two, both pointed at
    the same bundle and the other one was no longer reachable by rollback. It swaps the two
    links in one step where the system can."""
    if not exchange_works(tmp_path):
        pytest.skip("this file system has no renameat2(RENAME_EXCHANGE)")
    b_mirror, b_catalog, entry = bundle_b
    done = cli("bundle", "install", "--release", "v-b", "--auto", "--mirror", b_mirror,
               "--catalog-sha256", b_catalog)  # fmt: skip
    assert done.code == 0, done.err
    paused, code, err = run_child("between-links", "bundle", "rollback")
    store = BundleStore()
    assert not paused, (
        f"killed between the links: active {store.active().short_sha}, "
        f"previous {store.previous().short_sha}"
    )
    assert code == 0, err
    assert store.active().sha256 == installed.sha256
    assert store.previous().sha256 == entry.sha256


@pytest.mark.parametrize("where", ["between-links", "after-exchange"])
def test_an_activation_killed_midway_leaves_a_whole_one(
    cli,
    bundle_b,  # noqa: F811 - the fixture's value
    installed,
    tmp_path,
    where,
):
    """Installing B over the active A wrote `previous` (A) and then `active` (B): killed between
    the two, both named A, B was installed but not active, and `dllm bundle rollback` then
    "rolled back" to A, the active one. It swaps the links in one step now, and a kill right
    after the swap is completed by the next reader: B active, A previous."""
    if not exchange_works(tmp_path):
        pytest.skip("this file system has no renameat2(RENAME_EXCHANGE)")
    b_mirror, b_catalog, entry = bundle_b
    command = ("bundle", "install", "--release", "v-b", "--auto", "--mirror", b_mirror,
               "--catalog-sha256", b_catalog)  # fmt: skip
    paused, code, err = run_child(where, *command)
    store = BundleStore()
    if where == "between-links":
        assert not paused, (
            f"killed between the links: active {store.active().short_sha}, "
            f"previous {store.previous().short_sha}"
        )
        assert code == 0, err
    else:
        assert paused and code == -signal.SIGKILL, err
    assert store.active().sha256 == entry.sha256
    assert store.previous().sha256 == installed.sha256
    assert not [p for p in store.root.iterdir() if p.name.startswith(".")]
    rolled = cli("bundle", "rollback")
    assert rolled.code == 0 and store.active().sha256 == installed.sha256, rolled.err
