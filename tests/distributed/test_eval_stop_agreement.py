"""A stop that comes during a held-out evaluation is agreed by every rank (`Trainer.evaluate`).

`training.max_duration_s` is read between the evaluation's micro-batches on each rank's own
clock; a rank whose budget runs out there must not leave the evaluation off alone (the others
would wait in the next forward's collectives and the loss all-reduce: gloo times out, NCCL
hangs), and every rank saves the same step.
"""

from __future__ import annotations

import argparse
import json
import os
import textwrap
import time
import types

import pytest

from tests.distributed.harness import run_gloo
from tests.train.test_evaluate import _args, _artifact
from tests.train.util import metrics, tiny_spec

BUDGET = 600.0


def _rank(rank: int, world: int, run_dir: str, args: list[str], result_file: str) -> None:
    """Rank 1's clock jumps past the budget during its first evaluation forward; rank 0's
    does not run out."""
    import torch

    import turbo_dllm.train.trainer as trainer_module
    from turbo_dllm.train.entry import train

    os.environ.update(WORLD_SIZE=str(world), RANK=str(rank), LOCAL_RANK=str(rank))
    late = [0.0]
    if rank == 1:
        trainer_module.time = types.SimpleNamespace(
            perf_counter=lambda: time.perf_counter() + late[0]
        )
    forwards: list = []
    build_model = trainer_module.Trainer.build_model

    def build(self):
        build_model(self)
        forward = self.model.forward

        def counted(*a, **k):
            if not torch.is_grad_enabled():  # an evaluation's forward
                if rank == 1 and not forwards:
                    late[0] += BUDGET
                forwards.append(1)
            return forward(*a, **k)

        self.model.forward = counted

    trainer_module.Trainer.build_model = build
    code = train(tiny_spec(*args), run_dir)
    with open(f"{result_file}.{rank}", "w") as handle:
        json.dump({"code": code, "forwards": len(forwards)}, handle)


@pytest.mark.slow
def test_a_time_limit_on_one_rank_during_an_evaluation_leaves_it_off_on_every_rank(tmp_path):
    root = tmp_path / "data"
    artifacts = _artifact(root / "train", [json, argparse]), _artifact(root / "heldout", [textwrap])
    # 32 held-out sequences: 4 micro-batches of 4 on each of the 2 ranks
    args = [
        *_args(artifacts, "eval.sequences=32", "checkpoint.interval=100", "topology.dp=2"),
        f"training.max_duration_s={BUDGET}",
    ]
    run_dir, results = tmp_path / "run", tmp_path / "results"
    run_gloo(_rank, 2, tmp_path, str(run_dir), args, str(results), timeout_s=60)
    ranks = [json.loads((tmp_path / f"results.{rank}").read_text()) for rank in (0, 1)]
    # Rank 1 ran out in forward 1; its vote, taken before forward 2, is read after it (no rank
    # waits for the device to vote): both leave off after 2 of their 4 micro-batches.
    assert ranks == [{"code": 0, "forwards": 2}, {"code": 0, "forwards": 2}]
    records = metrics(run_dir)
    assert [r["step"] for r in records] == [1, 2]
    assert records[-1]["eval_left_off"] == "training.max_duration_s"
    assert not any("eval_loss" in r for r in records)
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_00000002"]
