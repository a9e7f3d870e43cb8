"""`dllm bundle publish` checks everything the user can get wrong before it writes to the mirror:
a broken archive among several left the ones before it copied, a release that `--lock` pins to
another catalog was refused only after the mirror's catalog was rewritten (mirror and lock then
disagreed), and a missing archive left an empty mirror folder behind."""

from __future__ import annotations

from tests.bundles.crafting import variant
from tests.helpers import assert_user_error
from turbo_dllm.bundles.catalog import read_releases_lock, sha256_bytes


def tree(folder):
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))


def test_a_broken_archive_among_several_publishes_nothing(cli, cpu_bundle, tmp_path):
    junk = tmp_path / "junk.tar.zst"
    junk.write_bytes(b"not zstd")
    mirror = tmp_path / "m"
    result = cli("bundle", "publish", cpu_bundle.archive, junk, "--release", "v1",
                 "--mirror", mirror)  # fmt: skip
    assert_user_error(result, "junk.tar.zst: not a valid .tar.zst")
    assert not mirror.exists()
    # Into an existing mirror: its files stay as they were.
    assert (
        cli("bundle", "publish", cpu_bundle.archive, "--release", "v1", "--mirror", mirror).code
        == 0
    )
    before = {p: (mirror / p).read_bytes() for p in tree(mirror) if (mirror / p).is_file()}
    newer = variant(cpu_bundle, tmp_path, version="0.1.1")
    result = cli("bundle", "publish", newer, junk, "--release", "v2", "--mirror", mirror)
    assert_user_error(result, "junk.tar.zst")
    assert {p: (mirror / p).read_bytes() for p in tree(mirror) if (mirror / p).is_file()} == before


def test_a_conflict_in_a_later_archive_copies_no_earlier_one(cli, cpu_bundle, tmp_path):
    """Two different bundles for one target in one call: named, and nothing written."""
    other = variant(cpu_bundle, tmp_path)  # the same target, other bytes
    mirror = tmp_path / "m"
    result = cli("bundle", "publish", cpu_bundle.archive, other, "--release", "v1",
                 "--mirror", mirror)  # fmt: skip
    assert_user_error(
        result, f"{cpu_bundle.archive.name} and {other.name} are two different bundles for"
    )
    assert not mirror.exists()


def test_a_release_pinned_to_another_catalog_leaves_the_mirror_unwritten(cli, cpu_bundle, tmp_path):
    lock = tmp_path / "releases.lock"
    lock.write_text(
        f'format = "turbo_dllm.releases.v1"\n[releases]\nv1 = {{ catalog_sha256 = "{"a" * 64}" }}\n'
    )
    mirror = tmp_path / "m"
    result = cli("bundle", "publish", cpu_bundle.archive, "--release", "v1", "--mirror", mirror,
                 "--lock", lock)  # fmt: skip
    assert_user_error(result, f"release v1 is already pinned to {'a' * 64} in {lock}")
    assert not mirror.exists()
    assert read_releases_lock(lock).releases["v1"].catalog_sha256 == "a" * 64
    # The same pin (a publish run twice) is still fine.
    first = cli("bundle", "publish", cpu_bundle.archive, "--release", "v2", "--mirror", mirror,
                "--lock", lock)  # fmt: skip
    assert first.code == 0, first.err
    again = cli("bundle", "publish", cpu_bundle.archive, "--release", "v2", "--mirror", mirror,
                "--lock", lock)  # fmt: skip
    assert again.code == 0 and "already pins it" in again.out


def test_a_missing_archive_creates_no_mirror_folder(cli, tmp_path):
    mirror = tmp_path / "m"
    result = cli("bundle", "publish", tmp_path / "nope.tar.zst", "--release", "v1",
                 "--mirror", mirror)  # fmt: skip
    assert_user_error(result, "no such archive")
    assert not mirror.exists()
    # A mirror under a file is still named first, before the archives are read.
    afile = tmp_path / "afile"
    afile.write_text("x")
    result = cli("bundle", "publish", tmp_path / "nope.tar.zst", "--release", "v1",
                 "--mirror", afile / "m")  # fmt: skip
    assert_user_error(result, f"cannot write into {afile / 'm'}")


def test_an_offline_mirror_is_refused_unchanged(cli, cpu_bundle, tmp_path):
    """Publishing into a folder `dllm mirror create` made added files its MIRROR.json does not
    list (and could change a catalog it lists), so `dllm mirror verify` failed it afterwards."""
    index = tmp_path / "index"
    assert cli("bundle", "publish", cpu_bundle.archive, "--release", "v1",
               "--mirror", index).code == 0  # fmt: skip
    catalog_sha = sha256_bytes((index / "releases/v1/catalog.toml").read_bytes())
    made = cli("mirror", "create", tmp_path / "offline", "--release", "v1", "--from", index,
               "--catalog-sha256", catalog_sha)  # fmt: skip
    assert made.code == 0, made.err
    offline = tmp_path / "offline"
    before = tree(offline)
    result = cli("bundle", "publish", cpu_bundle.archive, "--release", "v2", "--mirror", offline)
    assert_user_error(result, "is an offline mirror made by `dllm mirror create`", "--force")
    assert tree(offline) == before
    assert cli("mirror", "verify", offline).code == 0
