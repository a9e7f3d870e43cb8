"""torch.compile's caches live under the dllm home, per toolchain, and a user's setting wins."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.train.util import write_config
from turbo_dllm.errors import DllmError
from turbo_dllm.train import compile_cache
from turbo_dllm.train.compile_cache import (
    COMPILE_CACHE_VARIABLE,
    INDUCTOR_CACHE_VARIABLE,
    TRITON_CACHE_VARIABLE,
)

ROOT = Path(__file__).resolve().parents[2]


def _clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in (INDUCTOR_CACHE_VARIABLE, TRITON_CACHE_VARIABLE, COMPILE_CACHE_VARIABLE)
    }
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def test_defaults_point_into_the_home_and_user_settings_win(tmp_path, monkeypatch):
    # use_compile_cache sets variables in this process: give it a copy of the environment.
    monkeypatch.setattr(os, "environ", _clean_env())
    monkeypatch.setenv("DLLM_HOME", str(tmp_path / "home"))
    key = compile_cache.toolchain_key()
    assert "torch-" in key and "/" not in key and "+" not in key
    settings = compile_cache.use_compile_cache()
    folder = tmp_path / "home" / "compile-cache" / key
    assert settings == {
        INDUCTOR_CACHE_VARIABLE: str(folder / "inductor"),
        TRITON_CACHE_VARIABLE: str(folder / "triton"),
    }
    assert (folder / "inductor").is_dir() and (folder / "triton").is_dir()

    # DLLM_COMPILE_CACHE moves the root (say, to node-local scratch) ...
    monkeypatch.delenv(INDUCTOR_CACHE_VARIABLE)
    monkeypatch.delenv(TRITON_CACHE_VARIABLE)
    monkeypatch.setenv(COMPILE_CACHE_VARIABLE, str(tmp_path / "scratch"))
    moved = compile_cache.use_compile_cache()
    assert moved[INDUCTOR_CACHE_VARIABLE] == str(tmp_path / "scratch" / key / "inductor")
    # ... and the variables a user set themselves are left alone.
    monkeypatch.setenv(INDUCTOR_CACHE_VARIABLE, str(tmp_path / "mine"))
    monkeypatch.setenv(TRITON_CACHE_VARIABLE, str(tmp_path / "mine-triton"))
    assert compile_cache.use_compile_cache() == {
        INDUCTOR_CACHE_VARIABLE: str(tmp_path / "mine"),
        TRITON_CACHE_VARIABLE: str(tmp_path / "mine-triton"),
    }


def test_an_unwritable_cache_is_a_user_error(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "environ", _clean_env())
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv(COMPILE_CACHE_VARIABLE, str(tmp_path / "file"))
    with pytest.raises(DllmError, match="cannot be created") as info:
        compile_cache.use_compile_cache()
    assert COMPILE_CACHE_VARIABLE in info.value.hint


def test_cache_size_counts_files(tmp_path):
    assert compile_cache.cache_size_bytes(tmp_path / "missing") == 0
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "x").write_bytes(b"12345")
    (tmp_path / "y").write_bytes(b"123")
    assert compile_cache.cache_size_bytes(tmp_path) == 8


def test_a_compiled_run_fills_the_cache_and_the_next_run_finds_it_warm(tmp_path):
    """Two `dllm train` runs with training.compile on CPU: the first reports a cold cache and
    leaves inductor's artifacts in the home; the second reports it warm. Neither warns of a
    graph break."""
    # One layer: each layer compiles on its own (a cold layer is ~15 s of inductor's C++ builds
    # on CPU), and one holds the decoder layer's code, the code a graph break would be in.
    config = write_config(
        tmp_path / "train.yaml",
        "training.compile=true",
        "training.steps=2",
        "model.config_overrides.num_hidden_layers=1",
    )
    env = _clean_env(DLLM_HOME=str(tmp_path / "home"))
    reports = []
    for name in ("first", "second"):
        proc = subprocess.run(
            [sys.executable, "-m", "turbo_dllm", "train", "--config", str(config),
             "--run-dir", str(tmp_path / name)],
            env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        # the decoder's layers trace in one piece: no graph-break warning from the trainer
        assert "graph break" not in proc.stderr, proc.stderr[-3000:]
        reports.append([line for line in proc.stderr.splitlines() if "compile cache" in line])
    folder = tmp_path / "home" / "compile-cache"
    assert len(reports[0]) == 1 and "(cold: the first step compiles)" in reports[0][0]
    assert str(folder) in reports[0][0]
    assert len(reports[1]) == 1 and "(warm, " in reports[1][0]
    (toolchain,) = folder.iterdir()
    assert compile_cache.cache_size_bytes(toolchain / "inductor") > 0
    assert not (tmp_path / "first" / "compile-cache").exists()
