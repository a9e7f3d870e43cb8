"""A checkpoint save that fails on one rank stops every rank with that rank's error.

Two gloo processes save step 2, then step 4 with one part of it failing on one rank only (the
fault is patched in from each rank's own script, as in tests/train/test_checkpoint_faults.py).
Raised on that rank alone, the others went on to their next collective: gloo answered them
'Connection closed by peer' once the failing rank had left (rank 0 reported that instead of the
cause; NCCL would hang there), and a failure of rank 0's own steps after the write left the
others with a traceback. Now every rank ends with the same `dllm: error:` naming the failing
rank and what failed, no step 4 is marked complete, its temp folder is gone, and every rank
then loads step 2, the newest complete checkpoint, with the weights it had.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

# argv: store, rank, root folder, result file, scenarios as JSON [[fault, failing rank], ...]:
# each one in its own folder, the fault patched in on the failing rank only and undone after.
RANK = """
import errno, json, os, sys, types
from datetime import timedelta
import torch
import torch.distributed as dist
from turbo_dllm.errors import DllmError, print_error
from turbo_dllm.train import checkpoint
from turbo_dllm.train.checkpoint import Checkpointer, find_latest

store, rank, root, result, scenarios = sys.argv[1:]
rank = int(rank)
dist.init_process_group(
    "gloo", init_method=f"file://{store}", rank=rank, world_size=2, timeout=timedelta(seconds=20)
)
META = dict(dp_replicate=2, dp_shard=1, seed=0, objective="test", model={},
            param_dtype="float32", data_fingerprint=None, train_time_s=0.0)

def fail(code, name):
    raise OSError(code, "injected", name)

class Torch:  # torch, whose save fails for step 4's rank file
    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def save(obj, f, *args, **kwargs):
        name = f.name if hasattr(f, "write") else os.fspath(f)  # a file or a path
        if os.path.basename(name).startswith("rank_") and "step_00000004" in name:
            fail(errno.EACCES, name)
        return torch.save(obj, f, *args, **kwargs)

def patches(fault):
    from torch.distributed.checkpoint import filesystem

    real_write = filesystem.FileSystemWriter.write_data

    def write_data(self, plan, planner):
        if str(self.path).endswith("step_00000004"):
            fail(errno.EIO, str(self.path))
        return real_write(self, plan, planner)

    return {
        "rank-file": (checkpoint, "torch", Torch()),  # our own per-rank file (RNG states)
        # DCP's own write (DCP raises it on every rank)
        "dcp": (filesystem.FileSystemWriter, "write_data", write_data),
        # rank 0's steps: making the temp folder, checkpoint.json, the rename, the prune
        "prepare": (checkpoint, "_settle_asides", lambda d: fail(errno.EACCES, str(d))),
        "metadata": (checkpoint, "write_atomic", lambda p, data: fail(errno.EIO, str(p))),
        "rename": (checkpoint, "_replace", lambda new, final: fail(errno.EACCES, str(final))),
        "prune": (Checkpointer, "_prune", lambda self, saved: fail(errno.EACCES, str(self.directory))),
    }[fault]

def scenario(fault, failing):
    folder = os.path.join(root, fault)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)

    def step():
        model(torch.ones(2, 8)).square().sum().backward()
        optimizer.step()
        optimizer.zero_grad()

    saver = Checkpointer(folder, keep_last=2, rank=rank, world_size=2)

    def save(n):
        saver.save(n, model=model, optimizer=optimizer, scheduler=scheduler, loader_state={},
                   meta=META)

    step()
    save(2)
    at_step_2 = {k: v.clone() for k, v in model.state_dict().items()}
    step()
    outcome = {"folder": folder}
    owner, name, fake = patches(fault)
    real = getattr(owner, name)
    if rank == failing:
        setattr(owner, name, fake)
    try:
        save(4)
    except DllmError as error:
        print_error(error.message, error.hint)
        outcome.update(error=error.message, hint=error.hint)
    finally:
        setattr(owner, name, real)
    latest = find_latest(folder)
    outcome.update(latest=latest.name, entries=sorted(os.listdir(folder)))
    # every rank then loads the newest complete step (a collective)
    with torch.no_grad():
        for param in model.parameters():
            param.zero_()
    loader = types.SimpleNamespace(load_state_dict=lambda state: None)
    saver.load(latest, model=model, optimizer=optimizer, scheduler=scheduler, loader=loader)
    outcome["weights_of_step_2"] = all(
        torch.equal(value, at_step_2[key]) for key, value in model.state_dict().items()
    )
    return outcome

outcomes = {}
for fault, failing in json.loads(scenarios):
    outcomes[fault] = scenario(fault, failing)
    with open(result, "w") as handle:  # what is done so far, should a later one hang
        json.dump(outcomes, handle)
dist.destroy_process_group()
"""

SCENARIOS = [  # (fault, the rank it fails on)
    ("rank-file", 1),
    ("dcp", 1),
    ("prepare", 0),
    ("metadata", 0),
    ("rename", 0),
    ("prune", 0),
]
DEADLINE_S = 120  # a hang fails the tests here instead of holding the suite


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, list[tuple[dict, str]]]:
    """Every scenario's result on each rank, with that rank's stderr: one pair of processes
    runs them all (each in its own folder), to pay the start of two processes once."""
    tmp = tmp_path_factory.mktemp("agreement")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                RANK,
                str(tmp / "store"),
                str(rank),
                str(tmp / "runs"),
                str(tmp / f"rank{rank}.json"),
                json.dumps(SCENARIOS),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )  # fmt: skip
        for rank in (0, 1)
    ]
    deadline = time.monotonic() + DEADLINE_S
    found, problems = {}, []
    for rank, process in enumerate(processes):
        try:
            _, err = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            _, err = process.communicate()
            problems.append(f"rank {rank} still running after {DEADLINE_S} s")
        if process.returncode:
            problems.append(f"rank {rank} ended with {process.returncode}")
        result = tmp / f"rank{rank}.json"
        found[rank] = (json.loads(result.read_text()) if result.is_file() else {}), err
    if problems:
        pytest.fail(
            "; ".join(problems) + "".join(f"\nrank {r}: {e}" for r, (_, e) in found.items())
        )
    return {
        fault: [(found[rank][0][fault], found[rank][1]) for rank in (0, 1)]
        for fault, _ in SCENARIOS
    }


@pytest.mark.parametrize(("fault", "failing"), SCENARIOS[:-1])
def test_a_save_failing_on_one_rank_stops_every_rank_with_its_error(outcomes, fault, failing):
    for found, err in outcomes[fault]:
        final = str(Path(found["folder"]) / "step_00000004")
        message = found["error"]
        assert message == f"cannot write the checkpoint {final!r} (rank {failing} of 2): injected"
        assert found["hint"] == "fix the cause; `dllm train` then resumes from step_00000002"
        assert f"dllm: error: {message}" in err
        # no step 4 marked complete, its temp folder gone, step 2 loads with its weights
        assert found["entries"] == ["step_00000002"]
        assert found["latest"] == "step_00000002"
        assert found["weights_of_step_2"]


def test_a_prune_failing_on_rank_0_stops_every_rank_with_the_new_step_in_place(outcomes):
    for found, err in outcomes["prune"]:
        final = str(Path(found["folder"]) / "step_00000004")
        assert found["error"] == (
            f"saved the checkpoint {final!r}, but cannot remove the older ones (rank 0 of 2): "
            "injected"
        ), err
        assert found["entries"] == ["step_00000002", "step_00000004"]
        assert found["latest"] == "step_00000004"


# `dllm train` as one rank of two whose own file of step 4 cannot be written on rank 1.
TRAIN_RANK = """
import errno, os, sys
import torch
from turbo_dllm.train import checkpoint

class Torch:
    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def save(obj, f, *args, **kwargs):
        name = f.name if hasattr(f, "write") else os.fspath(f)
        if os.path.basename(name).startswith("rank_") and "step_00000004" in name:
            raise OSError(errno.EACCES, "Permission denied", name)
        return torch.save(obj, f, *args, **kwargs)

if os.environ["RANK"] == "1":
    checkpoint.torch = Torch()
from turbo_dllm.cli import main
from turbo_dllm.train.entry import end_process

end_process(main(sys.argv[1:]))  # as `python -m turbo_dllm` ends
"""

ARGS = ("training.steps=4", "checkpoint.interval=2", "checkpoint.keep_last=2")


@pytest.mark.slow
def test_dllm_train_on_two_ranks_ends_on_both_with_the_failing_ranks_error(tmp_path):
    """The whole command: both ranks print the same `dllm: error:` and end with 2 (as a save
    failing in one process does), and the run resumes from step 2."""
    import socket

    from tests.train.util import metrics, tiny_spec, write_config
    from turbo_dllm.train.entry import train

    config = write_config(tmp_path / "train.yaml", *ARGS, "topology.dp=2")
    run = tmp_path / "run"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                TRAIN_RANK,
                "train",
                "--config",
                str(config),
                "--run-dir",
                str(run),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={
                **os.environ,
                "OMP_NUM_THREADS": "1",
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
            },
        )  # fmt: skip
        for rank in (0, 1)
    ]
    deadline = time.monotonic() + DEADLINE_S
    ended = []
    for process in processes:
        try:
            _, err = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for each in processes:
                each.kill()
            pytest.fail(f"a rank was still running after {DEADLINE_S} s")
        ended.append((process.returncode, err))
    final = str(run / "checkpoints/step_00000004")
    for code, err in ended:
        assert code == 2, err
        assert err.count("dllm: error:") == 1, err
        assert (
            f"dllm: error: cannot write the checkpoint {final!r} (rank 1 of 2): Permission denied"
            "\nhint: fix the cause; `dllm train` then resumes from step_00000002"
        ) in err
        assert "Traceback" not in err
    assert sorted(os.listdir(run / "checkpoints")) == ["step_00000002"]
    assert train(tiny_spec(*ARGS), run) == 0  # one process: DCP reshards
    assert [record["step"] for record in metrics(run)][-2:] == [3, 4]
    assert sorted(os.listdir(run / "checkpoints")) == ["step_00000002", "step_00000004"]
