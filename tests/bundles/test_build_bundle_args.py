"""`dllm bundle build`'s arguments are checked before anything is made or compiled: an unknown
`--op` and a Triton-only `--op` left an empty `--out` folder behind (the Triton one after packing
and, on a GPU host, testing it), and `--op X --op X` compiled X, then failed with a RecordError
traceback ("files listed twice")."""

from __future__ import annotations

import json

from tests.helpers import assert_user_error


def test_an_unknown_op_is_named_before_the_out_folder_is_made(cli, tmp_path):
    out = tmp_path / "out"
    result = cli("bundle", "build", "--out", out, "--op", "merge_attention_partials",
                 "--op", "nosuchop")  # fmt: skip
    assert_user_error(result, "unknown native op 'nosuchop'")
    assert not out.exists()


def test_triton_ops_alone_are_refused_before_anything_is_made(cli, tmp_path):
    out = tmp_path / "out"
    result = cli("bundle", "build", "--out", out, "--op", "block_diffusion_attention")
    assert_user_error(
        result, "needs at least one compiled (C++) op", "block_diffusion_attention is a Triton op"
    )
    assert "skipping" not in result.err and "packing" not in result.err
    assert not out.exists()


def test_an_op_named_twice_is_built_once(cli_process, tmp_path, build_home):
    out = tmp_path / "out"
    result = cli_process(
        "bundle", "build", "--out", out, "--op", "merge_attention_partials",
        "--op", "merge_attention_partials", "--json",
        env={"DLLM_HOME": str(build_home)},  # its build cache: a relink, not a compile
    )  # fmt: skip
    assert result.code == 0, result.err
    assert json.loads(result.out)["ops"] == ["merge_attention_partials"]


def test_a_failed_compile_is_said_once_with_one_hint(cli_process, tmp_path):
    """The op is compiled in a child process whose own error (message and hint) was wrapped
    whole: 'building native op ... failed:' twice and two `hint:` lines."""
    out = tmp_path / "out"
    result = cli_process(
        "bundle", "build", "--out", out, "--op", "merge_attention_partials",
        env={"CXX": "false", "DLLM_HOME": str(tmp_path / "home")},  # torch's compiler check fails
    )  # fmt: skip
    assert result.code == 2 and "Traceback" not in result.err, result.err
    assert "dllm: error: building native op 'merge_attention_partials' failed" in result.err
    assert result.err.count("failed") == 1, result.err
    hints = [line for line in result.err.splitlines() if line.startswith("hint:")]
    assert hints == [
        "hint: run again with --verbose for the compiler output; check that the C++ compiler "
        "(and nvcc) match torch's requirements"
    ], result.err


def test_a_build_without_torch_says_so(cli, tmp_path, monkeypatch):
    """`dllm bundle install --auto --build missing` (or `bundle build`) in a venv without torch
    ended in a ModuleNotFoundError traceback (found by the doctor audit)."""
    import sys

    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    out = tmp_path / "out"
    result = cli("bundle", "build", "--out", out)
    assert_user_error(
        result,
        "building a bundle compiles against the running torch, and this Python",
        "cannot import it",
        "hint: install torch into this environment first",
    )
    assert not out.exists()
