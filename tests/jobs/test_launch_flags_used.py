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
