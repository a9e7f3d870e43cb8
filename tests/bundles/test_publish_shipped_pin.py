"""`dllm bundle publish` without `--lock` printed the `releases.lock` line to add even when the
lock shipped in turbo-dllm already pins that release to the same catalog: it says so now, and
its install line needs no `--catalog-sha256`; a release the shipped lock pins to another
catalog is warned about (its installs would refuse this one)."""

from __future__ import annotations

import json
import shlex

import pytest

from turbo_dllm.bundles import resources


@pytest.fixture
def shipped_lock(tmp_path, monkeypatch):
    """A stand-in for the releases.lock shipped in the package, pinning what a test writes."""
    lock = tmp_path / "shipped-releases.lock"

    def pin(release: str, sha256: str) -> None:
        lock.write_text(
            'format = "turbo_dllm.releases.v1"\n\n[releases]\n'
            f'"{release}" = {{catalog_sha256 = "{sha256}"}}\n'
        )

    pin("v-other", "0" * 64)
    monkeypatch.setattr(resources, "releases_lock_path", lambda: lock)
    return pin


def _publish(cli, cpu_bundle, root, *extra):
    return cli("bundle", "publish", cpu_bundle.archive, "--release", "v-test", "--mirror", root,
               *extra)  # fmt: skip


def test_a_release_the_shipped_lock_pins_is_said_to_be_pinned(
    cli, cpu_bundle, mirror, shipped_lock
):
    root, catalog_sha = mirror
    shipped_lock("v-test", catalog_sha)
    result = _publish(cli, cpu_bundle, root)
    assert result.code == 0, result.err
    assert "releases.lock line" not in result.out
    assert "releases.lock already pins v-test to this catalog (shipped lock)" in result.out
    (install,) = [line for line in result.out.splitlines() if line.startswith("install: ")]
    assert "--catalog-sha256" not in install
    installed = cli(*shlex.split(install.removeprefix("install: "))[1:])  # as printed
    assert installed.code == 0, installed.err
    as_json = json.loads(_publish(cli, cpu_bundle, root, "--json").out)
    assert as_json["shipped_pin"] == catalog_sha and as_json["pinned"] is None


def test_a_release_pinned_to_another_catalog_is_warned_about(cli, cpu_bundle, mirror, shipped_lock):
    root, catalog_sha = mirror
    shipped_lock("v-test", "f" * 64)
    result = _publish(cli, cpu_bundle, root)
    assert result.code == 0, result.err
    assert f'releases.lock line: "v-test" = {{ catalog_sha256 = "{catalog_sha}" }}' in result.out
    assert f"pins v-test to another catalog ({'f' * 64})" in result.err
    assert f"--catalog-sha256 {catalog_sha}" in result.out


def test_an_unpinned_release_gets_the_line_to_add(cli, cpu_bundle, mirror, shipped_lock):
    root, catalog_sha = mirror
    result = _publish(cli, cpu_bundle, root)
    assert f'releases.lock line: "v-test" = {{ catalog_sha256 = "{catalog_sha}" }}' in result.out
    assert f"--catalog-sha256 {catalog_sha}" in result.out and result.err == ""
