"""A replay keeps the recorded layout; a layout flag given with the value the run recorded
changes nothing and is taken, one with another value is refused. Before, any such flag was
refused by its presence: `--max-restarts 0` on a run recorded with 0 read as a change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import assert_user_error
from turbo_dllm.jobs import provenance
from turbo_dllm.jobs.manifest import RunManifest, write_manifest


@pytest.fixture
def pinned_code(monkeypatch):
    code = provenance.code_version()  # others may edit this checkout while the test runs
    monkeypatch.setattr(provenance, "code_version", lambda: dict(code))


def record(cli, *args) -> Path:
    """A dry-run launch's manifest, written into its run dir as a launch would."""
    result = cli("launch", "--dry-run", "--json", *args)
    assert result.code == 0, result.err
    manifest = RunManifest.model_validate(json.loads(result.out)["manifest"])
    run_dir = Path(manifest.plan.run_dir)
    run_dir.mkdir(parents=True)
    return write_manifest(manifest, run_dir)


def replay(cli, path, *flags):
    return cli("launch", "--manifest", path, "--dry-run", "--json", *flags)


def test_an_explicit_max_restarts_equal_to_the_recorded_one_is_taken(
    cli, spec_file, workdir, pinned_code
):
    path = record(cli, "--config", spec_file, "--backend", "torchrun", "--run-dir", "a")
    same = replay(cli, path, "--max-restarts", "0")
    assert same.code == 0, same.err
    assert json.loads(same.out)["plan"]["max_restarts"] == 0
    other = replay(cli, path, "--max-restarts", "2")
    assert_user_error(other, "a replay runs the recorded job; --max-restarts would change it")

    restarting = record(cli, "--config", spec_file, "--max-restarts", "2", "--run-dir", "b")
    assert replay(cli, restarting, "--max-restarts", "2").code == 0
    assert_user_error(replay(cli, restarting, "--max-restarts", "0"), "--max-restarts would")


@pytest.mark.parametrize(
    ("same", "other"),
    [
        (("--backend", "torchrun"), ("--backend", "local")),
        (("--nproc-per-node", "1"), ("--nproc-per-node", "2")),
        (("--nnodes", "1"), ("--nnodes", "1:2")),
    ],
    ids=["backend", "nproc-per-node", "nnodes"],
)
def test_layout_flags_are_compared_by_value(cli, spec_file, workdir, pinned_code, same, other):
    path = record(cli, "--config", spec_file, "--backend", "torchrun", "--run-dir", "a")
    result = replay(cli, path, *same)
    assert result.code == 0, result.err
    assert_user_error(replay(cli, path, *other), f"{other[0]} would change it")
    # only the flags that differ are named
    mixed = replay(cli, path, *same, *other, "--max-restarts", "0")
    assert mixed.code != 0 and "--max-restarts" not in mixed.err.split("hint:")[0]


def test_slurm_flags_are_compared_by_value(cli, spec_file, workdir, pinned_code):
    flags = ("--time", "01:00:00", "--cpus-per-task", "2", "--sbatch=--exclusive")
    path = record(cli, "--config", spec_file, "--backend", "slurm", "--run-dir", "s", *flags)
    result = replay(cli, path, *flags)
    assert result.code == 0, result.err
    assert_user_error(replay(cli, path, "--time", "02:00:00"), "--time would change it")
    assert_user_error(replay(cli, path, "--sbatch=--hold"), "--sbatch would change it")
    assert_user_error(replay(cli, path, "--partition", "debug"), "--partition would change it")


def test_set_is_refused_on_a_replay_whatever_its_value(cli, spec_file, workdir, pinned_code):
    path = record(cli, "--config", spec_file, "--run-dir", "a")
    assert_user_error(replay(cli, path, "--set", "launch.seed=0"), "--set would change it")


def test_a_static_multi_node_replay_takes_each_node_s_rank(cli, spec_file, workdir, pinned_code):
    """Only where processes meet may change in a replay, --node-rank included: on node 1 of a
    2-node run's replay it was checked against one node ("--node-rank 1 is outside 0..0") unless
    --nnodes 2 was repeated."""
    meet = ("--master-addr", "127.0.0.1", "--master-port", "29555")
    args = ("--config", spec_file, "--set", "topology.dp=2", "--nnodes", "2", *meet)
    path = record(cli, *args, "--nproc-per-node", "1", "--node-rank", "0", "--run-dir", "mn")
    for rank in ("0", "1"):
        result = replay(cli, path, "--node-rank", rank, "--run-dir", "again")
        assert result.code == 0, result.err
        plan = json.loads(result.out)["plan"]
        assert plan["node_rank"] == int(rank) and plan["nnodes_max"] == 2
    result = replay(cli, path, "--node-rank", "2", "--run-dir", "again")
    assert_user_error(result, "--node-rank 2 is outside 0..1")


def test_a_multi_node_replay_without_a_run_dir_names_only_run_dir(
    cli, spec_file, workdir, pinned_code
):
    """A replay runs the recorded spec: the hint offered "or set launch.run_dir in the spec",
    which a replay cannot do (an edited manifest is refused)."""
    args = ("--config", spec_file, "--set", "topology.dp=2", "--nnodes", "1:2")
    path = record(
        cli, *args, "--nproc-per-node", "1", "--rdzv-endpoint", "h0:29400", "--run-dir", "e"
    )
    result = replay(cli, path)
    assert_user_error(
        result,
        "every node of a multi-node launch must write into the same run dir",
        "hint: pass --run-dir DIR on shared storage (the same on every node)\n",
    )
    assert "launch.run_dir" not in result.err
    launch = cli("launch", "--dry-run", *args, "--nproc-per-node", "1", "--rdzv-endpoint", "h0:1")
    assert_user_error(launch, "or set launch.run_dir in the spec")


def test_the_run_root_help_says_where_a_replay_goes(cli, spec_file, workdir, pinned_code):
    """`--run-root` said "(default runs)", and a replay without it goes beside the recorded
    run (docs/reproducibility.md, Replay), wherever that is."""
    text = " ".join(cli("launch", "--help").out.split())
    assert "(default runs; a replay: beside the recorded run)" in text
    path = record(cli, "--config", spec_file, "--run-dir", workdir / "elsewhere" / "a")
    result = replay(cli, path)
    assert result.code == 0, result.err
    assert Path(json.loads(result.out)["plan"]["run_dir"]).parent == workdir / "elsewhere"
