"""The command that continues a stopped multi-node run is one command wherever it is printed
(`dllm run list --json`'s resume_command, `dllm run show`, the launch's closing line, a refused
launch's and a refused `dllm train`'s ways on: `runs.resume_command`), and it resumes the run.

Before, the launcher and `dllm train` printed their own: "continue it from its last checkpoint
(on every node, under torchrun, as its plan does): dllm train --config <run>/spec.yaml --run-dir
<run>", a bare `dllm train` that no torchrun starts and that a multi-node spec refuses on its
process count, while `dllm run show` printed the launch; and that launch kept the `--node-rank`
of the node that recorded the manifest, wrong on every other node of a static rendezvous."""

from __future__ import annotations

import json
import shlex
import socket
import textwrap

import pytest

import turbo_dllm
from tests.jobs.conftest import SMALL_SPEC
from turbo_dllm.jobs import provenance

SPEC = textwrap.dedent(SMALL_SPEC) + "checkpoint:\n  interval: 1\n"
# Stops after its first step with exit status 0, as a job out of its time slot does.
SHORT = ("--set", "training.max_duration_s=0.000001")


@pytest.fixture
def pinned(workdir, monkeypatch):
    """The code's record pinned: edits elsewhere in the working tree while the test runs are not
    drift that keeps a node from joining its run."""
    code = {"package_version": turbo_dllm.__version__, "git_commit": "c0de" * 10}
    code |= {"diff_sha256": "0" * 64, "dirty": False}
    monkeypatch.setattr(provenance, "code_version", lambda: dict(code))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _listed(cli) -> dict:
    listing = cli("run", "list", "--json")
    assert listing.code == 0, listing.err
    (run,) = json.loads(listing.out)["runs"]
    return run


@pytest.mark.slow
def test_a_stopped_multi_node_run_names_one_command_and_it_resumes(
    cli, pinned, workdir, monkeypatch
):
    spec = workdir / "train.yaml"
    spec.write_text(SPEC)
    shared = workdir / "runs" / "shared"
    # One node of an elastic 1:2 job (it starts alone after last_call_timeout), stopped by its
    # time budget after step 1 with exit status 0: rank 0 records it, the run reads `stopped`.
    node = ("--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-conf", "last_call_timeout=1")
    endpoint = ("--rdzv-endpoint", f"127.0.0.1:{_free_port()}")
    launch = cli("launch", "--config", "train.yaml", *node, *endpoint, *SHORT, "--run-dir", shared)
    assert launch.code == 0, launch.err
    run = _listed(cli)
    assert (run["status"], run["steps_done"]) == ("stopped", 1), run
    command = run["resume_command"]
    assert command.startswith(f"cd {workdir} && dllm launch --config train.yaml "), command
    where = "on every node (its launch again, whose nodes join the run and resume)"
    assert f"dllm: continue it from there with this, {where}: {command}\n" in launch.err
    assert f"\nresume       {where}: {command}\n" in cli("run", "show", "shared").out

    # A one-node launch into its run dir is refused and names the same command.
    refused = cli("launch", "--config", spec, "--run-dir", shared)
    assert refused.code == 2
    way = f"if it stopped, continue it from its last checkpoint {where}: {command}\n"
    assert way in refused.err, refused.err
    assert "dllm train" not in refused.err, refused.err

    # The command, run as printed (in-process: this test's environment), joins the run again
    # and goes on from step 2, where its time budget stops it again.
    where, launch_line = command.split(" && ")
    monkeypatch.chdir(shlex.split(where)[1])
    words = shlex.split(launch_line)
    assert words[:2] == ["dllm", "launch"], words
    resumed = cli(*words[1:])
    assert resumed.code == 0, resumed.err
    assert f"resumed from {shared / 'checkpoints' / 'step_00000001'} (step 1)" in resumed.err
    steps = [
        json.loads(line)["step"] for line in (shared / "metrics.jsonl").read_text().splitlines()
    ]
    assert steps == [1, 2], steps
    run = _listed(cli)
    assert (run["status"], run["steps_done"], run["resume_command"]) == ("stopped", 2, command)


def test_a_static_multi_node_run_names_each_nodes_rank(cli, pinned, workdir):
    """A static rendezvous (`--master-addr`, `--node-rank`): the manifest holds the launch of
    the node that recorded it; the resume command reads `--node-rank R`, each node its own, and
    `dllm train` of its spec (one process of its two) names it too."""
    from turbo_dllm.jobs import launcher
    from turbo_dllm.jobs.options import LaunchOptions, NodeRange
    from turbo_dllm.jobs.result import write_result

    spec = workdir / "train.yaml"
    spec.write_text(SPEC)
    shared = workdir / "runs" / "static"
    argv = ["dllm", "launch", "--config", "train.yaml", "--nnodes", "2", "--set", "topology.dp=2"]
    argv += ["--master-addr", "127.0.0.1", "--node-rank", "1", "--run-dir", str(shared)]
    options = LaunchOptions(
        nproc_per_node=1,
        nnodes=NodeRange(2, 2),
        master_addr="127.0.0.1",
        node_rank=1,
        run_dir=str(shared),
    )
    job = launcher.prepare_launch(spec, ["topology.dp=2"], options, argv)
    assert job.multi_node
    launcher.materialize(job)  # as the first node writes it; one step trained, then a stop
    (shared / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 5.0}) + "\n")
    write_result(shared, 0, "2026-01-01T00:00:00+00:00", "torchrun", recorded_by="rank 0")

    command = _listed(cli)["resume_command"]
    expected = argv[:-4] + ["--node-rank", "R", "--run-dir", str(shared)]
    assert command == f"cd {workdir} && {shlex.join(expected)}", command
    where = "on every node (its launch again, whose nodes join the run and resume; R: that "
    way = f"continue it from its last checkpoint {where}node's --node-rank): {command}"

    refused = cli("train", "--config", shared / "spec.yaml", "--run-dir", shared)
    assert refused.code == 2
    assert way in refused.err, refused.err
    refused = cli("launch", "--config", spec, "--run-dir", shared)
    assert refused.code == 2
    assert f"if it stopped, {way}\n" in refused.err, refused.err
