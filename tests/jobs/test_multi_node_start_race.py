"""The nodes of a multi-node launch start together and share one run dir: the first to write its
spec.yaml wins, and the others take it (the same spec) and join the job. A node that lost the
race between looking for spec.yaml and writing its own was refused ("spec.yaml already exists;
a run dir holds one job"): seen with two nodes of one replay started at the same moment."""

from __future__ import annotations

import pytest

from turbo_dllm.errors import DllmError
from turbo_dllm.jobs import launcher
from turbo_dllm.jobs.manifest import read_manifest
from turbo_dllm.jobs.options import LaunchOptions, NodeRange


def _job(spec_file, run_dir, overrides=()):
    options = LaunchOptions(
        nproc_per_node=1,
        nnodes=NodeRange(1, 2),
        rdzv_endpoint="127.0.0.1:29400",
        run_dir=str(run_dir),
    )
    job = launcher.prepare_launch(spec_file, list(overrides), options, ["dllm", "launch"])
    assert job.multi_node
    return job


def _other_node_writes_first(monkeypatch, spec_bytes=None):
    """Another node writes spec.yaml after this node looked for it, before its own write."""
    real = launcher.write_exclusive

    def racing(path, data):
        if path.name == "spec.yaml" and not path.exists():
            real(path, data if spec_bytes is None else spec_bytes)
        return real(path, data)

    monkeypatch.setattr(launcher, "write_exclusive", racing)


def test_a_node_that_loses_the_spec_race_joins_the_job(spec_file, workdir, monkeypatch):
    run_dir = workdir / "shared"
    job = _job(spec_file, run_dir)
    _other_node_writes_first(monkeypatch)
    launcher.materialize(job)
    assert read_manifest(run_dir).spec_sha256 == job.manifest.spec_sha256
    assert launcher.check_run_dir(_job(spec_file, run_dir)) is True  # the next node joins


def test_another_spec_written_by_another_node_is_named(spec_file, workdir, monkeypatch):
    run_dir = workdir / "shared"
    _other_node_writes_first(monkeypatch, spec_bytes=b"launch:\n  seed: 1\n")
    with pytest.raises(DllmError) as error:
        launcher.materialize(_job(spec_file, run_dir))
    assert f"{run_dir / 'spec.yaml'} holds another job's spec" in error.value.message
    assert not (run_dir / "manifest.json").exists()


def test_a_one_node_launch_still_refuses_a_spec_yaml_written_meanwhile(
    cli, spec_file, workdir, monkeypatch
):
    _other_node_writes_first(monkeypatch)
    result = cli("launch", "--config", spec_file, "--run-dir", workdir / "one")
    assert result.code == 2
    assert "dllm: error: " in result.err and "Traceback" not in result.err
    assert "spec.yaml already exists; a run dir holds one job" in result.err
