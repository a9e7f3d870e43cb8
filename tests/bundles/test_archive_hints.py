"""Every refusal of a bundle archive says what to do, not only what is wrong: one not made by
`dllm bundle build` (links, `..`, unlisted members, other tar headers) is to be rebuilt with it
or asked of its publisher; a damaged one copied again whole; an install whose pinned bytes are
refused names the publisher, since every copy is the same. Archives are crafted small (no
compiler: `tiny_bundle`)."""

from __future__ import annotations

import tarfile

import pytest

from tests.adversarial.hostile import published, tar_zst, tiny_bundle
from tests.bundles.crafting import member
from turbo_dllm.bundles.archive import (
    BundleRejected,
    extract_bundle,
    read_archive_manifest,
)
from turbo_dllm.bundles.manifest import BundleFile

REBUILD = "rebuild it with `dllm bundle build`, or ask its publisher"
COPY_AGAIN = "copy it again whole"
NOT_A_BUNDLE = "pass a .tar.zst that `dllm bundle build` wrote"
OTHER_TAR = "another tar program (GNU tar, bsdtar) wrote it"
PAX = "`dllm bundle build` writes only short pax headers"
OVERSIZE = "a bundle holds a few dozen files of a few MB"
LIB = b"\x7fELF" + bytes(60)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    """The bundle.json of a tiny valid bundle holding `lib/x.so` (LIB)."""
    folder = tmp_path_factory.mktemp("tiny")
    return read_archive_manifest(tiny_bundle(folder, {"lib/x.so": LIB}))


def _with(manifest, *members):
    return [member("bundle.json", manifest.to_json().encode()), *members]


def _pax(key, value):
    info, data = member("lib/x.so", LIB)
    info.pax_headers = {key: value}
    return info, data


def _long_name():
    info, data = member("lib/x.so", LIB)
    info.type = tarfile.GNUTYPE_LONGNAME
    return info, data


def _relisted(manifest, files):
    return manifest.model_copy(update={"files": files, "ops": ()})


# (id, archive bytes from the tiny bundle's manifest, message fragment, hint fragment)
CASES = [
    ("dotdot", lambda m: tar_zst(_with(m, member("../x", b"x"))), "climbs out", REBUILD),
    ("absolute", lambda m: tar_zst(_with(m, member("/tmp/x", b"x"))), "absolute path", REBUILD),
    (
        "symlink",
        lambda m: tar_zst(_with(m, member("lib/x.so", kind=tarfile.SYMTYPE, link="/etc/passwd"))),
        "a symbolic link",
        REBUILD,
    ),
    (
        "hardlink",
        lambda m: tar_zst(_with(m, member("lib/x.so", kind=tarfile.LNKTYPE, link="bundle.json"))),
        "a hard link",
        REBUILD,
    ),
    (
        "device",
        lambda m: tar_zst(_with(m, member("lib/x.so", kind=tarfile.CHRTYPE))),
        "character device",
        REBUILD,
    ),
    (
        "unlisted",
        lambda m: tar_zst(_with(m, member("lib/y.so", b"y"))),
        "is not listed in bundle.json",
        REBUILD,
    ),
    (
        "twice",
        lambda m: tar_zst(_with(m, member("lib/x.so", LIB), member("lib/x.so", LIB))),
        "appears twice",
        REBUILD,
    ),
    (
        "manifest-not-first",
        lambda m: tar_zst([member("lib/x.so", LIB)]),
        "the first member must be bundle.json",
        REBUILD,
    ),
    (
        "manifest-over-1mib",
        lambda m: tar_zst([member("bundle.json", b" " * (1024 * 1024 + 1))]),
        "larger than 1 MiB",
        REBUILD,
    ),
    (
        "size-differs",
        lambda m: tar_zst(_with(m, member("lib/x.so", LIB + b"!"))),
        "bundle.json says 64",
        COPY_AGAIN,
    ),
    (
        "bytes-differ",
        lambda m: tar_zst(_with(m, member("lib/x.so", bytes(64)))),
        "has sha256",
        COPY_AGAIN,
    ),
    ("file-missing", lambda m: tar_zst(_with(m)), "archive lacks listed files", COPY_AGAIN),
    ("empty", lambda m: tar_zst([]), "empty archive", COPY_AGAIN),
    (
        "cut-short",
        lambda m: tar_zst(_with(m, member("lib/x.so", LIB)))[:-20],
        "truncated or incomplete",
        COPY_AGAIN,
    ),
    ("not-zstd", lambda m: b"PK\x03\x04 a zip file", "not a valid .tar.zst", NOT_A_BUNDLE),
    ("gnu-long-name", lambda m: tar_zst(_with(m, _long_name())), "GNU long-name", OTHER_TAR),
    (
        "pax-keyword",
        lambda m: tar_zst(_with(m, _pax("GNU.sparse.map", "a,b"))),
        "pax keyword",
        PAX,
    ),
    ("pax-value", lambda m: tar_zst(_with(m, _pax("size", "1x"))), "is not valid", PAX),
    (
        "over-16-gib",
        lambda m: tar_zst(
            _with(_relisted(m, (BundleFile(path="a", sha256="0" * 64, size=2**35),)))
        ),
        "cap on a bundle",
        OVERSIZE,
    ),
    (
        "bomb",
        lambda m: tar_zst(
            _with(_relisted(m, (BundleFile(path="a", sha256="0" * 64, size=2**30),)))
        ),
        "cap on expansion",
        OVERSIZE,
    ),
]


@pytest.mark.parametrize(
    ("make", "message", "hint"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_each_refused_archive_says_what_to_do(manifest, tmp_path, make, message, hint):
    path = tmp_path / "bad.tar.zst"
    path.write_bytes(make(manifest))
    with pytest.raises(BundleRejected, match=message) as caught:
        extract_bundle(path, tmp_path / "out")
    assert caught.value.hint and hint in caught.value.hint, caught.value.hint


def test_publish_of_a_refused_archive_prints_the_hint(cli, manifest, tmp_path):
    path = tmp_path / "evil.tar.zst"
    path.write_bytes(tar_zst(_with(manifest, member("../x", b"x"))))
    result = cli("bundle", "publish", str(path), "--release", "v1", "--mirror", str(tmp_path / "m"))
    assert result.code == 2, result.err
    assert "climbs out of the bundle" in result.err
    assert "hint: `dllm bundle build` never writes such an archive" in result.err
    assert REBUILD in result.err


def test_an_install_whose_pinned_archive_is_refused_names_the_publisher(manifest, tmp_path):
    """The catalog pins these very bytes: re-downloading or another mirror gives the same, so
    the hint is not the maker's `rebuild it` but to tell the release's publisher."""
    from turbo_dllm.bundles.install import plan_install, run_install
    from turbo_dllm.bundles.store import BundleStore

    honest = tiny_bundle(tmp_path, {"lib/x.so": LIB})
    mirror, catalog_sha, entry = published(tmp_path, honest)
    evil = tar_zst(_with(manifest, member("lib/x.so", kind=tarfile.SYMTYPE, link="/etc/passwd")))
    catalog_sha = _repin(mirror, catalog_sha, entry, evil)
    plan = plan_install("v-adv", index=str(mirror), catalog_sha256=catalog_sha)
    with pytest.raises(BundleRejected, match="a symbolic link") as caught:
        run_install(plan, retries=0)
    assert "the very bytes the catalog pins" in caught.value.hint
    assert "tell the release's publisher" in caught.value.hint
    assert BundleStore().active() is None


def _repin(mirror, catalog_sha, entry, data: bytes) -> str:
    """Serve `data` as `entry`'s archive, with a catalog that pins it; its new sha256."""
    from tests.bundles.crafting import write_catalog
    from turbo_dllm.bundles.catalog import sha256_bytes

    (mirror / "bundles" / entry.file).write_bytes(data)
    row = entry.model_dump(mode="json") | {"size": len(data), "sha256": sha256_bytes(data)}
    return write_catalog(mirror, "v-adv", [row])
