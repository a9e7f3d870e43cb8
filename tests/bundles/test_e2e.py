"""End to end on CPU: build -> publish -> serve -> `dllm bundle install --auto` -> load -> compare.

The same install from a real HTTP server on 127.0.0.1, a file:// URL and a plain folder.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from tests.bundles.server import MirrorServer
from turbo_dllm.kernels import merge_attention_partials
from turbo_dllm.kernels.selftest import compare_merge_attention_partials

native = functools.partial(merge_attention_partials, backend="native")


def test_built_bundle_describes_itself(cpu_bundle):
    manifest = cpu_bundle.manifest
    assert (
        cpu_bundle.archive.name
        == f"turbo-dllm-kernels-{manifest.version}-{manifest.target}.tar.zst"
    )
    assert manifest.target.kind == "cpu"
    (op,) = manifest.ops
    assert op.name == "merge_attention_partials" and op.devices == ("cpu",)
    assert op.library in {f.path for f in manifest.files}
    from turbo_dllm.bundles.native import load_native_op

    assert op.source_sha256 == load_native_op("merge_attention_partials").source_sha256()
    assert manifest.build.host.python_tag == manifest.target.python
    assert manifest.build.cxx and "-O3" in manifest.build.cflags


def _check_installed_op(cli):
    status = json.loads(cli("bundle", "status", "--json").out)
    assert status["fits_host"] and status["active"]["target"]
    errors = compare_merge_attention_partials(native, seed=11)
    assert max(errors.values()) <= 1e-5, errors
    verify = cli("bundle", "verify")
    assert verify.code == 0 and verify.out.startswith("ok"), verify.out


def test_install_auto_over_http(cli, mirror):
    root, catalog_sha = mirror
    with MirrorServer(root) as server:
        dry = cli(
            "bundle", "install", "--release", "v-test", "--auto", "--index", server.url,
            "--catalog-sha256", catalog_sha, "--dry-run", "--json",
        )  # fmt: skip
        assert dry.code == 0, dry.err
        plan = json.loads(dry.out)
        assert plan["dry_run"] and plan["candidates"][0]["fits"]
        assert cli("bundle", "list").out.startswith("no bundles installed")  # dry run: nothing
        result = cli(
            "bundle", "install", "--release", "v-test", "--auto", "--index", server.url,
            "--catalog-sha256", catalog_sha, "--json",
        )  # fmt: skip
        paths = [path for path, _ in server.state.requests]
    assert result.code == 0, result.err
    installed = json.loads(result.out)["installed"]
    assert installed["sha256"] == plan["bundle"]["sha256"]
    assert paths == [
        "/releases/v-test/catalog.toml",
        "/releases/v-test/catalog.toml",
        f"/bundles/{plan['bundle']['file']}",
    ]
    _check_installed_op(cli)


@pytest.mark.parametrize("form", ["file-url", "folder"])
def test_install_auto_from_file_url_and_folder(cli, mirror, form):
    root, catalog_sha = mirror
    index = root.as_uri() if form == "file-url" else str(root)
    flag = "--index" if form == "file-url" else "--mirror"
    result = cli(
        "bundle",
        "install",
        "--release",
        "v-test",
        "--auto",
        flag,
        index,
        "--catalog-sha256",
        catalog_sha,
    )
    assert result.code == 0, result.err
    assert "installed and activated" in result.out
    _check_installed_op(cli)


def test_a_relative_mirror_is_recorded_as_an_absolute_path(cli, mirror, monkeypatch):
    root, catalog_sha = mirror
    monkeypatch.chdir(root.parent)
    result = cli("bundle", "install", "--release", "v-test", "--auto", "--mirror", root.name,
                 "--catalog-sha256", catalog_sha, "--json")  # fmt: skip
    assert result.code == 0, result.err
    (bundle,) = json.loads(cli("bundle", "list", "--json").out)["bundles"]
    assert bundle["source"] == str(
        root.resolve() / "bundles" / json.loads(result.out)["bundle"]["file"]
    )
    record = json.loads((Path(bundle["path"]) / "install.json").read_text())
    assert record["source"] == bundle["source"]


def test_index_from_environment_and_reinstall_reuses_the_store(cli, mirror, monkeypatch):
    root, catalog_sha = mirror
    monkeypatch.setenv("DLLM_BUNDLE_INDEX", root.as_uri())
    first = cli(
        "bundle", "install", "--release", "v-test", "--auto", "--catalog-sha256", catalog_sha
    )
    again = cli(
        "bundle", "install", "--release", "v-test", "--auto", "--catalog-sha256", catalog_sha
    )
    assert first.code == 0 and again.code == 0, again.err
    # it was active all along: "activated" said it changed something
    assert again.out.startswith("already installed and active: "), again.out
    assert "nothing changed" in again.out and "activated" not in again.out
    data = json.loads(cli("bundle", "install", "--release", "v-test", "--auto",
                          "--catalog-sha256", catalog_sha, "--json").out)  # fmt: skip
    assert data["reused"] is True and data["already_active"] is True
    assert len(json.loads(cli("bundle", "list", "--json").out)["bundles"]) == 1
