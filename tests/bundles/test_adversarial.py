"""Adversarial installs: every case is refused with a clear error and the previous bundle stays
active, with no partial state visible in the store."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tarfile
import time

import pytest

from tests.bundles.crafting import (
    member,
    raw_archive,
    serve_archive,
    unpack,
    variant,
    write_catalog,
)
from tests.bundles.server import MirrorServer
from turbo_dllm.bundles.archive import BundleRejected
from turbo_dllm.bundles.catalog import ReleasePin, ReleasesLock
from turbo_dllm.bundles.install import plan_install, run_install
from turbo_dllm.bundles.publish import publish
from turbo_dllm.bundles.store import BundleStore
from turbo_dllm.errors import DllmError


@pytest.fixture
def bundle_b(cpu_bundle, tmp_path, installed):
    """Bundle A (the build) is installed and active; B (same target, other bytes) is published."""
    archive = variant(cpu_bundle, tmp_path)
    mirror = tmp_path / "mirror-b"
    result = publish([archive], release="v-b", mirror=mirror)
    return mirror, result.catalog_sha256, result.added[0]


def attempt(index, release="v-b", catalog_sha=None, **options):
    plan = plan_install(
        release,
        index=str(index),
        catalog_sha256=catalog_sha,
        releases_lock=options.pop("lock", None),
    )
    return run_install(plan, retries=options.pop("retries", 2), backoff_s=0.01, **options)


def assert_previous_still_active(previous, killed=False):
    """`killed`: the install was killed outright, so its staging folder (hidden, listed by
    nothing) is still there until the next locked operation sweeps it."""
    store = BundleStore()
    assert store.active().sha256 == previous.sha256
    assert [b.sha256 for b in store.installed()] == [previous.sha256]
    hidden = [p.name for p in store.store_dir.iterdir() if p.name.startswith(".")]
    if killed:
        hidden = [name for name in hidden if not name.startswith(".staging-")]
    assert hidden == [], hidden  # no staging or trash left behind


def test_flipped_byte_is_refused(bundle_b, installed, hashing):
    mirror, catalog_sha, entry = bundle_b
    path = mirror / "bundles" / entry.file
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with MirrorServer(mirror) as server, pytest.raises(BundleRejected, match="sha256 mismatch"):
        attempt(server.url, catalog_sha=catalog_sha)
    assert_previous_still_active(installed)


def test_wrong_size_is_refused(bundle_b, installed):
    mirror, catalog_sha, entry = bundle_b
    with (mirror / "bundles" / entry.file).open("ab") as handle:
        handle.write(b"\0" * 100)
    with MirrorServer(mirror) as server, pytest.raises(BundleRejected, match="wrong size"):
        attempt(server.url, catalog_sha=catalog_sha)
    assert_previous_still_active(installed)


def test_a_mirror_copy_cut_short_is_named_as_such(bundle_b, installed):
    """A bundle cut short in a mirror folder (an interrupted copy onto a USB stick) got the
    hint 're-publish it', which does not mend a copy; it now says to copy it again."""
    mirror, catalog_sha, entry = bundle_b
    path = mirror / "bundles" / entry.file
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(BundleRejected, match="wrong size") as caught:
        attempt(mirror, catalog_sha=catalog_sha)
    assert "cut short" in caught.value.hint and "copy it again" in caught.value.hint
    assert_previous_still_active(installed)
    path.write_bytes(path.read_bytes() + b"\0" * entry.size)  # longer: another file
    with pytest.raises(BundleRejected, match="wrong size") as caught:
        attempt(mirror, catalog_sha=catalog_sha)
    assert "does not belong to this catalog" in caught.value.hint


def test_truncated_transfer_is_retried_then_refused(bundle_b, installed):
    mirror, catalog_sha, _ = bundle_b
    with MirrorServer(mirror) as server:
        server.state.truncate_after = 1000
        with pytest.raises(DllmError, match="failed after 3 attempts") as caught:
            attempt(server.url, catalog_sha=catalog_sha, retries=2)
        ranges = [r for path, r in server.state.requests if "/bundles/" in path]
    assert "run the same command again" in caught.value.hint
    assert ranges == [None, "bytes=1000-", "bytes=2000-"]  # each attempt resumed
    assert_previous_still_active(installed)


def test_truncated_transfer_resumes_and_succeeds(bundle_b, installed, hashing):
    mirror, catalog_sha, entry = bundle_b
    with MirrorServer(mirror) as server:
        server.state.truncate_after, server.state.truncate_times = 5000, 1
        result = attempt(server.url, catalog_sha=catalog_sha)
        ranges = [r for path, r in server.state.requests if "/bundles/" in path]
    assert ranges == [None, "bytes=5000-"]
    assert result.bundle.sha256 == entry.sha256 and result.previous.sha256 == installed.sha256


def test_catalog_not_matching_the_lock_is_refused(bundle_b, installed):
    mirror, catalog_sha, _ = bundle_b
    lock = ReleasesLock(releases={"v-b": ReleasePin(catalog_sha256="ab" * 32)})
    with pytest.raises(BundleRejected, match="releases.lock pins") as caught:
        attempt(mirror, lock=lock)
    assert catalog_sha in caught.value.message
    with pytest.raises(DllmError, match="contradicts the pin"):
        attempt(mirror, catalog_sha=catalog_sha, lock=lock)
    with pytest.raises(BundleRejected, match="--catalog-sha256 pins"):
        attempt(mirror, catalog_sha="cd" * 32)
    with pytest.raises(DllmError, match="not pinned"):
        attempt(mirror)
    assert_previous_still_active(installed)


def _malicious(cpu_bundle, tmp_path, bad_member):
    """An archive: a valid bundle.json, then `bad_member`, then the listed library."""
    good = unpack(variant(cpu_bundle, tmp_path), tmp_path / "good")
    manifest_bytes = (good.root / "bundle.json").read_bytes()
    library = (good.root / "lib" / "merge_attention_partials.so").read_bytes()
    return raw_archive(
        tmp_path / "evil.tar.zst",
        [
            member("bundle.json", manifest_bytes),
            bad_member,
            member("lib/merge_attention_partials.so", library),
        ],
    )


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (lambda t: member("../escaped", b"owned"), "climbs out of the bundle"),
        (lambda t: member("lib/../../escaped", b"owned"), "climbs out of the bundle"),
        (lambda t: member(str(t / "absolute-escape"), b"owned"), "is an absolute path"),
        (lambda t: member("lib/link", kind=tarfile.SYMTYPE, link="/etc/passwd"), "symbolic link"),
        (lambda t: member("lib/up", kind=tarfile.SYMTYPE, link="../../../.."), "symbolic link"),
        (
            lambda t: member("lib/hard", kind=tarfile.LNKTYPE, link="../../../../etc/passwd"),
            "hard link",
        ),
        (lambda t: member("lib/tty", kind=tarfile.CHRTYPE), "character device"),
        (lambda t: member("lib/extra.so", b"unlisted"), "not listed in bundle.json"),
    ],
    ids=[
        "dotdot",
        "nested-dotdot",
        "absolute",
        "symlink",
        "symlink-up",
        "hardlink",
        "device",
        "unlisted",
    ],
)
def test_malicious_archive_members_are_refused(cpu_bundle, tmp_path, installed, bad, message):
    archive = _malicious(cpu_bundle, tmp_path, bad(tmp_path))
    mirror = tmp_path / "evil-mirror"
    catalog_sha = serve_archive(
        mirror, "v-evil", archive, as_target=str(cpu_bundle.manifest.target)
    )
    with pytest.raises(BundleRejected, match=message):
        attempt(mirror, release="v-evil", catalog_sha=catalog_sha)
    assert not (tmp_path / "absolute-escape").exists()
    store = BundleStore()
    assert not list(store.root.parent.rglob("escaped"))
    assert_previous_still_active(installed)


def test_bundle_for_another_target_is_refused(cpu_bundle, tmp_path, installed):
    from turbo_dllm.bundles.target import BundleTarget

    ours = cpu_bundle.manifest.target
    other = BundleTarget.parse(
        str(ours).replace("cxx11", "cxx98")
        if ours.cxx11_abi
        else str(ours).replace("cxx98", "cxx11")
    )
    archive = variant(cpu_bundle, tmp_path, target=other)
    mirror = tmp_path / "mislabeled"
    catalog_sha = serve_archive(mirror, "v-mislabeled", archive, as_target=str(ours))
    with pytest.raises(BundleRejected, match=f"holds a bundle for target {other}"):
        attempt(mirror, release="v-mislabeled", catalog_sha=catalog_sha)
    assert_previous_still_active(installed)


def test_only_a_bundle_for_another_target_means_no_match(cpu_bundle, tmp_path, installed):
    from turbo_dllm.bundles.target import BundleTarget

    ours = cpu_bundle.manifest.target
    other = BundleTarget.parse(str(ours).replace(str(ours.torch), "torch9.9"))
    mirror = tmp_path / "other"
    catalog_sha = publish(
        [variant(cpu_bundle, tmp_path, target=other)], release="v-o", mirror=mirror
    ).catalog_sha256
    with pytest.raises(DllmError, match="no bundle in release v-o fits this host") as caught:
        attempt(mirror, release="v-o", catalog_sha=catalog_sha)
    assert f"torch: host {ours.torch}, bundle torch9.9" in caught.value.message
    assert_previous_still_active(installed)


def test_duplicate_catalog_entry_is_refused(bundle_b, installed):
    mirror, _, entry = bundle_b
    row = entry.model_dump(mode="json")
    catalog_sha = write_catalog(mirror, "v-dup", [row, row])
    with pytest.raises(DllmError, match="duplicate catalog entry"):
        attempt(mirror, release="v-dup", catalog_sha=catalog_sha)
    assert_previous_still_active(installed)


def _slow_install(server, catalog_sha):
    """A real `dllm bundle install` in a child process, downloading at a crawl."""
    server.state.throttle_bps, server.state.chunk = 4000, 512
    process = subprocess.Popen(
        [sys.executable, "-m", "turbo_dllm", "bundle", "install", "--release", "v-b", "--auto",
         "--index", server.url, "--catalog-sha256", catalog_sha],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    store = BundleStore()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        parts = list(store.downloads_dir.glob("*.part")) if store.downloads_dir.exists() else []
        if parts and parts[0].stat().st_size > 0:
            return process, parts[0]
        if process.poll() is not None:
            raise AssertionError(f"install ended early: {process.communicate()}")
        time.sleep(0.05)
    process.kill()
    raise AssertionError("the slow install never started downloading")


def test_two_installs_at_once_the_second_is_refused(bundle_b, installed):
    mirror, catalog_sha, _ = bundle_b
    with MirrorServer(mirror) as server:
        process, _ = _slow_install(server, catalog_sha)
        try:
            with pytest.raises(
                DllmError, match=rf"another bundle operation is running \(pid {process.pid}"
            ):
                attempt(server.url, catalog_sha=catalog_sha, lock_timeout_s=0.3)
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)
    assert BundleStore().active().sha256 == installed.sha256


def test_install_killed_midway_leaves_previous_active_and_resumes(cli, bundle_b, installed):
    mirror, catalog_sha, entry = bundle_b
    with MirrorServer(mirror) as server:
        process, part = _slow_install(server, catalog_sha)
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        assert process.returncode == -signal.SIGKILL
        kept = part.stat().st_size
        assert 0 < kept < entry.size
        assert_previous_still_active(installed, killed=True)
        listing = cli("bundle", "list").out
        assert installed.short_sha in listing and entry.sha256[:12] not in listing

        server.state.throttle_bps = None
        result = attempt(server.url, catalog_sha=catalog_sha)
        ranges = [r for path, r in server.state.requests if "/bundles/" in path]
    assert ranges[-1] == f"bytes={kept}-"  # the new install resumed the killed one's download
    assert result.bundle.sha256 == entry.sha256
    assert BundleStore().previous().sha256 == installed.sha256
    assert not part.exists()
    names = sorted(p.name for p in BundleStore().store_dir.iterdir())
    assert names == sorted([installed.sha256, entry.sha256])  # the killed one's staging: swept
