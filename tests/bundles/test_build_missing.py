"""`dllm bundle install --auto --build missing`: with no published bundle for the host, build one
from the package's sources, self-test it and install it marked "built on this host". Never
implicit: without the flag the error names it."""

from __future__ import annotations

import functools
import json

from tests.helpers import assert_user_error
from turbo_dllm.kernels import merge_attention_partials
from turbo_dllm.kernels.selftest import compare_merge_attention_partials


def test_without_the_flag_the_error_names_it(cli_process, tmp_path, monkeypatch):
    monkeypatch.delenv("DLLM_BUNDLE_INDEX", raising=False)
    result = cli_process("bundle", "install", "--auto", cwd=tmp_path)
    assert_user_error(result, "no bundle index given", "--build missing")
    assert json.loads(cli_process("bundle", "list", "--json").out)["bundles"] == []


def test_no_fitting_bundle_names_the_flag(cli, mirror, monkeypatch):
    root, catalog_sha = mirror
    monkeypatch.setenv("DLLM_OVERRIDE_PYTHON", "cp39")  # a host the catalog has nothing for
    result = cli(
        "bundle", "install", "--auto", "--release", "v-test", "--mirror", root,
        "--catalog-sha256", catalog_sha,
    )  # fmt: skip
    assert_user_error(result, "fits this host", "--build missing")


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
