"""What an install that stopped part way has already verified is not thrown away.

A disk that fills from elsewhere while the archive unpacks (the room check had passed) deleted
the verified download, so the next run downloaded the whole archive again. The `.part` file is
now kept, the hint says so, and the same command run again hashes it again (nothing unverified
is trusted) and unpacks it without a request for the archive. So does a process killed
(SIGKILL) between the end of the download and the rename into the store, which lost the
verified download as well: the `.part` file is deleted only once the bundle is in the store."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys

import pytest

from tests.adversarial.hostile import published, tiny_bundle
from tests.bundles.server import MirrorServer
from tests.helpers import assert_user_error
from turbo_dllm.bundles import archive
from turbo_dllm.bundles.store import BundleStore


@pytest.fixture
def served(tmp_path):
    """A small bundle (two files: the second is unpacked last) published and served on
    127.0.0.1: (server, catalog sha256, entry)."""
    bundle = tiny_bundle(tmp_path, {"lib/a.so": os.urandom(64 * 1024), "lib/z.so": b"\0" * 4096})
    mirror, catalog_sha, entry = published(tmp_path, bundle)
    with MirrorServer(mirror) as server:
        yield server, catalog_sha, entry


def _command(server, catalog_sha) -> list[str]:
    return [
        "bundle", "install", "--release", "v-adv", "--auto", "--index", server.url,
        "--catalog-sha256", catalog_sha, "--retries", "0",
    ]  # fmt: skip


def _archive_requests(server) -> int:
    return sum("/bundles/" in path for path, _ in server.state.requests)


def test_a_disk_that_fills_while_unpacking_keeps_the_verified_download(cli, served, monkeypatch):
    server, catalog_sha, entry = served
    real_open = open

    def fills_up(path, mode="r", *args, **kwargs):
        if "x" in mode and str(path).endswith("z.so"):  # another program took the last bytes
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real_open(path, mode, *args, **kwargs)

    with monkeypatch.context() as full:
        full.setattr(archive, "open", fills_up, raising=False)
        result = cli(*_command(server, catalog_sha))
    assert_user_error(result, "No space left on device", "nothing was installed")
    store = BundleStore()
    part = store.downloads_dir / f"{entry.sha256}.part"
    assert "the verified download is kept" in result.err and str(part) in result.err, result.err
    assert "without downloading it again" in result.err
    assert part.stat().st_size == entry.size
    assert store.installed() == [] and store.active() is None
    assert [p.name for p in store.store_dir.iterdir()] == []  # its partial unpack is gone

    requests = _archive_requests(server)
    result = cli(*_command(server, catalog_sha))
    assert result.code == 0, result.err
    assert _archive_requests(server) == requests  # unpacked from the kept file
    assert BundleStore().active().sha256 == entry.sha256
    assert not part.exists()


# A real `dllm bundle install` process killed with SIGKILL once the archive has arrived and
# verified, just before its unpacked folder is renamed into the store.
KILLED_BEFORE_THE_RENAME = """
import os, signal, sys
from turbo_dllm.bundles.store import BundleStore
def killed(self, *args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)
BundleStore.add_extracted = killed
from turbo_dllm.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _killed(program: str, server, catalog_sha, entry):
    """The install run by `program`, which kills itself (SIGKILL): the store and the bundle's
    `.part` download path."""
    process = subprocess.run(
        [sys.executable, "-c", program, *_command(server, catalog_sha)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert process.returncode == -signal.SIGKILL, process.stderr
    store = BundleStore()
    return store, store.downloads_dir / f"{entry.sha256}.part"


def _killed_before_the_rename(server, catalog_sha, entry):
    store, part = _killed(KILLED_BEFORE_THE_RENAME, server, catalog_sha, entry)
    assert part.stat().st_size == entry.size  # the finished download is still there
    assert store.installed() == [] and store.active() is None
    return part


def test_a_kill_after_the_download_leaves_it_for_the_next_run(cli, served):
    server, catalog_sha, entry = served
    part = _killed_before_the_rename(server, catalog_sha, entry)
    requests = _archive_requests(server)
    result = cli(*_command(server, catalog_sha))
    assert result.code == 0, result.err
    assert _archive_requests(server) == requests  # hashed again and unpacked, not downloaded
    store = BundleStore()
    assert store.active().sha256 == entry.sha256 and store.verify(store.active()) == []
    assert not part.exists()
    assert [p.name for p in store.store_dir.iterdir()] == [entry.sha256]  # staging swept


def test_a_changed_leftover_is_not_trusted(cli, served):
    """The kept file is hashed again: one changed since (same size, other bytes) is deleted
    and the archive downloaded again from byte 0, even with --retries 0."""
    server, catalog_sha, entry = served
    part = _killed_before_the_rename(server, catalog_sha, entry)
    data = bytearray(part.read_bytes())
    data[-100] ^= 0xFF
    part.write_bytes(bytes(data))
    requests = _archive_requests(server)
    result = cli(*_command(server, catalog_sha))
    assert result.code == 0, result.err
    assert _archive_requests(server) == requests + 1
    store = BundleStore()
    assert store.active().sha256 == entry.sha256 and store.verify(store.active()) == []
    assert not part.exists()


class _FillsUp:
    """The `.part` file on a disk that another program fills once `room` bytes are written."""

    def __init__(self, out, room: int) -> None:
        self._out, self._room = out, room

    def write(self, block) -> int:
        left = self._room - self._out.tell()
        if len(block) > left:  # what fits is written, then the disk is full
            self._out.write(block[: max(left, 0)])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self._out.name)
        return self._out.write(block)

    def __getattr__(self, name):
        return getattr(self._out, name)


def test_a_disk_that_fills_while_downloading_says_the_part_is_kept(cli, served, monkeypatch):
    """It said only "cannot write <sha>.part: No space left on device": not that nothing was
    installed, where the disk is, nor that the bytes already downloaded are kept and resumed."""
    from turbo_dllm.bundles import fetch

    server, catalog_sha, entry = served
    real_open = fetch._Transfer._open

    def filling(self, pool):
        real_open(self, pool)
        self._out = _FillsUp(self._out, 20_000)

    with monkeypatch.context() as full:
        full.setattr(fetch._Transfer, "_open", filling)
        result = cli(*_command(server, catalog_sha))
    assert_user_error(result, "No space left on device", "nothing was installed", "disk is full")
    store = BundleStore()
    part = store.downloads_dir / f"{entry.sha256}.part"
    kept = part.stat().st_size
    assert 0 < kept <= 20_000
    assert f"the partial download is kept ({kept} of {entry.size} bytes" in result.err, result.err
    assert "the same command resumes it" in result.err
    assert f"cannot write into the bundle store {store.downloads_dir} " in result.err
    assert "the store's file system is mounted at" in result.err  # where to free space

    result = cli(*_command(server, catalog_sha))
    assert result.code == 0, result.err
    assert server.state.requests[-1][1] == f"bytes={kept}-"  # resumed, not started over
    assert BundleStore().active().sha256 == entry.sha256


KILLED_AFTER_THE_RENAME = """
import os, signal, sys
from turbo_dllm.bundles.store import BundleStore
real = BundleStore.add_extracted
def killed(self, *args, **kwargs):
    real(self, *args, **kwargs)
    os.kill(os.getpid(), signal.SIGKILL)
BundleStore.add_extracted = killed
from turbo_dllm.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_download_whose_bundle_is_in_the_store_is_not_called_partial(cli, served):
    """Killed just after the rename into the store: the `.part` file is a download of a bundle
    that is installed. `status` called it "a partial download" that the install "resumes",
    and only an install of that bundle removed it; it says what it is now, and the next
    bundle command removes it."""
    server, catalog_sha, entry = served
    store, part = _killed(KILLED_AFTER_THE_RENAME, server, catalog_sha, entry)
    assert [b.sha256 for b in store.installed()] == [entry.sha256] and part.exists()
    status = cli("bundle", "status")
    assert f"downloads/{part.name}" in status.out
    assert "a download of a bundle that is installed" in status.out, status.out
    assert "partial" not in status.out and "resumes it" not in status.err
    with store.locked(0):  # what every bundle command that changes the store does first
        pass
    assert not part.exists()
    assert store.installed()[0].sha256 == entry.sha256


def test_status_calls_a_kept_verified_download_verified_not_partial(cli, served, monkeypatch):
    """The whole archive, verified, kept after the disk filled while unpacking: `status` called
    it "a partial download" that the install "resumes". It says now that it is complete and
    verified (from a mark written at verification, not by hashing it on every call); a file
    changed since is called partial again, and the install hashes it again whatever the mark."""
    server, catalog_sha, entry = served
    real_open = open

    def fills_up(path, mode="r", *args, **kwargs):
        if "x" in mode and str(path).endswith("z.so"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real_open(path, mode, *args, **kwargs)

    with monkeypatch.context() as full:
        full.setattr(archive, "open", fills_up, raising=False)
        assert cli(*_command(server, catalog_sha)).code == 2
    part = BundleStore().downloads_dir / f"{entry.sha256}.part"
    status = cli("bundle", "status")
    line = next(t for t in status.out.splitlines() if part.name in t)
    assert "a complete, verified download" in line and "partial" not in line, status.out
    assert "unpacks it without downloading it again" in status.err, status.err
    assert "resumes it" not in status.err

    data = bytearray(part.read_bytes())
    data[-100] ^= 0xFF
    part.write_bytes(bytes(data))  # changed since it was verified
    os.utime(part, ns=(part.stat().st_atime_ns, part.stat().st_mtime_ns + 5_000_000_000))
    status = cli("bundle", "status")
    assert "a partial download" in status.out, status.out
    requests = _archive_requests(server)
    result = cli(*_command(server, catalog_sha))
    assert result.code == 0, result.err
    assert _archive_requests(server) == requests + 1  # not trusted: downloaded again
    assert list(part.parent.iterdir()) == []  # neither the download nor its mark is left
