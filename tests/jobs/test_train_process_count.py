"""`dllm train` of a spec whose topology needs several processes, in one process (no torchrun)
or under a torchrun of another count. Before, it read "the launch has 1 processes" and "fix the
fields above", though the fields were right: the spec needs its processes started. Now the
error names the count and the command that starts them: for the spec.yaml of a run `dllm
launch` recorded (whose launch.run_dir is that run), the torchrun line its plan records and its
replay; for another spec, `dllm launch --config F` and the torchrun line by hand."""

from __future__ import annotations

import sys

import pytest

from tests.helpers import assert_user_error
from turbo_dllm.jobs import launcher, provenance
from turbo_dllm.jobs.options import LaunchOptions


@pytest.fixture
def pinned_code(monkeypatch):
    code = provenance.code_version()  # others may edit this checkout while the test runs
    monkeypatch.setattr(provenance, "code_version", lambda: dict(code))


@pytest.fixture(autouse=True)
def one_process(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)


def test_a_two_process_runs_spec_in_one_process_names_its_torchrun_line(
    cli, spec_file, workdir, pinned_code
):
    run_dir = workdir / "runs" / "csbp"
    # A CSBP launch on 2 CPU processes (torchrun), recorded; its workers never ran.
    job = launcher.prepare_launch(
        spec_file,
        ["topology.cp=2", "topology.bp=2"],
        LaunchOptions(run_dir=str(run_dir)),
        ["dllm", "launch"],
    )
    assert job.plan.backend == "torchrun" and job.plan.nproc_per_node == 2
    launcher.materialize(job)

    # As the user ran it: the run's spec.yaml alone (its launch.run_dir is the run), and with
    # --run-dir.
    for extra in ([], ["--run-dir", run_dir]):
        result = cli("train", "--config", run_dir / "spec.yaml", *extra)
        assert_user_error(
            result,
            "needs 2 processes (dp*fsdp*max(cp,bp)*tp = 1*1*2*1 = 2); this `dllm train` is 1",
            f"{run_dir} holds run csbp, launched with torchrun, 1 node(s) x 2 process(es)",
            "continue it from its last checkpoint (under torchrun, as its plan does): ",
            f"{sys.executable} -m torch.distributed.run --standalone --nproc-per-node 2 -m "
            f"turbo_dllm train --config {run_dir}/spec.yaml --run-dir {run_dir}",
            f"dllm launch --manifest {run_dir}/manifest.json",
        )
        assert "the launch has 1 processes" not in result.err
        assert "fix the fields above" not in result.err
    assert not (run_dir / "metrics.jsonl").exists()  # refused before anything was written


def test_a_several_process_spec_names_the_launch_that_starts_them(cli, spec_file, workdir):
    result = cli("train", "--config", spec_file, "--set", "topology.dp=2")
    assert_user_error(
        result,
        f"{spec_file} needs 2 processes (dp*fsdp*max(cp,bp)*tp = 2*1*1*1 = 2); this `dllm "
        "train` is 1",
        f"start its 2 processes: dllm launch --config {spec_file} --set topology.dp=2 ",
        f"{sys.executable} -m torch.distributed.run --standalone --nproc-per-node 2 -m "
        f"turbo_dllm train --config {spec_file} --set topology.dp=2",
    )
    assert "fix the fields above" not in result.err
    assert not (workdir / "runs").exists()


def test_a_torchrun_of_another_count_is_told_so(cli, spec_file, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "3")
    result = cli("train", "--config", spec_file, "--set", "topology.dp=2")
    assert_user_error(
        result,
        "needs 2 processes (dp*fsdp*max(cp,bp)*tp = 2*1*1*1 = 2); torchrun started 3",
        "--nproc-per-node 2 -m turbo_dllm train",
    )


def test_paths_that_start_with_a_dash_paste_as_paths(cli, spec_file, workdir):
    """`--config -c.yaml --run-dir -x` in the printed commands read as options when pasted
    (found by the odd-paths audit); they are printed as ./-c.yaml and ./-x."""
    (workdir / "-c.yaml").write_text(spec_file.read_text())
    result = cli("train", "--config=-c.yaml", "--run-dir=-x", "--set", "topology.dp=2")
    assert_user_error(
        result,
        "dllm launch --config ./-c.yaml --set topology.dp=2 --run-dir ./-x ",
        "turbo_dllm train --config ./-c.yaml --set topology.dp=2 --run-dir ./-x",
    )
