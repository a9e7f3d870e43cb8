"""Reproducible bundles: two builds of one target from the same sources and toolchain, in other
folders at other times, are byte-identical; `dllm bundle build --check` proves it against a
published catalog; the first release pinned in releases.lock is one anyone can rebuild."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from turbo_dllm.bundles.archive import extract_bundle
from turbo_dllm.bundles.build import build_bundle
from turbo_dllm.bundles.catalog import parse_catalog, read_releases_lock, sha256_bytes
from turbo_dllm.bundles.publish import publish
from turbo_dllm.bundles.resources import shipped_path

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def second_build(tmp_path, monkeypatch):
    """The same target built again: another DLLM_HOME (so nothing is reused from the build
    cache), another output folder, a later time."""
    monkeypatch.setenv("DLLM_HOME", str(tmp_path / "other-home"))
    return build_bundle(tmp_path / "elsewhere" / "out")


def test_two_builds_are_byte_identical(cpu_bundle, second_build, tmp_path):
    assert second_build.archive.parent != cpu_bundle.archive.parent
    assert second_build.sha256 == cpu_bundle.sha256
    assert second_build.archive.read_bytes() == cpu_bundle.archive.read_bytes()
    # No folder of the build host inside the library (what -ffile-prefix-map removes).
    manifest = extract_bundle(second_build.archive, tmp_path / "x")
    library = (tmp_path / "x" / manifest.ops[0].library).read_bytes()
    import torch

    for folder in (Path(torch.__file__).parent, ROOT, tmp_path):
        assert str(folder).encode() not in library, folder


def test_build_check_against_a_published_catalog(cli_process, cpu_bundle, tmp_path):
    root = tmp_path / "mirror"
    catalog = publish([cpu_bundle.archive], release="v-check", mirror=root).catalog
    result = cli_process("bundle", "build", "--check", catalog, "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert report["identical"] and report["sha256"] == cpu_bundle.sha256

    # A catalog whose entry names other bytes: exit 1, both hashes shown.
    tampered = tmp_path / "releases" / "v-check" / "catalog.toml"
    tampered.parent.mkdir(parents=True)
    tampered.write_text(catalog.read_text().replace(cpu_bundle.sha256, "0" * 64))
    result = cli_process("bundle", "build", "--check", tampered)
    assert result.code == 1 and "DIFFERENT" in result.out and "0" * 64 in result.out


def test_first_release_is_pinned_and_its_catalog_ships(cpu_bundle):
    """The pin verifies against the catalog that ships with the package; that catalog lists a
    CPU bundle, and where this host builds that target (this repository's CI image) the build
    is exactly the published bundle (`dllm bundle build --check`; docs/bundles.md, Releases)."""
    lock = read_releases_lock()
    assert lock.releases, "releases.lock pins no release"
    for release, pin in lock.releases.items():
        path = shipped_path("bundles", "releases", release, "catalog.toml")
        data = path.read_bytes()
        assert sha256_bytes(data) == pin.catalog_sha256, release
        catalog = parse_catalog(data, str(path))
        assert catalog.release == release
        assert any(entry.target.kind == "cpu" for entry in catalog.bundles)
        for entry in catalog.bundles:
            if entry.target == cpu_bundle.target:
                assert entry.sha256 == cpu_bundle.sha256, (release, entry.file)
