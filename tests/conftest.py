"""Shared fixtures: an isolated DLLM_HOME per test, an in-process CLI runner, GPU skipping."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest


def pytest_collection_modifyitems(config, items):
    if not any("gpu" in item.keywords for item in items):
        return
    from tests.cuda_state import cuda_state

    if cuda_state() == "usable":  # a present but broken GPU stops the session (UsageError)
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_collection_finish(session):
    """Start the long child processes the selected modules declared (tests/prefetch.py)."""
    if session.config.option.collectonly:
        return
    from tests import prefetch

    modules = {getattr(getattr(item, "module", None), "__name__", None) for item in session.items}
    prefetch.start(modules, session.config._tmp_path_factory.mktemp("prefetch"))


def pytest_sessionfinish(session):
    from tests import prefetch

    prefetch.stop()


# Set in os.environ by a training process (train/compile_cache.use_compile_cache) to its home's
# compile cache: a test that trains in-process must not hand its cache folders to the next test.
_PROCESS_CACHE_VARIABLES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


@pytest.fixture(scope="session", autouse=True)
def session_home(tmp_path_factory):
    """A DLLM_HOME for what runs before `isolated_home`: module-scoped fixtures (a run trained
    once per module) ran with the user's own home and wrote compile caches into it."""
    home = tmp_path_factory.mktemp("dllm-session-home")
    before = os.environ.get("DLLM_HOME")
    os.environ["DLLM_HOME"] = str(home)
    yield home
    if before is None:
        os.environ.pop("DLLM_HOME", None)
    else:
        os.environ["DLLM_HOME"] = before


@pytest.fixture(autouse=True)
def isolated_home(tmp_path_factory, monkeypatch):
    home = tmp_path_factory.mktemp("dllm-home")
    monkeypatch.setenv("DLLM_HOME", str(home))
    before = {name: os.environ.get(name) for name in _PROCESS_CACHE_VARIABLES}
    yield home
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@dataclasses.dataclass
class Result:
    code: int
    out: str
    err: str


@pytest.fixture
def cli(capsys):
    """Run `dllm ARGS...` in-process; returns Result(code, out, err)."""
    from turbo_dllm.cli import main

    def run(*args: str) -> Result:
        capsys.readouterr()
        try:
            code = main([str(a) for a in args])
        except SystemExit as exit_:  # argparse usage errors and --help/--version
            code = exit_.code if isinstance(exit_.code, int) else 1
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


@pytest.fixture
def cli_process():
    """Run `python -m turbo_dllm ARGS...` as a real subprocess."""

    def run(*args: str, cwd=None, env=None, timeout=600) -> Result:
        merged = {**os.environ, **(env or {})}
        proc = subprocess.run(
            [sys.executable, "-m", "turbo_dllm", *map(str, args)],
            cwd=cwd,
            env=merged,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        return Result(proc.returncode, proc.stdout, proc.stderr)

    return run
