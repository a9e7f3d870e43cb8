"""A `$` in the checkout path (where the native sources are) broke `dllm bundle build` with a
compiler failure ("ninja: error: '/tmp/d/...' missing and no known rule to make it"): torch's
build.ninja escapes only spaces in source paths, and ninja read `$x` as a variable. The build
is refused first, naming the path and the character, before anything is made or compiled."""

from __future__ import annotations

import shutil

import pytest

from tests.helpers import assert_user_error
from turbo_dllm.bundles import native
from turbo_dllm.errors import DllmError


@pytest.fixture
def dollar_sources(tmp_path, monkeypatch):
    """The package's native sources, as a checkout at a path with a `$` holds them."""
    root = tmp_path / "check$out" / "native"
    shutil.copytree(native.native_root(), root)
    monkeypatch.setattr(native, "native_root", lambda: root)
    return root


def test_build_refuses_a_source_path_with_a_dollar(cli, tmp_path, dollar_sources):
    out = tmp_path / "out"
    result = cli("bundle", "build", "--out", out)
    folder = dollar_sources / "merge_attention_partials"
    assert_user_error(
        result,
        f"cannot build native op 'merge_attention_partials': the path {folder} holds '$', "
        "which torch's build.ninja does not escape",
        "hint: move the checkout to a path without '$'",
    )
    assert "ninja: error" not in result.err and "compiling" not in result.err
    assert not out.exists()


def test_compile_op_refuses_it_too(tmp_path, dollar_sources):
    """The JIT backend compiles through `compile_op`: the same refusal, not ninja's error."""
    from turbo_dllm.bundles.compile import compile_op

    op = native.load_native_op("merge_attention_partials")
    with pytest.raises(DllmError, match=r"holds '\$'"):
        compile_op(op, namespace="dollar_test", build_dir=tmp_path / "build")
    assert not (tmp_path / "build").exists()
