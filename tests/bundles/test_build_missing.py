"""`dllm bundle install --auto --build missing`: with no published bundle for the host, build one
from the package's sources, self-test it and install it marked "built on this host". Never
implicit: without the flag the error names it."""

from __future__ import annotations

import functools
import json

import pytest

from tests.bundles.crafting import variant
from tests.helpers import assert_user_error
from turbo_dllm.bundles.publish import publish
from turbo_dllm.kernels import merge_attention_partials
from turbo_dllm.kernels.selftest import compare_merge_attention_partials


def test_without_the_flag_the_error_names_it(cli_process, tmp_path, monkeypatch):
    monkeypatch.delenv("DLLM_BUNDLE_INDEX", raising=False)
    result = cli_process("bundle", "install", "--auto", cwd=tmp_path)
    assert_user_error(result, "no bundle index given", "--build missing")
    assert json.loads(cli_process("bundle", "list", "--json").out)["bundles"] == []


def test_no_fitting_bundle_names_the_flag(cli, cpu_bundle, tmp_path):
    from turbo_dllm.bundles.target import BundleTarget

    ours = cpu_bundle.manifest.target
    other = BundleTarget.parse(str(ours).replace(str(ours.torch), "torch9.9"))
    root = tmp_path / "other"  # a catalog with nothing for this host
    catalog_sha = publish(
        [variant(cpu_bundle, tmp_path, target=other)], release="v-o", mirror=root
    ).catalog_sha256
    result = cli(
        "bundle", "install", "--auto", "--release", "v-o", "--mirror", root,
        "--catalog-sha256", catalog_sha,
    )  # fmt: skip
    assert_user_error(result, "fits this host", "--build missing")


def test_build_missing_refuses_to_build_for_a_host_the_overrides_describe(cli, mirror, cpu_bundle):
    """On a login node resolving for GPU nodes (DLLM_OVERRIDE_GPUS, a shared DLLM_HOME),
    `--build missing` built and activated this CPU host's bundle, which those nodes cannot
    load, and the no-match error suggested it."""
    root, catalog_sha = mirror
    install = ("bundle", "install", "--auto", "--release", "v-test", "--mirror", root,
               "--catalog-sha256", catalog_sha)  # fmt: skip
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DLLM_OVERRIDE_GPUS", "sm90")
        hint = cli(*install)
        assert_user_error(hint, "fits this host", "DLLM_OVERRIDE_*")
        assert "--build missing" not in hint.err
        dry = cli(*install, "--build", "missing", "--dry-run")
        result = cli(*install, "--build", "missing")
    for refused in (dry, result):
        assert refused.code == 2 and "Traceback" not in refused.err, refused.err
        assert (
            "dllm: error: --build missing builds this host's bundle "
            f"({cpu_bundle.manifest.target}), which does not fit the host DLLM_OVERRIDE_* "
            "describe: gpus: host sm90, bundle none"
        ) in refused.err
        assert "building" not in refused.err and "would build" not in refused.out
    assert json.loads(cli("bundle", "list", "--json").out)["bundles"] == []


def test_build_missing_in_a_fresh_home_with_no_index(cli, cli_process, monkeypatch):
    monkeypatch.delenv("DLLM_BUNDLE_INDEX", raising=False)
    dry = cli("bundle", "install", "--auto", "--build", "missing", "--dry-run")
    assert dry.code == 0 and "would build" in dry.out
    result = cli_process("bundle", "install", "--auto", "--build", "missing", "--json")
    assert result.code == 0, result.err
    assert "no bundle index given" in result.err
    installed = json.loads(result.out)["installed"]
    assert installed["provenance"] == "built on this host"
    assert cli("bundle", "verify").code == 0
    listing = cli("bundle", "list")
    assert "active" in listing.out and "built on this host" in listing.out
    status = json.loads(cli("bundle", "status", "--json").out)
    assert status["fits_host"] and status["active"]["sha256"] == installed["sha256"]
    native = functools.partial(merge_attention_partials, backend="native")
    errors = compare_merge_attention_partials(native, seed=3)
    assert max(errors.values()) <= 1e-5, errors


def test_integrity_failures_never_lead_to_a_build(cli, mirror):
    """A catalog that does not match its pin is refused even with --build missing."""
    root, _ = mirror
    result = cli(
        "bundle", "install", "--auto", "--release", "v-test", "--mirror", root,
        "--catalog-sha256", "1" * 64, "--build", "missing",
    )  # fmt: skip
    assert_user_error(result, "pins")
    assert "building" not in result.err
