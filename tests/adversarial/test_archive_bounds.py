"""Archives a catalog pins but that are hostile (a hostile publisher, or a --catalog-sha256 from
the wrong hands): the extractor refuses them with a BundleRejected, within bounded time and
memory, before tarfile parses an oversized header and before a bomb reaches the disk."""

from __future__ import annotations

import tarfile
import time

import pytest

from tests.adversarial.bounded_run import run_dllm
from tests.adversarial.hostile import (
    hostile_pax,
    manifest_of,
    nested_manifest,
    pax_bomb,
    tar_zst,
    zero_bomb,
)
from tests.bundles.crafting import member
from turbo_dllm.bundles.archive import (
    MAX_BUNDLE_BYTES,
    BundleRejected,
    extract_bundle,
    read_archive_manifest,
)
from turbo_dllm.bundles.manifest import BundleFile
from turbo_dllm.errors import DllmError


def extract(tmp_path, data: bytes, name="a.tar.zst"):
    path = tmp_path / name
    path.write_bytes(data)
    return extract_bundle(path, tmp_path / f"out-{name}")


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("sparse-map", "pax keyword 'GNU.sparse.map' is not allowed"),
        ("sparse-realsize", "pax keyword 'GNU.sparse.realsize' is not allowed"),
        ("hdrcharset", "pax keyword 'hdrcharset' is not allowed"),
    ],
)
def test_pax_records_tarfile_chokes_on_are_refused(honest, tmp_path, kind, message):
    archive = honest[3]
    with pytest.raises(BundleRejected, match=message):
        extract(tmp_path, hostile_pax(kind, manifest_of(archive)))
    assert not (tmp_path / "out-a.tar.zst" / "lib").exists()


def test_other_header_kinds_and_malformed_records_are_refused(honest, tmp_path):
    manifest = manifest_of(honest[3])
    long_name = member("lib/x.so", b"x")
    long_name[0].type = tarfile.GNUTYPE_LONGNAME
    with pytest.raises(BundleRejected, match="GNU long-name header"):
        extract(tmp_path, tar_zst([member("bundle.json", manifest), long_name]), "gnu.tar.zst")
    info, data = member("lib/x.so", b"x")
    info.pax_headers = {"size": "1x"}
    with pytest.raises(BundleRejected, match="pax record size='1x' is not valid"):
        extract(tmp_path, tar_zst([member("bundle.json", manifest), (info, data)]), "s.tar.zst")


def test_nested_bundle_json_is_an_error(tmp_path):
    with pytest.raises(DllmError, match="invalid bundle.json: .*nested too deeply"):
        extract(tmp_path, nested_manifest())


def test_a_huge_pax_record_is_refused_in_bounded_time_and_memory(honest, tmp_path):
    """CVE-2024-6232: tarfile's pax parsing is quadratic. 64 MiB of digits (a few KB of zstd)
    would take tarfile hours; the header's size is refused before tarfile reads it. Through
    `dllm bundle publish`, which extracts the archive to check it, in a capped child."""
    path = tmp_path / "pax-bomb.tar.zst"
    path.write_bytes(pax_bomb(manifest_of(honest[3]), 64 << 20))
    assert path.stat().st_size < 64 * 1024
    start = time.monotonic()
    done = run_dllm("bundle", "publish", path, "--release", "v1", "--mirror", tmp_path / "m",
                    timeout=30)  # fmt: skip
    assert time.monotonic() - start < 20
    assert done.code == 2 and "Traceback" not in done.err, done.err
    assert "67108864-byte pax header, over the 1024-byte cap" in done.err, done.err


def test_a_pinned_bomb_is_refused_before_a_byte_is_written(honest, tmp_path):
    """256 MiB of zeros in ~300 KB of archive, listed honestly in its bundle.json."""
    bomb = zero_bomb(read_archive_manifest(honest[3]), "lib/x.so", 256 << 20)
    with pytest.raises(BundleRejected, match="over the 1000x cap on expansion"):
        extract(tmp_path, bomb)
    assert list((tmp_path / "out-a.tar.zst").iterdir()) == []


def test_the_caps_are_named(honest, tmp_path):
    manifest = read_archive_manifest(honest[3])
    big = manifest.model_copy(
        update={"files": (BundleFile(path="lib/x.so", sha256="0" * 64, size=MAX_BUNDLE_BYTES + 1),)}
    )
    with pytest.raises(BundleRejected, match=r"over the 17179869184-byte \(16 GiB\) cap"):
        extract(tmp_path, tar_zst([member("bundle.json", big.to_json().encode())]), "big.tar.zst")
    many = manifest.model_copy(
        update={
            "files": tuple(
                BundleFile(path=f"lib/{i}.so", sha256="0" * 64, size=0) for i in range(4097)
            ),
            "ops": (),
        }
    )
    with pytest.raises(BundleRejected, match="4097 files, over the 4096-file cap"):
        extract(tmp_path, tar_zst([member("bundle.json", many.to_json().encode())]), "n.tar.zst")


def test_a_frame_asking_for_a_huge_window_is_refused_not_allocated(honest, tmp_path):
    """zstd's window is memory the decoder allocates before the first byte is checked: a
    frame whose header asks for 2 GiB is refused by libzstd's default limit (128 MiB)."""
    import io

    import zstandard

    params = zstandard.ZstdCompressionParameters(
        window_log=31, enable_ldm=True, write_content_size=False
    )
    buffer = io.BytesIO()
    with zstandard.ZstdCompressor(compression_params=params).stream_writer(
        buffer, closefd=False
    ) as writer:
        writer.write(tar_zst_payload(manifest_of(honest[3])))
    data = buffer.getvalue()
    assert zstandard.get_frame_parameters(data).window_size == 2**31
    with pytest.raises(BundleRejected, match="requires too much memory"):
        extract(tmp_path, data)


def tar_zst_payload(manifest: bytes) -> bytes:
    """The uncompressed tar stream of an archive holding only `manifest` as bundle.json."""
    import zstandard

    return (
        zstandard.ZstdDecompressor()
        .decompressobj()
        .decompress(tar_zst([member("bundle.json", manifest)]))
    )
