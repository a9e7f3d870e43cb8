"""Dry-run plans for the layouts the issue names, and launches that must fail before starting
(SLURM plans and scripts: test_slurm_plans.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import assert_user_error
from turbo_dllm.config.load import load_runspec
from turbo_dllm.host.view import HostView
from turbo_dllm.jobs.compiler import compile_plan
from turbo_dllm.jobs.options import LaunchOptions, NodeRange


def dry_run(cli, *args):
    result = cli("launch", "--dry-run", "--json", *args)
    assert result.code == 0, result.err
    payload = json.loads(result.out)
    assert payload["dry_run"] is True
    assert payload["manifest"]["plan"] == payload["plan"]
    return payload["plan"], payload["manifest"]


def test_one_gpu_runs_in_process(cli, spec_file, gpus, workdir):
    gpus(1)
    plan, manifest = dry_run(cli, "--config", spec_file)
    assert plan["backend"] == "local" and plan["device"] == "cuda"
    assert plan["world_sizes"] == [1] and plan["dist_backend"] is None
    assert plan["rendezvous"]["kind"] == "none"
    [command] = plan["commands"]
    # The worker reads the spec and the layout from the manifest the launcher writes.
    assert command["argv"][1:] == [
        "-m",
        "turbo_dllm.jobs.worker",
        "--manifest",
        f"{plan['run_dir']}/manifest.json",
    ]
    assert plan["layout"] == {"dp": 1, "fsdp": 1, "cp": 1, "bp": 1, "tp": 1, "sp": False, "ep": 1}
    assert manifest["host"]["gpus"][0]["arch"] == "sm90"
    assert manifest["spec"]["launch"]["run_dir"] == plan["run_dir"]
    assert not (workdir / "runs").exists()  # a dry run touches nothing


def test_eight_gpus_one_node_uses_torchrun_standalone(cli, spec_file, gpus):
    gpus(8)
    plan, _ = dry_run(cli, "--config", spec_file, "--set", "topology.fsdp=8")
    assert plan["backend"] == "torchrun" and plan["dist_backend"] == "nccl"
    assert plan["nproc_per_node"] == 8 and plan["world_sizes"] == [8]
    assert {a["name"]: a["degree"] for a in plan["mesh"]} == {
        "dp_replicate": 1,
        "dp_shard": 8,
        "clean_replica": 1,
        "cp": 1,
        "tp": 1,
    }
    assert [r["local_rank"] for r in plan["ranks"]] == list(range(8))
    [command] = plan["commands"]
    argv = command["argv"]
    assert argv[1:3] == ["-m", "torch.distributed.run"]
    assert "--standalone" in argv
    assert argv[argv.index("--nproc-per-node") + 1] == "8"
    assert argv[argv.index("-m", 3) :][:2] == ["-m", "turbo_dllm.jobs.worker"]
    assert plan["env"]["PYTHONHASHSEED"] == "0"


def test_two_nodes_by_eight_static_rendezvous(cli, spec_file, gpus, workdir):
    gpus(8)
    plan, _ = dry_run(
        cli,
        "--config",
        spec_file,
        "--set",
        "topology.fsdp=8",
        "--set",
        "topology.dp=2",
        "--nnodes",
        "2",
        "--master-addr",
        "10.1.2.3",
        "--master-port",
        "29555",
        "--node-rank",
        "1",
        "--run-dir",
        workdir / "shared" / "run1",
    )
    assert plan["world_sizes"] == [16] and plan["node_rank"] == 1
    assert plan["rendezvous"] == {
        "kind": "static",
        "endpoint": "10.1.2.3:29555",
        "run_id": None,
        "conf": None,
    }
    assert [c["where"] for c in plan["commands"]] == ["node 0", "node 1 (this node)"]
    for rank, command in enumerate(plan["commands"]):
        argv = command["argv"]
        assert argv[argv.index("--node-rank") + 1] == str(rank)
        assert argv[argv.index("--master-addr") + 1] == "10.1.2.3"
        assert argv[argv.index("--nnodes") + 1] == "2"
    ranks = plan["ranks"]
    assert len(ranks) == 16
    assert ranks[9] == {
        "rank": 9,
        "node_rank": 1,
        "local_rank": 1,
        "coords": {"dp_replicate": 1, "dp_shard": 1, "clean_replica": 0, "cp": 0, "tp": 0},
    }
    assert not (workdir / "shared").exists()


def test_elastic_one_to_four_nodes(cli, spec_file, gpus, workdir):
    gpus(8)
    plan, manifest = dry_run(
        cli,
        "--config",
        spec_file,
        "--nnodes",
        "1:4",
        "--rdzv-endpoint",
        "head:29400",
        "--max-restarts",
        "3",
        "--run-dir",
        workdir / "shared" / "elastic",
    )
    assert plan["world_sizes"] == [8, 16, 24, 32]
    assert plan["elastic_axis"] == "dp" and plan["ranks"] is None
    assert plan["rendezvous"] == {
        "kind": "c10d",
        "endpoint": "head:29400",
        "run_id": "elastic",
        "conf": None,
    }
    [command] = plan["commands"]
    assert command["where"] == "every node"
    argv = command["argv"]
    assert argv[argv.index("--nnodes") + 1] == "1:4"
    assert argv[argv.index("--max-restarts") + 1] == "3"
    assert "turbo_dllm.jobs.worker" in argv
    assert manifest["spec"]["topology"]["dp"] == 1  # the spec stays as written


def test_restarts_use_a_fresh_rendezvous_store_per_attempt(cli, spec_file, gpus, workdir):
    """torchrun's static rendezvous reuses one store across restarts (stale worker addresses):
    with --max-restarts, a master address becomes a c10d endpoint and store sharing is off."""
    gpus(8)
    plan, _ = dry_run(
        cli,
        "--config",
        spec_file,
        "--set",
        "topology.fsdp=16",
        "--nnodes",
        "2",
        "--master-addr",
        "10.1.2.3",
        "--max-restarts",
        "2",
        "--run-dir",
        workdir / "shared" / "r",
    )
    assert plan["rendezvous"] == {
        "kind": "c10d",
        "endpoint": "10.1.2.3:29500",
        "run_id": "r",
        "conf": None,
    }
    assert plan["env"]["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    assert plan["node_rank"] is None and [c["where"] for c in plan["commands"]] == ["every node"]
    single, _ = dry_run(cli, "--config", spec_file, "--max-restarts", "1")
    assert single["backend"] == "torchrun" and single["rendezvous"]["kind"] == "standalone"
    assert single["env"]["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"


def test_elastic_needs_divisible_fixed_degrees(cli, spec_file, gpus):
    gpus(8)
    result = cli(
        "launch",
        "--config",
        spec_file,
        "--dry-run",
        "--set",
        "topology.dp=3",
        "--set",
        "topology.fsdp=2",
        "--nnodes",
        "1:2",
        "--rdzv-endpoint",
        "head:29400",
        "--run-dir",
        "x",
    )
    assert_user_error(result, "elastic launch", "dp = 3", "multiple of 3")


@pytest.mark.parametrize("dry", [True, False])
def test_world_size_mismatch_fails_before_anything_starts(cli, spec_file, workdir, dry):
    result = cli(
        "launch",
        "--config",
        spec_file,
        "--nproc-per-node",
        "2",
        *(["--dry-run"] if dry else []),
    )
    assert_user_error(result, "dp*fsdp*max(cp,bp)*tp = 1", "2 process", "--set topology.dp=2")
    assert not (workdir / "runs").exists()


def test_world_size_mismatch_hint_names_changes_that_fix_it(cli, spec_file, workdir):
    """Three 1-process nodes for a 1-process topology: the hint said `--nproc-per-node 1`,
    which is what was given."""
    args = ("--config", spec_file, "--backend", "slurm", "--nproc-per-node", "1", "--dry-run")
    result = cli("launch", *args, "--nnodes", "3")
    assert_user_error(result, "e.g. --set topology.dp=3 or --nnodes 1\n")
    assert "--nproc-per-node 1" not in result.err
    result = cli("launch", *args[:-2], "2", "--dry-run", "--nnodes", "2", "--set", "topology.dp=2")
    assert_user_error(result, "e.g. --set topology.dp=4 or --nproc-per-node 1\n")


def test_a_process_count_no_dp_fits_gets_concrete_fixes(cli, spec_file, workdir):
    """3 processes for a topology of 2 (cp 2): no dp makes dp*2 = 3, and the hint read
    `--set topology.dp=N`, a literal N. It names the counts that fit instead, each pasteable."""
    cp = ("--set", "topology.cp=2")
    result = cli("launch", "--config", spec_file, *cp, "--nproc-per-node", "3", "--dry-run")
    assert_user_error(
        result,
        "e.g. --nproc-per-node 2 or --nproc-per-node 4 --set topology.dp=2 (3 is not a multiple "
        "of fsdp*max(cp,bp)*tp = 2: no dp fits it)\n",
    )
    assert "=N" not in result.err
    fixed = cli(
        "launch",
        "--config",
        spec_file,
        *cp,
        "--nproc-per-node",
        "4",
        "--set",
        "topology.dp=2",
        "--dry-run",
    )
    assert fixed.code == 0, fixed.err
    # Several nodes: the per-node counts whose total dp fits.
    args = ("--backend", "slurm", "--nproc-per-node", "1", "--nnodes", "3", "--dry-run")
    result = cli("launch", "--config", spec_file, *cp, *args)
    assert_user_error(result, "e.g. --nnodes 2 or --nproc-per-node 2 --set topology.dp=3 (3 is")


def test_doctors_world_size_check_names_concrete_fixes(spec_file):
    """dllm launch's readiness check (its plan in ctx.extras) read `--set topology.dp=N` and
    `--nproc-per-node N --nnodes M`."""
    from types import SimpleNamespace

    from turbo_dllm.doctor import DoctorContext
    from turbo_dllm.doctor.checks.launch import topology_world_size

    spec = load_runspec(spec_file, ["topology.cp=2"])
    plan = SimpleNamespace(world_size=3, nproc_per_node=3, nnodes=1, elastic_axis=None)
    result = topology_world_size(DoctorContext(spec=spec, extras={"job_plan": plan}))
    assert result.status == "fail"
    assert "`--nproc-per-node 2` or `--nproc-per-node 4 --set topology.dp=2`" in result.fix
    assert "=N" not in result.fix and " N " not in result.fix
    plan = SimpleNamespace(world_size=4, nproc_per_node=4, nnodes=1, elastic_axis=None)
    result = topology_world_size(DoctorContext(spec=spec, extras={"job_plan": plan}))
    assert "`--set topology.dp=2` or `--nproc-per-node 2`" in result.fix


@pytest.mark.parametrize("command", ["launch", "train"])
def test_a_resume_path_that_does_not_exist_is_refused_before_the_run_dir(
    cli, spec_file, workdir, command
):
    """Was: the run dir and its manifest were written, then the worker refused the path (a
    `failed` run left behind)."""
    result = cli(command, "--config", spec_file, "--set", "checkpoint.resume=old/checkpoints")
    assert_user_error(result, f"checkpoint.resume: {workdir}/old/checkpoints does not exist")
    # the fix is the path, not the data (was: "prepare the data again to match it")
    assert "hint: fix each input named above" in result.err and "prepare" not in result.err
    assert not (workdir / "runs").exists()


@pytest.mark.parametrize("command", ["launch", "train"])
@pytest.mark.parametrize("kind", ["empty folder", "run dir without checkpoints"])
def test_a_resume_path_without_a_complete_checkpoint_is_refused_before_the_run_dir(
    cli, spec_file, workdir, command, kind
):
    """Was: a path that exists but holds no complete checkpoint (an empty folder, a run dir
    whose checkpoints were removed) passed the launch (and a replay's --allow-drift); the run
    dir and manifest were written, then the worker refused it: a `failed` run left behind."""
    old = workdir / "old"
    (old / "checkpoints" if kind != "empty folder" else old).mkdir(parents=True)
    result = cli(command, "--config", spec_file, "--set", f"checkpoint.resume={old}")
    assert_user_error(result, f"checkpoint.resume: {old} holds no complete checkpoint")
    assert not (workdir / "runs").exists()


def test_the_command_lines_run_root_wins_over_the_specs_run_dir(cli, spec_file, workdir):
    """`--run-root elsewhere` with a spec that sets launch.run_dir launched into the spec's run
    dir, the flag dropped without a word (`--run-dir` already won over it)."""
    pinned = ("--config", spec_file, "--set", "launch.run_dir=runs/fixed")
    plan, _ = dry_run(cli, *pinned, "--run-root", workdir / "elsewhere")
    assert Path(plan["run_dir"]).parent == workdir / "elsewhere"
    plan, _ = dry_run(cli, *pinned)
    assert plan["run_dir"] == str(workdir / "runs" / "fixed")


def test_a_seed_past_32_bits_gives_the_workers_a_hash_seed_python_takes(cli, spec_file):
    """launch.seed may go to 2**63 - 1, but PYTHONHASHSEED=4294967296 is a fatal error at every
    worker's start ("PYTHONHASHSEED must be ... in range [0; 4294967295]"): the run failed
    before training. The workers get the seed's low 32 bits."""
    seed = (1 << 32) + 7
    plan, manifest = dry_run(
        cli, "--config", spec_file, "--backend", "torchrun", "--set", f"launch.seed={seed}"
    )
    assert plan["env"]["PYTHONHASHSEED"] == "7"
    assert manifest["seeds"] == {"launch.seed": seed, "PYTHONHASHSEED": 7}
    env = {**os.environ, "PYTHONHASHSEED": plan["env"]["PYTHONHASHSEED"]}
    assert subprocess.run([sys.executable, "-c", "pass"], env=env).returncode == 0


def test_too_few_gpus_is_not_ready(cli, spec_file, gpus, workdir):
    gpus(2)
    result = cli("launch", "--config", spec_file, "--set", "topology.fsdp=4")
    assert_user_error(
        result, "not ready to launch", "gpus: 4 processes per node but 2 visible GPU", "fix:"
    )
    assert not (workdir / "runs").exists()


def test_multi_node_needs_a_meeting_point_and_a_node_rank(cli, spec_file, gpus, workdir):
    gpus(8)
    base = ("launch", "--config", spec_file, "--set", "topology.fsdp=16", "--dry-run")
    assert_user_error(cli(*base, "--nnodes", "2"), "needs a meeting point", "--master-addr")
    assert_user_error(
        cli(*base, "--nnodes", "2", "--master-addr", "h0", "--run-dir", "r"), "--node-rank"
    )
    assert_user_error(
        cli(*base, "--nnodes", "2", "--master-addr", "h0", "--node-rank", "0"),
        "same run dir",
        "--run-dir",
    )


def test_a_static_multi_node_launch_takes_an_explicit_loopback_master_addr(cli, spec_file, workdir):
    """`--master-addr 127.0.0.1` (nodes on one host) was refused with "a multi-node launch needs
    --master-addr", the flag just given; a `--master-port` without an address still is."""
    base = ("--config", spec_file, "--set", "topology.dp=2", "--nnodes", "2")
    base += ("--nproc-per-node", "1", "--node-rank", "1", "--run-dir", workdir / "r")
    plan, _ = dry_run(cli, *base, "--master-addr", "127.0.0.1", "--master-port", "29555")
    assert plan["rendezvous"] == {
        "kind": "static",
        "endpoint": "127.0.0.1:29555",
        "run_id": None,
        "conf": None,
    }
    argv = plan["commands"][1]["argv"]
    assert argv[argv.index("--master-addr") + 1] == "127.0.0.1"
    assert argv[argv.index("--node-rank") + 1] == "1"
    result = cli("launch", "--dry-run", *base, "--master-port", "29555")
    assert_user_error(result, "a multi-node launch needs --master-addr (the host of node 0)")


@pytest.mark.parametrize(
    ("flag", "value", "needles"),
    [
        ("--rdzv-endpoint", "127.0.0.1:abc", ["--rdzv-endpoint '127.0.0.1:abc' is not HOST:PORT"]),
        ("--rdzv-endpoint", "head:", ["is not HOST:PORT"]),
        ("--rdzv-endpoint", "head:70000", ["is not HOST:PORT", "1 to 65535"]),
        ("--rdzv-endpoint", "fd00::1", ["is not HOST:PORT", "[fd00::1]:29400"]),
        ("--rdzv-conf", "last_call_timeout", ["'last_call_timeout' is not K=V"]),
        ("--rdzv-conf", "last_call_timeout=5s", ["last_call_timeout must be a whole number"]),
        ("--rdzv-conf", "join_timeout=600,,x=1", ["'' is not K=V"]),
        ("--master-addr", "h 0", ["--master-addr 'h 0' is not a host name or an IP address"]),
        ("--master-addr", "", ["is not a host name"]),
        ("--master-addr", "[fd00::1]", ["without brackets"]),
    ],
)
def test_a_bad_rendezvous_setting_is_refused_before_the_run_dir_exists(
    cli, spec_file, workdir, flag, value, needles
):
    """Was: written into the plan, the run dir made, then torchrun's ValueError traceback on
    every node (a non-numeric port: the launch's own port check's traceback first; a master
    address with a space: a failed name lookup on every node)."""
    own = ("--rdzv-endpoint", "--master-addr")
    endpoint = () if flag in own else ("--rdzv-endpoint", "127.0.0.1:29400")
    args = ("--config", spec_file, "--backend", "torchrun", *endpoint, flag, value)
    assert_user_error(cli("launch", *args, "--run-dir", "r"), *needles)
    assert not (workdir / "r").exists()


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--rdzv-endpoint", "head"),  # torchrun's port, 29400
        ("--rdzv-endpoint", "[fd00::1]:29400"),
        ("--rdzv-endpoint", "fd00::1:29400"),  # torchrun: the last `:` starts the port
        ("--rdzv-endpoint", "node-0.cluster.local:29400"),
        ("--rdzv-conf", "last_call_timeout=5, join_timeout=600,is_host=false"),
    ],
)
def test_rendezvous_settings_torchrun_reads_are_accepted(cli, spec_file, flag, value):
    endpoint = () if flag == "--rdzv-endpoint" else ("--rdzv-endpoint", "head:29400")
    two_nodes = ("--nnodes", "2", "--set", "topology.dp=2")
    plan, _ = dry_run(
        cli, "--config", spec_file, *two_nodes, *endpoint, flag, value, "--run-dir", "r"
    )
    key = "endpoint" if flag == "--rdzv-endpoint" else "conf"
    assert plan["rendezvous"][key] == value


def test_local_backend_refuses_what_it_cannot_do(cli, spec_file, workdir):
    base = ("launch", "--config", spec_file, "--dry-run", "--backend", "local")
    assert_user_error(
        cli(*base, "--set", "topology.dp=2", "--nproc-per-node", "2"), "runs one process"
    )
    assert_user_error(cli(*base, "--max-restarts", "1"), "--max-restarts needs a supervisor")


@pytest.mark.parametrize(
    ("flags", "needles"),
    [
        # SLURM options on a launch that is no SLURM job: no script, nothing asked of SLURM.
        (("--partition", "gpu", "--time", "1:00:00"), ["backend local", "--partition, --time"]),
        (("--sbatch=--exclusive",), ["has no use for --sbatch"]),
        (("--cpus-per-task", "4"), ["has no use for --cpus-per-task"]),
        (("--gpus-per-node", "0"), ["has no use for --gpus-per-node"]),
        (("--set", "topology.dp=2", "--nproc-per-node", "2", "--account", "a"), ["torchrun"]),
        # Where processes meet, for a launch whose processes do not meet like that.
        (("--backend", "local", "--master-port", "1234"), ["one process", "--master-port"]),
        (("--rdzv-id", "x"), ["local backend", "--rdzv-id"]),
        (("--backend", "slurm", "--master-addr", "h"), ["SLURM job has no use", "--master-addr"]),
        (("--backend", "slurm", "--rdzv-id", "x", "--node-rank", "0"), ["--rdzv-id, --node-rank"]),
    ],
)
def test_flags_the_backend_has_no_use_for_are_refused(cli, spec_file, workdir, flags, needles):
    """Before, these were dropped without a word: `--partition` on a torchrun launch trained
    here, `--master-addr` on a SLURM job met on the allocation's first host anyway."""
    result = cli("launch", "--config", spec_file, "--dry-run", *flags)
    assert_user_error(result, *needles)


@pytest.fixture
def pinned_code(monkeypatch):
    """This checkout's code as the launch found it: others editing it between a launch and its
    replay is code drift, which refuses the replay before what a test checks."""
    from turbo_dllm.jobs import provenance

    code = provenance.code_version()
    monkeypatch.setattr(provenance, "code_version", lambda: dict(code))


def test_submit_on_a_replay_of_a_run_that_was_no_slurm_job_is_refused(
    cli, spec_file, workdir, pinned_code
):
    """It was ignored: the replay trained here (or failed for want of sbatch)."""
    args = ("--config", spec_file, "--run-dir", "runs/a", "--set", "training.steps=1")
    result = cli("launch", *args)
    assert result.code == 0, result.err
    replay = cli("launch", "--manifest", "runs/a/manifest.json", "--submit", "--dry-run")
    assert_user_error(replay, "--submit goes with a SLURM job", "recorded with backend local")
    assert cli("launch", "--manifest", "runs/a/manifest.json", "--dry-run").code == 0


def test_replay_refusal_hints_at_the_groups_that_drifted(
    cli, spec_file, workdir, monkeypatch, pinned_code
):
    """The hint said "restore the recorded packages / data / weights / code / bundle" whatever
    drifted, and never named the host: a host-only drift (here a DLLM_OVERRIDE_* left set)."""
    args = ("--config", spec_file, "--run-dir", "runs/h", "--set", "training.steps=1")
    assert cli("launch", *args).code == 0
    monkeypatch.setenv("DLLM_OVERRIDE_TORCH", "2.5.0")
    replay = cli("launch", "--manifest", "runs/h/manifest.json", "--dry-run")
    assert_user_error(replay, "host.torch: ", "hint: restore the recorded host (", "DLLM_OVERRIDE_")
    assert "packages" not in replay.err.split("hint:")[1]


def test_a_replay_keeps_the_recorded_worker_thread_count(
    cli, spec_file, workdir, monkeypatch, pinned_code
):
    """A torchrun launch gives its workers OMP_NUM_THREADS = this host's CPUs / processes, and
    the thread count changes CPU sums' rounding: a replay on a host with other cores (or under
    another CPU affinity) took its own count, computed other numbers, and reported no drift."""
    from turbo_dllm.host import view
    from turbo_dllm.jobs import launcher

    monkeypatch.setattr(view, "_cpu_count", lambda: 8)
    options = LaunchOptions(backend="torchrun", run_dir=str(workdir / "runs" / "t"))
    launcher.materialize(launcher.prepare_launch(spec_file, [], options, ["dllm", "launch"]))
    recorded = json.loads((workdir / "runs" / "t" / "manifest.json").read_text())["plan"]
    assert recorded["env"]["OMP_NUM_THREADS"] == "8"

    monkeypatch.setattr(view, "_cpu_count", lambda: 2)
    plan, manifest = dry_run(cli, "--manifest", workdir / "runs" / "t" / "manifest.json")
    assert plan["env"] == recorded["env"]
    assert (
        "replay: OMP_NUM_THREADS=8 as recorded (this host's CPUs would give 2)" in plan["notes"][-1]
    )
    assert manifest["replay_of"]["drift"] == []
    fresh, _ = dry_run(cli, "--config", spec_file, "--backend", "torchrun")
    assert fresh["env"]["OMP_NUM_THREADS"] == "2"  # a new launch still follows this host


def test_bad_nnodes_is_a_user_error(cli, spec_file):
    assert_user_error(cli("launch", "--config", spec_file, "--nnodes", "4:2"), "node range")
    assert_user_error(cli("launch", "--config", spec_file, "--nnodes", "two"), "--nnodes")


def test_rank_coordinates_put_tensor_parallel_innermost(spec_file):
    spec = load_runspec(spec_file, ["topology.dp=2", "topology.tp=2"])
    plan = compile_plan(
        spec,
        LaunchOptions(nproc_per_node=2, nnodes=NodeRange(2, 2), master_addr="h", node_rank=0),
        HostView(gpus=("H200",) * 2, cpu_count=8),
        run_dir=spec_file.parent / "r",
    )
    # The two tp ranks of a data-parallel replica share a node (NVLink), replicas span nodes.
    coords = [(r.node_rank, r.coords["dp_replicate"], r.coords["tp"]) for r in plan.ranks]
    assert coords == [(0, 0, 0), (0, 0, 1), (1, 1, 0), (1, 1, 1)]
    assert plan.env["OMP_NUM_THREADS"] == "4"


def test_dry_run_human_output_shows_plan_and_manifest(cli, spec_file, gpus, workdir):
    gpus(8)
    result = cli("launch", "--config", spec_file, "--dry-run", "--set", "topology.fsdp=8")
    assert result.code == 0, result.err
    assert "processes    1 node(s) x 8 per node = 8 (cuda, nccl)" in result.out
    assert "mesh         dp_replicate=1 x dp_shard=8 x clean_replica=1 x cp=1 x tp=1" in result.out
    assert '"format": "turbo_dllm.run_manifest.v1"' in result.out
    assert not (workdir / "runs").exists()


def test_elastic_worker_resizes_the_planned_layout_and_refuses_misfits(spec_file, monkeypatch):
    """An elastic worker trains the plan's layout with the elastic axis resized to the live
    world size; the spec is not rewritten."""
    from turbo_dllm.errors import DllmError
    from turbo_dllm.jobs.plan import JobPlan
    from turbo_dllm.jobs.worker import layout_for_world

    spec = load_runspec(spec_file, ["topology.dp=3", "topology.fsdp=2"])
    plan = compile_plan(
        spec,
        LaunchOptions(nproc_per_node=6, nnodes=NodeRange(1, 2), rdzv_endpoint="h:29400"),
        HostView(gpus=("H200",) * 6, cpu_count=8),
        run_dir=spec_file.parent / "r",
    )
    assert isinstance(plan, JobPlan) and plan.elastic_axis == "fsdp"
    assert layout_for_world(plan, spec, 12).fsdp == 4
    assert layout_for_world(plan, spec, 12).dp == 3
    with pytest.raises(DllmError, match="world size 8: not a multiple"):
        layout_for_world(plan, spec, 8)
    assert spec.topology.fsdp == 2


def test_a_local_launch_of_an_elastic_job_says_how_many_processes_it_has(cli, spec_file, workdir):
    """It said "the local backend runs one process, but this job has 1" of a 1:2-node job."""
    base = ("launch", "--config", spec_file, "--backend", "local", "--dry-run")
    result = cli(*base, "--nnodes", "1:2", "--nproc-per-node", "1")
    assert_user_error(
        result,
        "the local backend runs one process, but this job has 1 to 2 (an elastic 1:2-node job)",
        "--backend torchrun",
    )
    result = cli(*base, "--nproc-per-node", "2", "--set", "topology.dp=2")
    assert_user_error(result, "the local backend runs one process, but this job has 2\n")


def test_a_run_manifest_given_as_config_names_manifest(cli, spec_file, workdir):
    """`dllm launch --config runs/<id>/manifest.json` (for --manifest) read it as a RunSpec:
    two dozen 'unknown key' problems and a hint to fix the fields."""
    result = cli("launch", "--config", spec_file, "--run-dir", "runs/a")
    assert result.code == 0, result.err
    manifest = workdir / "runs" / "a" / "manifest.json"
    result = cli("launch", "--config", manifest, "--dry-run")
    assert_user_error(
        result, f"{manifest} is a run manifest, not a RunSpec", f"--manifest {manifest}"
    )
    assert "unknown key" not in result.err
