"""Mirror test fixtures, each built once per session: the project's wheel and a CPU bundle.

The project wheel is built from a copy of the source tree (so the build never writes into the
checkout) with `pip wheel --no-deps --no-build-isolation`: no network, the running setuptools.
The bundle is a real `dllm bundle build` (it compiles the C++ ops, ~15 s on 2 cores).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_SOURCE_PARTS = ("pyproject.toml", "README.md", "LICENSE", "NOTICE", "turbo_dllm", "bundles",
                 "native", "manifests")  # fmt: skip


@pytest.fixture(scope="session")
def project_wheel(tmp_path_factory) -> Path:
    source = tmp_path_factory.mktemp("project-src")
    for part in _SOURCE_PARTS:
        path = ROOT / part
        if path.is_dir():
            shutil.copytree(
                path,
                source / part,
                symlinks=True,
                ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"),
            )
        elif path.exists():
            shutil.copy2(path, source / part)
    out = tmp_path_factory.mktemp("project-wheel")
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out), str(source)],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = out.glob("turbo_dllm-*.whl")
    return wheel


@pytest.fixture(scope="session")
def cpu_bundle_archive(tmp_path_factory) -> Path:
    from turbo_dllm.bundles.build import build_bundle

    home = tmp_path_factory.mktemp("bundle-build-home")
    saved = os.environ.get("DLLM_HOME")
    os.environ["DLLM_HOME"] = str(home)
    try:
        return build_bundle(tmp_path_factory.mktemp("bundle-out")).archive
    finally:
        if saved is None:
            os.environ.pop("DLLM_HOME", None)
        else:
            os.environ["DLLM_HOME"] = saved
