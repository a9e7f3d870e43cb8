"""Reproducible bundles: two builds of one target from the same sources and toolchain, in other
folders at other times, are byte-identical; `dllm bundle build --check` proves it against a
published catalog; the first release pinned in releases.lock is one anyone can rebuild."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import assert_user_error
from turbo_dllm.bundles.archive import extract_bundle
from turbo_dllm.bundles.catalog import parse_catalog, read_releases_lock, sha256_bytes
from turbo_dllm.bundles.publish import publish
from turbo_dllm.bundles.resources import shipped_path

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def second_build(tmp_path):
    """The same target built again from a copy of the sources in another folder, with another
    DLLM_HOME (nothing reused from the build cache) and output folder, at a later time. The
    folders hold a space and a non-ASCII letter, the home a `$` too (a home with a space failed
    to build: the compiler got half a -ffile-prefix-map). A `$` in the checkout's path breaks
    torch's own build.ninja (it escapes only spaces in source paths), so the test has none."""
    checkout = tmp_path / "else where ü" / "check out"
    for name in ("turbo_dllm", "native", "bundles", "manifests"):
        shutil.copytree(
            ROOT / name, checkout / name, symlinks=True,
            ignore=shutil.ignore_patterns("__pycache__"),
        )  # fmt: skip
    out = tmp_path / "else where ü" / "out"
    env = {
        **os.environ,
        "PYTHONPATH": str(checkout),
        "DLLM_HOME": str(tmp_path / "other home ü $x"),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "turbo_dllm", "bundle", "build", "--out", str(out), "--json"],
        cwd=checkout, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    built = json.loads(proc.stdout)
    assert built["archive"].startswith(str(out))
    return Path(built["archive"]), built["sha256"]


def test_two_builds_are_byte_identical(cpu_bundle, second_build, tmp_path):
    archive, sha256 = second_build
    assert sha256 == cpu_bundle.sha256
    assert archive.read_bytes() == cpu_bundle.archive.read_bytes()
    # No folder of either build host inside the library (what -ffile-prefix-map removes).
    manifest = extract_bundle(archive, tmp_path / "x")
    library = (tmp_path / "x" / manifest.ops[0].library).read_bytes()
    import torch

    for folder in (Path(torch.__file__).parent, ROOT, tmp_path):
        assert str(folder).encode() not in library, folder


def test_build_check_against_a_published_catalog(cli_process, cpu_bundle, build_home, tmp_path):
    root = tmp_path / "mirror"
    catalog = publish([cpu_bundle.archive], release="v-check", mirror=root).catalog
    # The first build's cache: the rebuild relinks (the cold rebuild is the test above).
    home = {"DLLM_HOME": str(build_home)}
    result = cli_process("bundle", "build", "--check", catalog, "--json", env=home)
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert report["identical"] and report["sha256"] == cpu_bundle.sha256

    # A catalog whose entry names other bytes: exit 1, both hashes shown.
    tampered = tmp_path / "releases" / "v-check" / "catalog.toml"
    tampered.parent.mkdir(parents=True)
    tampered.write_text(catalog.read_text().replace(cpu_bundle.sha256, "0" * 64))
    result = cli_process("bundle", "build", "--check", tampered, env=home)
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
                # A release never changes: new native sources or a new toolchain need a new
                # release (docs/bundles.md, Releases), not an edit of this one.
                assert entry.sha256 == cpu_bundle.sha256, (
                    f"{release}: this checkout builds {cpu_bundle.sha256}, the release lists "
                    f"{entry.sha256} for {entry.file}; if the native sources or the toolchain "
                    "changed on purpose, cut a new release"
                )


def test_build_check_names_a_catalog_without_this_hosts_target(cli, tmp_path):
    """Refused before anything compiles: the catalog must list the target this host builds."""
    catalog = tmp_path / "catalog.toml"
    catalog.write_text('format = "turbo_dllm.catalog.v1"\nrelease = "v-none"\nbundles = []\n')
    result = cli("bundle", "build", "--check", catalog)
    assert_user_error(result, "release v-none has no bundle for", "lists: none")
