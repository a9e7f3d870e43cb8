"""The trust root and the kernel sources ship inside the installed package (one source of truth:
the repository's bundles/ and native/, reached through turbo_dllm/_data links)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_ships_lock_targets_and_native_sources(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", "NOTICE"):
        shutil.copy(ROOT / name, project / name)
    for name in ("turbo_dllm", "native", "bundles", "manifests"):
        if (ROOT / name).exists():
            shutil.copytree(
                ROOT / name, project / name, symlinks=True,
                ignore=shutil.ignore_patterns("__pycache__"),
            )  # fmt: skip
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(project), "-w", str(tmp_path / "dist")],
        check=True, capture_output=True, cwd=tmp_path,
    )  # fmt: skip
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in (
        "turbo_dllm/_data/bundles/releases.lock",
        "turbo_dllm/_data/bundles/targets.toml",
        "turbo_dllm/_data/native/merge_attention_partials/op.toml",
        "turbo_dllm/_data/native/merge_attention_partials/merge_attention_partials_cuda.cu",
    ):
        assert required in names, required

    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
        check=True, capture_output=True,
    )  # fmt: skip
    code = (
        "from turbo_dllm.bundles.resources import releases_lock_path;"
        "from turbo_dllm.bundles.native import load_native_op;"
        "print(releases_lock_path()); print(load_native_op('merge_attention_partials').source_sha256())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout.split()
    assert out[0].startswith(str(site))
    from turbo_dllm.bundles.native import load_native_op

    assert out[1] == load_native_op("merge_attention_partials").source_sha256()
