"""An index given one level too deep (the catalog's URL pasted from a browser, the mirror's
`releases/` or `bundles/` folder) failed with "…/catalog.toml/releases/v/catalog.toml was not
found" and the hint "check the index URL and the release name": now the hint names the index
(the folder that holds releases/ and bundles/) as the option to pass, and that command works."""

from __future__ import annotations

import os
import shlex

import pytest

from tests.adversarial.hostile import published, tiny_bundle
from tests.bundles.server import MirrorServer
from turbo_dllm.bundles.store import BundleStore


@pytest.fixture
def mirror(tmp_path):
    root, catalog_sha, _ = published(tmp_path, tiny_bundle(tmp_path, {"lib/a.so": os.urandom(99)}))
    return root, catalog_sha


def _install(cli, catalog_sha, *where):
    return cli(
        "bundle", "install", "--release", "v-adv", "--auto", *where,
        "--catalog-sha256", catalog_sha, "--retries", "0",
    )  # fmt: skip


def _suggested(err: str, flag: str) -> list[str]:
    """The `FLAG VALUE` the hint suggests, as the shell reads it."""
    hint = err.split("hint: ", 1)[1]
    words = shlex.split(hint.split(f"{flag} ", 1)[1].split(";", 1)[0].strip().rstrip(")"))
    return [flag, words[0]]


@pytest.mark.parametrize("below", ["/releases/v-adv/catalog.toml", "/releases/", "/bundles"])
def test_an_index_url_one_level_too_deep_is_named(cli, mirror, below):
    root, catalog_sha = mirror
    with MirrorServer(root) as server:
        result = _install(cli, catalog_sha, "--index", server.url + below)
        assert result.code == 2 and "was not found (HTTP 404)" in result.err
        assert _suggested(result.err, "--index") == ["--index", server.url], result.err
        assert _install(cli, catalog_sha, "--index", server.url).code == 0
    assert BundleStore().active() is not None


@pytest.mark.parametrize("below", ["releases", "releases/v-adv/catalog.toml"])
def test_a_mirror_folder_one_level_too_deep_is_named(cli, mirror, below):
    root, catalog_sha = mirror
    result = _install(cli, catalog_sha, "--mirror", str(root / below))
    assert result.code == 2, result.err
    assert _suggested(result.err, "--mirror") == ["--mirror", str(root)], result.err
    assert _install(cli, catalog_sha, "--mirror", str(root)).code == 0


@pytest.mark.parametrize("served", [True, False], ids=["index", "mirror"])
def test_an_index_whose_catalog_lists_a_missing_bundle_says_it_is_incomplete(cli, tmp_path, served):
    """The catalog was found (so the index and release name are right) but the archive it
    lists is not there (a half-copied mirror): the hint said "check the index URL and the
    release name"."""
    root, catalog_sha, entry = published(
        tmp_path, tiny_bundle(tmp_path, {"lib/a.so": os.urandom(99)})
    )
    (root / "bundles" / entry.file).unlink()
    with MirrorServer(root) as server:
        where = ("--index", server.url) if served else ("--mirror", str(root))
        result = _install(cli, catalog_sha, *where)
    assert result.code == 2 and entry.file in result.err
    hint = result.err.split("hint: ", 1)[1]
    assert "release name" not in hint
    assert "the release's catalog lists it" in result.err
    assert "dllm mirror verify" in hint and "--build missing" in hint


def test_with_build_missing_a_missing_archive_builds(cli, tmp_path, monkeypatch):
    """`--build missing` is for when no published bundle can serve this host; one the catalog
    lists but the index lacks is such a case (it failed, and its hint offered the very
    `--build missing` that was given)."""
    from turbo_dllm.bundles import install
    from turbo_dllm.errors import DllmError

    root, catalog_sha, entry = published(
        tmp_path, tiny_bundle(tmp_path, {"lib/a.so": os.urandom(99)})
    )
    (root / "bundles" / entry.file).unlink()

    def build_and_install(**options):  # the build itself is tested elsewhere (slow)
        raise DllmError("the build ran")

    monkeypatch.setattr(install, "build_and_install", build_and_install)
    result = _install(cli, catalog_sha, "--mirror", str(root), "--build", "missing")
    assert "building this host's bundle" in result.err and "the build ran" in result.err, result.err
