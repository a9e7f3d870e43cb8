"""Bundle test fixtures: one real CPU bundle per session, mirrors, and archive crafting helpers.

Compiling takes ~15 s on 2 cores, so `cpu_bundle` builds once (session scope, its own
DLLM_HOME for the build cache) and every test that needs bundles works from that archive:
publishing it, relabelling it (`variant`), or crafting malicious archives from its files.
"""

from __future__ import annotations

import os

import pytest

from turbo_dllm.bundles.publish import publish


@pytest.fixture(scope="session")
def build_home(tmp_path_factory):
    """The DLLM_HOME `cpu_bundle` builds in: its build cache lets a rebuild only relink."""
    return tmp_path_factory.mktemp("build-home")


@pytest.fixture(scope="session")
def cpu_bundle(tmp_path_factory, build_home):
    """BuildResult of `dllm bundle build --target auto` on this host (built once)."""
    from turbo_dllm.bundles.build import build_bundle

    home = build_home
    out = tmp_path_factory.mktemp("build-out")
    saved = os.environ.get("DLLM_HOME")
    os.environ["DLLM_HOME"] = str(home)
    try:
        return build_bundle(out)
    finally:
        if saved is None:
            os.environ.pop("DLLM_HOME", None)
        else:
            os.environ["DLLM_HOME"] = saved


@pytest.fixture(params=[False, True], ids=["hash-inline", "hash-threaded"])
def hashing(request, monkeypatch):
    """Both ways of hashing an archive while it downloads: inline, and on a helper thread
    (what archives of `THREADED_HASH_BYTES` and more get)."""
    if request.param:
        from turbo_dllm.bundles import fetch

        monkeypatch.setattr(fetch, "THREADED_HASH_BYTES", 0)


@pytest.fixture
def mirror(tmp_path, cpu_bundle):
    """A mirror folder with the built bundle published as release `v-test`."""
    root = tmp_path / "mirror"
    result = publish([cpu_bundle.archive], release="v-test", mirror=root)
    return root, result.catalog_sha256


@pytest.fixture
def installed(mirror):
    """The built bundle installed and active in this test's DLLM_HOME (from a mirror folder)."""
    from turbo_dllm.bundles.install import plan_install, run_install

    root, catalog_sha = mirror
    plan = plan_install("v-test", index=str(root), catalog_sha256=catalog_sha)
    return run_install(plan).bundle
