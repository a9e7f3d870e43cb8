"""Launch flags that the plan dropped without a word, and `--sbatch` / `--time` values that sbatch
refuses only once the job's files were written: each is refused before anything exists."""

from __future__ import annotations

import json

import pytest

from tests.helpers import assert_user_error


def _plan(cli, *args):
    result = cli("launch", "--dry-run", "--json", *args)
    assert result.code == 0, result.err
    return json.loads(result.out)["plan"]


@pytest.mark.parametrize(
    ("flags", "kind"),
    [
        (("--nproc-per-node", "2", "--set", "topology.dp=2"), "standalone"),
        (("--nproc-per-node", "2", "--set", "topology.dp=2", "--master-addr", "h0"), "static"),
    ],
)
def test_a_rendezvous_id_without_a_c10d_rendezvous_is_refused(cli, spec_file, workdir, flags, kind):
    """torchrun's standalone and static rendezvous have no id: `--rdzv-id` left the plan."""
    result = cli("launch", "--config", spec_file, "--dry-run", *flags, "--rdzv-id", "myjob")
    assert_user_error(result, "--rdzv-id", kind, "--rdzv-endpoint")
    assert not (workdir / "runs").exists()


def test_a_rendezvous_id_names_the_c10d_rendezvous(cli, spec_file, workdir):
    plan = _plan(
        cli, "--config", spec_file, "--nproc-per-node", "2", "--set", "topology.dp=2",
        "--rdzv-endpoint", "127.0.0.1:29411", "--rdzv-id", "myjob",
    )  # fmt: skip
    argv = plan["commands"][0]["argv"]
    assert argv[argv.index("--rdzv-id") + 1] == "myjob"


def test_a_node_rank_on_a_c10d_rendezvous_is_refused(cli, spec_file, workdir):
    """c10d numbers the nodes as they join: `--node-rank 1` left the plan (node_rank None)."""
    result = cli(
        "launch", "--config", spec_file, "--dry-run", "--nnodes", "2", "--nproc-per-node", "1",
        "--set", "topology.dp=2", "--rdzv-endpoint", "h0:29400", "--node-rank", "1",
        "--run-dir", workdir / "shared",
    )  # fmt: skip
    assert_user_error(result, "--node-rank", "c10d", "drop --node-rank")


def test_a_static_run_replays_through_a_new_c10d_endpoint(cli, spec_file, workdir):
    """A replay that meets through c10d does not carry the recorded static node rank."""
    from turbo_dllm.jobs import launcher
    from turbo_dllm.jobs.options import LaunchOptions

    options = LaunchOptions(nproc_per_node=2, master_addr="127.0.0.1", run_dir=str(workdir / "a"))
    job = launcher.prepare_launch(spec_file, ["topology.dp=2"], options, ["dllm", "launch"])
    assert job.plan.rendezvous.kind == "static" and job.plan.node_rank == 0
    launcher.materialize(job)
    plan = _plan(
        cli, "--manifest", workdir / "a" / "manifest.json", "--rdzv-endpoint", "127.0.0.1:29412"
    )
    assert plan["rendezvous"]["kind"] == "c10d" and plan["node_rank"] is None


# --- sbatch options: what sbatch --test-only takes, and what is refused before any file -------

ACCEPTED = [
    ("--time", "90"),
    ("--time", "30:00"),
    ("--time", "04:00:00"),
    ("--time", "2-00"),
    ("--time", "1-12:30"),
    ("--time", "1-00:00:00"),
    ("--time", "UNLIMITED"),
    ("--sbatch=--exclusive",),
    ("--sbatch=--exclusive --comment=x",),
    ("--sbatch=-d singleton",),
    ("--sbatch=--comment='my job'",),
    ('--sbatch=--comment="a # b"',),
]


@pytest.mark.parametrize("flags", ACCEPTED)
def test_slurm_options_that_are_taken_make_a_script_sbatch_takes(
    cli, spec_file, workdir, slurm_cluster, flags
):
    run_dir = workdir / "r"
    result = cli(
        "launch", "--config", spec_file, "--backend", "slurm", "--run-dir", run_dir, *flags
    )
    assert result.code == 0, result.err
    proc = slurm_cluster.run("sbatch", "--test-only", str(run_dir / "job.sbatch"))
    assert proc.returncode == 0, proc.stderr


REFUSED = [
    # sbatch: "Invalid --time specification" / "Invalid directive found in batch script: day"
    (("--time", "1 day"), ["--time '1 day' is not a SLURM time limit", "04:00:00"]),
    (("--time", "4h"), ["is not a SLURM time limit"]),
    (("--time", "1:2:3:4"), ["is not a SLURM time limit"]),
    # sbatch: "Invalid directive found in batch script: exclusive" / "... : b"
    (("--sbatch=exclusive",), ["'exclusive' is no sbatch option", "--sbatch=--exclusive"]),
    (("--sbatch=--comment=a b",), ["'b' is no sbatch option", "quote a value"]),
    (("--sbatch=--comment='a b",), ["a quote is not closed"]),
    # sbatch takes the last of two: the job then was not the plan's (nodes, tasks, CPUs)
    (("--sbatch=--nodes=2",), ["the plan sets --nodes", "--nnodes"]),
    (("--sbatch=-N 2",), ["the plan sets -N", "--nnodes"]),
    (("--sbatch=--ntasks-per-node=2",), ["the plan sets --ntasks-per-node", "one task per node"]),
    (("--sbatch=-c4",), ["the plan sets -c", "--cpus-per-task"]),
    (("--sbatch=--time=01:00:00",), ["the plan sets --time", "use dllm launch --time"]),
    (("--sbatch=-p debug",), ["the plan sets -p", "use dllm launch --partition"]),
    (("--sbatch=--array=0-3",), ["the plan sets --array"]),
]


@pytest.mark.parametrize(("flags", "needles"), REFUSED, ids=lambda v: str(v))
def test_slurm_options_sbatch_would_refuse_or_override_are_refused_before_any_file(
    cli, spec_file, workdir, flags, needles
):
    run_dir = workdir / "r"
    result = cli(
        "launch", "--config", spec_file, "--backend", "slurm", "--run-dir", run_dir, *flags
    )
    assert_user_error(result, *needles)
    assert not run_dir.exists()


def test_what_is_refused_is_what_sbatch_refuses_or_reads_as_another_job(
    spec_file, workdir, slurm_cluster
):
    """The refusals above, checked against real sbatch: each script it refuses, or runs with
    another allocation than the plan's (two tasks on the node, or two nodes)."""
    script = workdir / "s.sbatch"

    def test_only(*lines: str):
        script.write_text("#!/bin/bash\n" + "".join(f"#SBATCH {x}\n" for x in lines) + "true\n")
        return slurm_cluster.run("sbatch", "--test-only", str(script))

    for time_limit in ("'1 day'", '"1 day"', "4h", "1:2:3:4"):
        assert test_only(f"--time={time_limit}").returncode != 0, time_limit
    for line in ("exclusive", "--comment=a b"):
        assert "Invalid directive" in test_only(line).stderr
    assert test_only("--nodes=1", "--nodes=2").returncode != 0  # one node: 2 do not exist
    two_tasks = test_only("--ntasks-per-node=1", "--cpus-per-task=1", "--ntasks-per-node=2")
    assert two_tasks.returncode == 0 and "using 2 processors" in two_tasks.stderr
