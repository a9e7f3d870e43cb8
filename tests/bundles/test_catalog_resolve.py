"""Catalogs, the releases lock, build targets, and resolving a fingerprint to one bundle."""

from __future__ import annotations

import pytest

from turbo_dllm.bundles.catalog import (
    Catalog,
    CatalogEntry,
    ReleasePin,
    ReleasesLock,
    dump_catalog,
    parse_catalog,
    pin_release,
    read_releases_lock,
    trusted_catalog_sha256,
)
from turbo_dllm.bundles.manifest import archive_name
from turbo_dllm.bundles.resolve import select_bundle
from turbo_dllm.bundles.target import BundleTarget
from turbo_dllm.bundles.targets import pick_build_target, read_targets
from turbo_dllm.errors import DllmError
from turbo_dllm.host import collect_fingerprint

SM90 = "cp312-torch2.11-cu130-cxx11-linux_x86_64-sm90"
SM80_90 = "cp312-torch2.11-cu130-cxx11-linux_x86_64-sm80+sm90"
CPU312 = "cp312-torch2.11-cpu-cxx11-linux_x86_64"


def entry(target: str, sha: str = "a") -> CatalogEntry:
    parsed = BundleTarget.parse(target)
    return CatalogEntry(
        target=parsed, version="0.1.0", file=archive_name("0.1.0", parsed), size=10, sha256=sha * 64
    )


def host(**overrides):
    env = {
        "DLLM_OVERRIDE_PYTHON": "3.12",
        "DLLM_OVERRIDE_TORCH": "2.11.0",
        "DLLM_OVERRIDE_CXX11_ABI": "1",
    }
    env["DLLM_OVERRIDE_PLATFORM"] = "linux_x86_64"
    env.update(overrides)
    return collect_fingerprint(environ=env)


def test_catalog_round_trips_deterministically():
    catalog = Catalog(release="v1", bundles=(entry(SM90, "b"), entry(CPU312, "c")))
    text = dump_catalog(catalog)
    assert parse_catalog(text.encode(), "x") == Catalog(
        release="v1", bundles=(entry(CPU312, "c"), entry(SM90, "b"))
    )
    assert dump_catalog(parse_catalog(text.encode(), "x")) == text  # same bytes, same hash


def test_catalog_rejects_duplicates_and_misnamed_files():
    text = dump_catalog(Catalog(release="v1", bundles=(entry(SM90),))).replace(
        "[[bundles]]", "[[bundles]]", 1
    )
    doubled = text + text[text.index("[[bundles]]") :]
    with pytest.raises(DllmError, match="duplicate catalog entry: target"):
        parse_catalog(doubled.encode(), "mirror/catalog.toml")
    with pytest.raises(DllmError, match="should be"):
        parse_catalog(text.replace("turbo-dllm-kernels-0.1.0", "renamed").encode(), "c")
    with pytest.raises(DllmError, match="not a valid catalog.toml"):
        parse_catalog(b"[[[", "c")


def test_select_exact_match_and_gpu_coverage():
    catalog = Catalog(release="v1", bundles=(entry(SM90), entry(CPU312, "c")))
    chosen, resolution = select_bundle(
        catalog, host(DLLM_OVERRIDE_CUDA="13.0", DLLM_OVERRIDE_GPUS="sm90,sm90")
    )
    assert str(chosen.target) == SM90
    assert "cuda: host cu130, bundle cpu" in resolution.trace()
    chosen, _ = select_bundle(catalog, host(DLLM_OVERRIDE_CUDA="none", DLLM_OVERRIDE_GPUS=""))
    assert str(chosen.target) == CPU312
    # A CUDA torch on a node without GPUs still takes the CUDA bundle (it holds the CPU kernels too).
    chosen, _ = select_bundle(catalog, host(DLLM_OVERRIDE_CUDA="13.0", DLLM_OVERRIDE_GPUS=""))
    assert str(chosen.target) == SM90


def test_no_match_lists_host_values_and_every_candidate():
    catalog = Catalog(release="v1", bundles=(entry(SM90), entry(CPU312, "c")))
    with pytest.raises(DllmError) as caught:
        select_bundle(catalog, host(DLLM_OVERRIDE_CUDA="13.0", DLLM_OVERRIDE_GPUS="sm90,sm100"))
    message = caught.value.message
    assert "host: python cp312, platform linux_x86_64, torch torch2.11, cuda cu130" in message
    assert "gpus sm90+sm100" in message and "overridden:" in message
    assert f"{SM90}: gpus: host sm90+sm100, bundle sm90" in message
    assert f"{CPU312}: cuda: host cu130, bundle cpu; gpus: host sm90+sm100, bundle none" in message
    # --build missing builds for the real host, not the one the overrides describe
    assert "on a host like the one DLLM_OVERRIDE_* describe" in caught.value.hint
    assert "--build missing" not in caught.value.hint


def test_several_matches_is_an_error_unless_a_target_is_named():
    catalog = Catalog(release="v1", bundles=(entry(SM90), entry(SM80_90, "d")))
    gpu_host = host(DLLM_OVERRIDE_CUDA="13.0", DLLM_OVERRIDE_GPUS="sm90")
    with pytest.raises(DllmError, match="2 bundles in release v1 fit this host"):
        select_bundle(catalog, gpu_host)
    chosen, _ = select_bundle(catalog, gpu_host, target=BundleTarget.parse(SM80_90))
    assert str(chosen.target) == SM80_90
    with pytest.raises(DllmError, match="does not fit this host: cuda"):
        select_bundle(
            Catalog(release="v1", bundles=(entry(CPU312),)),
            gpu_host,
            target=BundleTarget.parse(CPU312),
        )


def test_trust_rules():
    lock = ReleasesLock(releases={"v1": ReleasePin(catalog_sha256="a" * 64)})
    assert trusted_catalog_sha256("v1", lock, None) == "a" * 64
    assert trusted_catalog_sha256("v1", lock, "A" * 64) == "a" * 64
    assert trusted_catalog_sha256("v2", lock, "b" * 64) == "b" * 64
    with pytest.raises(DllmError, match="contradicts"):
        trusted_catalog_sha256("v1", lock, "b" * 64)
    with pytest.raises(DllmError, match="not pinned"):
        trusted_catalog_sha256("v2", lock, None)
    with pytest.raises(DllmError, match="not a sha256"):
        trusted_catalog_sha256("v2", lock, "xyz")


def test_shipped_lock_and_targets_are_valid():
    assert isinstance(read_releases_lock(), ReleasesLock)
    names = [t.name for t in read_targets().targets]
    assert {"cpu-x86_64", "sm90"} <= set(names)


def test_pin_release_adds_once_and_never_changes_a_pin(tmp_path):
    lock = tmp_path / "releases.lock"
    lock.write_text('# trust root\nformat = "turbo_dllm.releases.v1"\n\n[releases]\n')
    assert pin_release(lock, "v1", "a" * 64) is True
    assert pin_release(lock, "v1", "a" * 64) is False
    with pytest.raises(DllmError, match="already pinned"):
        pin_release(lock, "v1", "b" * 64)
    assert read_releases_lock(lock).releases["v1"].catalog_sha256 == "a" * 64
    assert lock.read_text().startswith("# trust root")


def test_build_target_auto_and_named():
    cpu_host = host(DLLM_OVERRIDE_CUDA="none", DLLM_OVERRIDE_GPUS="")
    spec, target = pick_build_target("auto", cpu_host)
    assert spec.name == "cpu-x86_64" and str(target) == CPU312
    gpu_host = host(DLLM_OVERRIDE_CUDA="13.0", DLLM_OVERRIDE_GPUS="sm90")
    spec, target = pick_build_target("auto", gpu_host)
    assert spec.name == "sm90" and str(target) == SM90
    with pytest.raises(DllmError, match="cannot build target 'sm90': torch CUDA none"):
        pick_build_target("sm90", cpu_host)
    with pytest.raises(DllmError, match="no build target fits"):
        pick_build_target("auto", host(DLLM_OVERRIDE_PYTHON="3.9", DLLM_OVERRIDE_CUDA="none"))
    with pytest.raises(DllmError, match="unknown build target"):
        pick_build_target("sm75", cpu_host)
