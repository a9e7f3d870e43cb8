"""A run manifest written by a later turbo-dllm (a later format, or a later
`code.package_version` with fields this version does not know) is named as such, with the way
on: read it with the version that wrote it, or install that one. Before, it read as damaged:
"is not a valid run manifest: ...: Extra inputs are not permitted" with the hint "pass an
unmodified manifest.json that `dllm launch` wrote", which a user who did exactly that cannot
follow."""

from __future__ import annotations

import json

import pytest

import turbo_dllm
from tests.helpers import assert_user_error


@pytest.fixture
def recorded(cli, spec_file, workdir):
    """A manifest as a launch writes it (from its dry run; nothing trains), in a run dir."""
    result = cli("launch", "--config", spec_file, "--dry-run", "--json")
    assert result.code == 0, result.err
    run_dir = workdir / "runs" / "later"
    run_dir.mkdir(parents=True)
    return run_dir, json.loads(result.out)["manifest"]


def _write(run_dir, manifest):
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    return run_dir / "manifest.json"


@pytest.mark.parametrize("command", [("launch", "--manifest"), ("run", "show")])
def test_a_manifest_of_a_later_version_says_so(cli, recorded, command):
    run_dir, manifest = recorded
    manifest["code"]["package_version"] = "99.0"
    manifest["a_later_field"] = {"recorded": True}
    path = _write(run_dir, manifest)
    result = cli(*command, path)
    assert_user_error(
        result,
        f"{path} was written by turbo-dllm 99.0, newer than this turbo-dllm "
        f"{turbo_dllm.__version__}, which does not read it (a_later_field: ",
        "read or replay it with the turbo-dllm that wrote it",
        "python -m pip install 'turbo-dllm>=99.0'",
    )
    assert "pass an unmodified manifest.json" not in result.err

    # A later format, its version not recorded as newer: the same, without a version to name.
    manifest["code"]["package_version"] = turbo_dllm.__version__
    del manifest["a_later_field"]
    manifest["format"] = "turbo_dllm.run_manifest.v2"
    result = cli(*command, _write(run_dir, manifest))
    assert_user_error(
        result,
        f"{path} was written by a later turbo-dllm (format turbo_dllm.run_manifest.v2), newer "
        f"than this turbo-dllm {turbo_dllm.__version__}\n",
        "python -m pip install -U turbo-dllm",
    )


def test_an_edited_manifest_of_this_version_still_reads_as_edited(cli, recorded):
    run_dir, manifest = recorded
    manifest["a_later_field"] = 1
    result = cli("launch", "--manifest", _write(run_dir, manifest))
    assert_user_error(
        result,
        "is not a valid run manifest: a_later_field: ",
        "pass an unmodified manifest.json that `dllm launch` wrote into a run dir",
    )
    assert "newer" not in result.err
