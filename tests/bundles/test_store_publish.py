"""Publishing to a mirror, the store's activation/rollback/uninstall, and safe extraction."""

from __future__ import annotations

import json
import os

import pytest

from tests.bundles.crafting import member, raw_archive, unpack, variant
from tests.helpers import assert_user_error
from turbo_dllm.bundles.archive import BundleRejected, extract_bundle, pack_bundle
from turbo_dllm.bundles.install import plan_install, run_install
from turbo_dllm.bundles.publish import publish
from turbo_dllm.bundles.store import BundleStore
from turbo_dllm.errors import DllmError
from turbo_dllm.fsutil import sha256_file


def test_packing_is_reproducible(cpu_bundle, tmp_path):
    unpacked = unpack(cpu_bundle.archive, tmp_path / "u")
    again = pack_bundle(unpacked.manifest, unpacked.root, tmp_path / "again.tar.zst")
    assert sha256_file(again) == cpu_bundle.sha256


def test_publish_is_idempotent_and_refuses_other_bytes(cpu_bundle, tmp_path):
    mirror = tmp_path / "m"
    first = publish([cpu_bundle.archive], release="v1", mirror=mirror)
    again = publish([cpu_bundle.archive], release="v1", mirror=mirror)
    assert first.catalog_sha256 == again.catalog_sha256 and again.unchanged and not again.added
    (mirror / "bundles" / cpu_bundle.archive.name).write_bytes(b"other bytes")
    with pytest.raises(DllmError, match="already exists with other bytes"):
        publish([cpu_bundle.archive], release="v2", mirror=mirror)


def test_publish_refuses_replacing_a_release_entry(cpu_bundle, tmp_path):
    mirror = tmp_path / "m"
    publish([cpu_bundle.archive], release="v1", mirror=mirror)
    newer = variant(cpu_bundle, tmp_path, version="0.1.1")
    with pytest.raises(DllmError, match="already lists a bundle for"):
        publish([newer], release="v1", mirror=mirror)
    assert publish([newer], release="v2", mirror=mirror).added  # a new release is fine


def test_publish_refuses_a_broken_archive(tmp_path):
    broken = raw_archive(tmp_path / "x.tar.zst", [member("lib/x.so", b"x")])
    with pytest.raises(BundleRejected, match="first member must be bundle.json"):
        publish([broken], release="v1", mirror=tmp_path / "m")
    (tmp_path / "junk.tar.zst").write_bytes(b"not zstd")
    with pytest.raises(BundleRejected, match="not a valid .tar.zst"):
        publish([tmp_path / "junk.tar.zst"], release="v1", mirror=tmp_path / "m")


@pytest.mark.parametrize("keep", [0, 0.5])
def test_publish_calls_a_truncated_archive_truncated(tmp_path, cli, keep):
    """zstandard's stream reader ends quietly at a frame cut short: tarfile then saw an "empty
    file", and the error said so, of an archive that was merely cut off."""
    whole = raw_archive(tmp_path / "whole.tar.zst", [member("bundle.json", b"{}" * 4000)])
    data = whole.read_bytes()
    cut = tmp_path / "cut.tar.zst"
    cut.write_bytes(data[: int(len(data) * keep)])
    result = cli("bundle", "publish", cut, "--release", "v1", "--mirror", tmp_path / "m")
    assert_user_error(result, "cut.tar.zst: truncated or incomplete .tar.zst bundle archive")
    assert "empty file" not in result.err


def test_extraction_checks_sizes_and_hashes(cpu_bundle, tmp_path):
    good = unpack(cpu_bundle.archive, tmp_path / "good")
    manifest = (good.root / "bundle.json").read_bytes()
    library = (good.root / "lib" / "merge_attention_partials.so").read_bytes()
    flipped = bytes([library[0] ^ 1]) + library[1:]
    bad = raw_archive(
        tmp_path / "a.tar.zst",
        [member("bundle.json", manifest), member("lib/merge_attention_partials.so", flipped)],
    )
    with pytest.raises(BundleRejected, match="has sha256"):
        extract_bundle(bad, tmp_path / "out1")
    short = raw_archive(
        tmp_path / "b.tar.zst",
        [member("bundle.json", manifest), member("lib/merge_attention_partials.so", library[:-1])],
    )
    with pytest.raises(BundleRejected, match="bundle.json says"):
        extract_bundle(short, tmp_path / "out2")
    missing = raw_archive(tmp_path / "c.tar.zst", [member("bundle.json", manifest)])
    with pytest.raises(BundleRejected, match="lacks listed files"):
        extract_bundle(missing, tmp_path / "out3")
    twice = raw_archive(
        tmp_path / "d.tar.zst",
        [
            member("bundle.json", manifest),
            member("lib/merge_attention_partials.so", library),
            member("lib/merge_attention_partials.so", library),
        ],
    )
    with pytest.raises(BundleRejected, match="appears twice"):
        extract_bundle(twice, tmp_path / "out4")


def _install(cpu_bundle, tmp_path, version):
    archive = (
        cpu_bundle.archive if version is None else variant(cpu_bundle, tmp_path, version=version)
    )
    mirror = tmp_path / f"m-{version}"
    sha = publish([archive], release="v", mirror=mirror).catalog_sha256
    return run_install(plan_install("v", index=str(mirror), catalog_sha256=sha)).bundle


def test_activation_rollback_and_uninstall(cli, cpu_bundle, tmp_path):
    a = _install(cpu_bundle, tmp_path, None)
    b = _install(cpu_bundle, tmp_path, "0.1.1")
    store = BundleStore()
    assert store.active().sha256 == b.sha256 and store.previous().sha256 == a.sha256
    assert os.readlink(store.root / "active") == f"store/{b.sha256}"  # relative: DLLM_HOME may move
    listing = json.loads(cli("bundle", "list", "--json").out)["bundles"]
    assert {x["sha256"]: x["state"] for x in listing} == {a.sha256: "previous", b.sha256: "active"}

    refused = cli("bundle", "uninstall", b.short_sha)
    assert refused.code == 2 and "is active" in refused.err
    assert cli("bundle", "rollback").code == 0
    assert store.active().sha256 == a.sha256 and store.previous().sha256 == b.sha256
    assert cli("bundle", "uninstall", b.bundle_id).code == 0
    assert store.previous() is None and [x.sha256 for x in store.installed()] == [a.sha256]
    missing = cli("bundle", "rollback")
    assert missing.code == 2 and "no previous bundle" in missing.err
    unknown = cli("bundle", "uninstall", "ffffff")
    assert unknown.code == 2 and "no installed bundle" in unknown.err


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        ("bundle.json", "bundle.json is missing"),
        ("install.json", "install.json cannot be read"),
        ("lib", "lib/merge_attention_partials.so: missing"),
    ],
)
def test_a_damaged_inactive_bundle_is_reported_and_uninstalled(
    cli, cpu_bundle, tmp_path, damage, problem
):
    """A store entry that lost its bundle.json was invisible to `verify` and `list`, and
    `uninstall` said it was not installed (an unreadable install.json: the same error as
    `list`); rolling back to it switched `active` to it and then failed with a traceback."""
    a = _install(cpu_bundle, tmp_path, None)
    b = _install(cpu_bundle, tmp_path, "0.1.1")
    a.path.chmod(0o755)
    if damage == "lib":
        (a.path / "lib").chmod(0o755)
        (a.path / "lib" / "merge_attention_partials.so").unlink()
    else:
        (a.path / damage).unlink()
    if damage != "lib":
        refused = cli("bundle", "rollback")
        assert_user_error(refused, a.short_sha, "dllm bundle uninstall")
        assert BundleStore().active().sha256 == b.sha256  # nothing changed
    verified = cli("bundle", "verify")
    assert verified.code == 1 and problem in verified.out and a.short_sha in verified.out
    removed = cli("bundle", "uninstall", a.sha256[:8])
    assert removed.code == 0, removed.err
    assert a.short_sha in removed.out and (damage == "lib" or problem in removed.out)
    assert not a.path.exists() and BundleStore().previous() is None
    assert cli("bundle", "verify").code == 0
    assert [x.sha256 for x in BundleStore().installed()] == [b.sha256]


@pytest.mark.parametrize("damage", ["bundle.json", "install.json"])
def test_list_and_status_show_a_damaged_previous_bundle(cli, cpu_bundle, tmp_path, damage):
    """`dllm bundle list` stopped at the first damaged store entry (one without bundle.json was
    left out without a word), and `status` failed on a damaged previous bundle: both list it,
    marked damaged with the fix, and the intact bundles with it."""
    a = _install(cpu_bundle, tmp_path, None)
    b = _install(cpu_bundle, tmp_path, "0.1.1")
    a.path.chmod(0o755)
    (a.path / damage).unlink()
    listed = cli("bundle", "list")
    assert listed.code == 0, listed.err
    assert f"{b.short_sha}  active    {b.bundle_id}" in listed.out
    assert f"{a.short_sha}  previous  DAMAGED: {damage}" in listed.out
    assert f"remove it: `dllm bundle uninstall {a.short_sha}`" in listed.err
    as_json = {x["sha256"]: x for x in json.loads(cli("bundle", "list", "--json").out)["bundles"]}
    assert as_json[b.sha256]["state"] == "active" and as_json[b.sha256]["damaged"] is None
    assert as_json[a.sha256]["state"] == "previous" and damage in as_json[a.sha256]["damaged"]

    status = cli("bundle", "status")
    assert status.code == 0, status.err
    assert f"active    {b.bundle_id}" in status.out
    assert f"previous  DAMAGED ({a.short_sha}): {damage}" in status.out
    assert json.loads(cli("bundle", "status", "--json").out)["previous"]["damaged"]
    assert cli("bundle", "uninstall", a.short_sha).code == 0
    assert "previous  none" in cli("bundle", "status").out


def test_a_too_short_prefix_and_negative_retries_are_explained(cli, installed, mirror):
    # The listing shows the 12-character hash the 4-character prefix starts: say why it fails.
    result = cli("bundle", "uninstall", installed.sha256[:4])
    assert_user_error(result, installed.short_sha, "at least 6 characters")
    # A name nothing matches had no hint at all (assert_user_error needs one).
    for command in ("uninstall", "verify"):
        result = cli("bundle", command, "0" * 12)
        assert_user_error(result, "no installed bundle '000000000000'", "dllm bundle list")
    root, catalog_sha = mirror
    result = cli("bundle", "install", "--release", "v-test", "--auto", "--mirror", root,
                 "--catalog-sha256", catalog_sha, "--retries", "-1")  # fmt: skip
    assert_user_error(result, "--retries must be 0 or more")  # not "failed after 0 attempts"


@pytest.mark.parametrize("value", ["-5", "nan"])
@pytest.mark.parametrize(
    "command",
    [("install", "--auto", "--mirror", "nowhere"), ("uninstall", "abcdef"), ("rollback",)],
)
def test_a_negative_lock_timeout_is_refused(cli, command, value):
    """-5 was taken (one try, then "waited -5 s"); nan waited for the lock forever."""
    result = cli("bundle", *command, "--lock-timeout", value)
    assert_user_error(result, f"--lock-timeout must be 0 or more seconds, got {value}")


def test_verify_reports_modified_and_extra_files(cli, installed):
    library = installed.path / "lib" / "merge_attention_partials.so"
    library.chmod(0o644)
    library.write_bytes(library.read_bytes() + b"\0")
    (installed.path / "lib" / "extra").write_text("x")
    result = cli("bundle", "verify", "--json")
    assert result.code == 1
    (problems,) = json.loads(result.out)["bundles"].values()
    assert any("merge_attention_partials.so" in p for p in problems)
    assert any("extra: not part of the bundle" in p for p in problems)
    # A damaged bundle in the store is re-extracted when its release is installed again.
    assert BundleStore().verify(installed)


@pytest.mark.parametrize(
    ("damaged", "hint"),
    [("install.json", "install its release again"), ("bundle.json", "dllm bundle uninstall")],
)
def test_installing_again_repairs_a_damaged_store_entry(cli, installed, mirror, damaged, hint):
    # The error's hint says to install the release again; that install must not stop on the
    # damage it is run to repair (it used to, with the same error, for the active bundle).
    document = installed.path / damaged
    document.chmod(0o644)
    document.write_text("{")
    listed = cli("bundle", "list")  # was an error: listed now, marked, with the fix
    assert listed.code == 0, listed.err
    assert f"{installed.short_sha}  active    DAMAGED: invalid {damaged}" in listed.out
    # one bundle installed: no previous one, so rollback (which would be refused) is not offered
    assert hint in listed.err and "rollback" not in listed.err
    status = cli("bundle", "status")
    assert_user_error(status, f"the active bundle {installed.short_sha} is damaged", hint)
    root, catalog_sha = mirror
    again = cli("bundle", "install", "--release", "v-test", "--auto", "--mirror", root,
                "--catalog-sha256", catalog_sha)  # fmt: skip
    assert again.code == 0, again.err
    assert "installed and activated" in again.out
    assert cli("bundle", "verify").code == 0
    assert BundleStore().active().sha256 == installed.sha256


def test_stale_staging_is_swept_by_the_next_operation(installed):
    store = BundleStore()
    (store.store_dir / ".staging-deadbeef").mkdir()
    os.symlink(f"store/{installed.sha256}", store.root / ".active.0123")
    with store.locked():
        pass
    assert not (store.store_dir / ".staging-deadbeef").exists()
    assert not (store.root / ".active.0123").is_symlink()
    assert store.active().sha256 == installed.sha256


def test_a_release_carries_verified_compile_cache_packs(cli, cpu_bundle, tmp_path):
    """`dllm bundle publish --pack`: packs (e.g. for the packaged GPU recipes) go to
    MIRROR/packs/ after every member is checked; with a damaged one nothing is written."""
    from turbo_dllm.cache.key import host_pack_key
    from turbo_dllm.cache.packs import make_pack
    from turbo_dllm.host import collect_fingerprint

    cache = tmp_path / "inductor" / "ab"
    cache.mkdir(parents=True)
    (cache / "cabc.py").write_text("# compiled\n")
    key = host_pack_key(collect_fingerprint(apply_overrides=False), None)
    pack, manifest = make_pack({"inductor": cache.parent}, tmp_path / "packs", key)
    root = tmp_path / "site"
    result = cli("bundle", "publish", cpu_bundle.archive, "--release", "v-packs", "--mirror", root,
                 "--pack", pack, "--json")  # fmt: skip
    assert result.code == 0, result.err
    assert json.loads(result.out)["packs"] == [str(root / "packs" / manifest.file_name)]
    assert (root / "packs" / manifest.file_name).read_bytes() == pack.read_bytes()

    damaged = tmp_path / "damaged" / pack.name
    damaged.parent.mkdir()
    data = bytearray(pack.read_bytes())
    data[-40] ^= 0xFF
    damaged.write_bytes(bytes(data))
    result = cli("bundle", "publish", cpu_bundle.archive, "--release", "v-packs2", "--mirror",
                 tmp_path / "s2", "--pack", damaged)  # fmt: skip
    assert result.code == 2 and "dllm: error:" in result.err
    assert not (tmp_path / "s2").exists()  # refused before anything was written
