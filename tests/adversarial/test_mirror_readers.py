"""The mirror's readers (`dllm mirror verify`, `dllm env sync --mirror`) against a hostile served
mirror: documents are read up to a cap, deep nesting is an error, not a RecursionError."""

from __future__ import annotations

import pytest

from tests.bundles.server import MirrorServer
from turbo_dllm.bundles.catalog import parse_catalog
from turbo_dllm.errors import DllmError
from turbo_dllm.mirror import source
from turbo_dllm.mirror.source import open_mirror


def test_a_deeply_nested_mirror_index_is_an_error(tmp_path):
    (tmp_path / "MIRROR.json").write_bytes(b"[" * 100_000)
    with MirrorServer(tmp_path) as server, pytest.raises(DllmError, match="not JSON"):
        open_mirror(server.url).index()


def test_a_mirror_document_over_the_cap_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(source, "MAX_DOCUMENT_BYTES", 1000)
    (tmp_path / "MIRROR.json").write_bytes(b" " * 5000)
    with MirrorServer(tmp_path) as server:
        with pytest.raises(DllmError, match="MIRROR.json is over the 1000-byte cap"):
            open_mirror(server.url).index()
        assert open_mirror(server.url).digest("MIRROR.json", 100)[1] <= 100 + 1024 * 1024


def test_a_deeply_nested_catalog_is_an_error():
    with pytest.raises(DllmError, match="not a valid catalog.toml: nested too deeply"):
        parse_catalog(b"a = " + b"[" * 100_000, "catalog.toml")


def test_a_wheel_index_that_keeps_sending_is_cut_off_at_the_manifest_size(tmp_path):
    from turbo_dllm.envs.manifest import WheelFile
    from turbo_dllm.mirror.wheels import download_wheel

    served = tmp_path / "index"
    served.mkdir()
    (served / "x-1.0-py3-none-any.whl").write_bytes(b"\0" * (3 << 20))
    wheel = WheelFile(filename="x-1.0-py3-none-any.whl", sha256="0" * 64, size=1000)
    dest = tmp_path / "dest"
    dest.mkdir()
    with MirrorServer(served) as server:
        url = f"{server.url}/x-1.0-py3-none-any.whl"
        with pytest.raises(DllmError, match="sent more than the manifest's 1000 bytes"):
            download_wheel([url], wheel, dest)
    assert list(dest.iterdir()) == []
