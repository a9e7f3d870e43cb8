"""`dllm env lock --check`: is a manifest still what pyproject.toml asks? (resolves nothing)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import assert_user_error
from turbo_dllm.envs.lock import lock_staleness
from turbo_dllm.envs.manifest import load_manifest
from turbo_dllm.envs.targets import source_root

MANIFESTS = sorted((source_root() / "manifests").glob("*.toml"))


@pytest.mark.parametrize("path", MANIFESTS, ids=[p.stem for p in MANIFESTS])
def test_every_shipped_manifest_is_current_with_pyproject(path):
    """A dependency changed in pyproject.toml without a re-lock fails here, naming the fix."""
    stale = lock_staleness(load_manifest(path))
    assert stale.fresh, (
        f"{path.name} is stale: added {stale.added}, removed {stale.removed}, "
        f"unsatisfied {stale.unsatisfied}; re-lock: dllm env lock --target {path.stem}"
    )


def _edited(tmp_path: Path, old: str, new: str) -> Path:
    text = (source_root() / "manifests" / "cpu-x86_64.toml").read_text(encoding="utf-8")
    assert old in text
    path = tmp_path / "cpu-x86_64.toml"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    return path


def test_check_of_the_shipped_cpu_manifest_passes(cli):
    result = cli("env", "lock", "--target", "cpu-x86_64", "--check")
    assert result.code == 0, result.err
    assert "cpu-x86_64.toml is current with pyproject.toml" in result.out


def test_changed_inputs_are_listed_with_the_relock_command(tmp_path, cli):
    path = _edited(tmp_path, '"transformers>=5.17",', '"transformers>=4.44",')
    result = cli("env", "lock", "--target", "cpu-x86_64", "--check", "--output", str(path))
    assert result.code == 1, result.err
    assert "  + transformers>=5.17  (asked now, not locked from)" in result.out
    assert "  - transformers>=4.44  (locked from, no longer asked)" in result.out
    # the sources, Python and torch it was locked with, as its manifest records them (the CPU
    # manifest: PyPI, no PyTorch index, torch's wheel from a local folder)
    fix = (
        "fix: dllm env lock --target cpu-x86_64 --python-version 3.11 --torch 2.13.0 "
        f"--no-torch-index --find-links /opt/wheels --output {path}"
    )
    assert fix in result.out


def test_a_pin_that_no_longer_meets_the_project_is_named(tmp_path, cli):
    text = (source_root() / "manifests" / "cpu-x86_64.toml").read_text(encoding="utf-8")
    pinned = load_manifest(source_root() / "manifests" / "cpu-x86_64.toml").pin("transformers")
    path = _edited(
        tmp_path,
        f'name = "transformers"\nversion = "{pinned.version}"',
        'name = "transformers"\nversion = "4.44.0"',
    )
    assert text != path.read_text(encoding="utf-8")
    result = cli(
        "env", "lock", "--target", "cpu-x86_64", "--check", "--output", str(path), "--json"
    )
    assert result.code == 1, result.err
    report = json.loads(result.out)
    assert report["fresh"] is False and report["added"] == [] and report["removed"] == []
    assert report["unsatisfied"] == ["transformers>=5.17 (the manifest has 4.44.0)"]
    assert report["fix"].startswith("dllm env lock --target cpu-x86_64")


def test_a_requirement_missing_from_the_pins_is_named(tmp_path):
    path = _edited(tmp_path, 'name = "pyarrow"', 'name = "pyarrow-renamed"')
    stale = lock_staleness(load_manifest(path))
    assert stale.unsatisfied == ["pyarrow>=14 (not in the manifest)"]


def test_check_errors(tmp_path, cli):
    assert_user_error(
        cli(
            "env",
            "lock",
            "--target",
            "cpu-x86_64",
            "--check",
            "--output",
            str(tmp_path / "no.toml"),
        ),
        "no manifest at",
        "hint: lock it: dllm env lock --target cpu-x86_64",
    )
    assert_user_error(
        cli(
            "env",
            "lock",
            "--target",
            "sm90",
            "--check",
            "--output",
            str(source_root() / "manifests" / "cpu-x86_64.toml"),
        ),
        "is the manifest of target cpu-x86_64, not sm90",
    )
    assert_user_error(
        cli("env", "lock", "--target", "cpu-x86_64", "--check", "--from-environment"),
        "--check compares the manifest with pyproject.toml",
    )


@pytest.mark.parametrize(
    "flags", [["--extra", "gpu"], ["--torch", "2.1"], ["--offline"]], ids=["extra", "torch", "off"]
)
def test_check_refuses_resolution_flags_it_would_ignore(cli, flags):
    """`--check --extra gpu` reported the manifest current against its own extras, as if the
    gpu extra had been checked: the flags that only shape a resolution are refused."""
    result = cli("env", "lock", "--target", "cpu-x86_64", "--check", *flags)
    assert_user_error(result, f"{flags[0]} only shape a resolution", "hint: drop them")


def test_a_missing_manifest_at_output_is_locked_there(tmp_path, cli):
    """The hint's lock writes the manifest that --check looked for, not the project's."""
    path = tmp_path / "no.toml"
    result = cli("env", "lock", "--target", "cpu-x86_64", "--check", "--output", str(path))
    assert_user_error(result, f"hint: lock it: dllm env lock --target cpu-x86_64 --output {path}")
