"""Decisions that lead to a collective are taken by all ranks together (issue 14).

`training.max_duration_s` is measured on each rank's own clock; a rank whose clock runs ahead
must not checkpoint and stop alone while the others keep stepping (gloo times out, NCCL hangs).
"""

from __future__ import annotations

import json
import os
import time
import types

import pytest

from tests.distributed.harness import run_gloo
from tests.train.util import metrics, tiny_spec

ARGS = ("training.steps=4", "training.max_duration_s=50", "topology.dp=2")


def _skewed_clock():
    """A clock that jumps 100 s on every read: this rank thinks the time is up after step 1."""
    reads = iter(range(1_000_000))
    return lambda: time.perf_counter() + 100.0 * next(reads)


def _rank(rank: int, world: int, run_dir: str, steps_file: str) -> None:
    import turbo_dllm.train.trainer as trainer_module
    from turbo_dllm.train.entry import train

    os.environ.update(WORLD_SIZE=str(world), RANK=str(rank), LOCAL_RANK=str(rank))
    if rank == 1:
        trainer_module.time = types.SimpleNamespace(perf_counter=_skewed_clock())
    ran = []
    original = trainer_module.Trainer.queue_step

    def counted(self, step):
        ran.append(step + 1)
        return original(self, step)

    trainer_module.Trainer.queue_step = counted
    assert train(tiny_spec(*ARGS), run_dir) == 0
    with open(f"{steps_file}.{rank}", "w") as handle:
        json.dump(ran, handle)


@pytest.mark.slow
def test_a_rank_with_a_skewed_clock_stops_with_the_others(tmp_path):
    run_dir, steps = tmp_path / "run", tmp_path / "steps"
    run_gloo(_rank, 2, tmp_path, str(run_dir), str(steps), timeout_s=60)
    ran = [json.loads((tmp_path / f"steps.{rank}").read_text()) for rank in (0, 1)]
    # Rank 1's clock ran out at step 1; the vote taken then is read as step 2 is queued (no
    # rank waits for the device), so both stop after step 2, together.
    assert ran == [[1, 2], [1, 2]]
    assert [r["step"] for r in metrics(run_dir)] == [1, 2]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_00000002"]


def _terminated_rank(rank: int, world: int, run_dir: str, codes_file: str) -> None:
    """Rank 1 alone gets a real SIGTERM as its first step is queued."""
    import signal

    import turbo_dllm.train.trainer as trainer_module
    from turbo_dllm.train.entry import train

    os.environ.update(WORLD_SIZE=str(world), RANK=str(rank), LOCAL_RANK=str(rank))
    original = trainer_module.Trainer.queue_step

    def queue(self, step):
        queued = original(self, step)
        if rank == 1 and step == 0:
            os.kill(os.getpid(), signal.SIGTERM)
        return queued

    trainer_module.Trainer.queue_step = queue
    code = train(tiny_spec("training.steps=4", "topology.dp=2"), run_dir)
    with open(f"{codes_file}.{rank}", "w") as handle:
        json.dump(code, handle)


@pytest.mark.slow
def test_a_sigterm_on_one_rank_stops_every_rank_with_a_checkpoint(tmp_path):
    """SIGTERM reaching one rank is voted on like the clock: every rank saves the same step and
    ends with 143 (128 + SIGTERM), none trains on alone."""
    run_dir, codes = tmp_path / "run", tmp_path / "codes"
    run_gloo(_terminated_rank, 2, tmp_path, str(run_dir), str(codes), timeout_s=60)
    assert [json.loads((tmp_path / f"codes.{rank}").read_text()) for rank in (0, 1)] == [143, 143]
    # Noted at step 1, the vote is read as step 2 is queued: both save step 2 and stop.
    assert [r["step"] for r in metrics(run_dir)] == [1, 2]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_00000002"]
