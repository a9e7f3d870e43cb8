"""Distilling a drafter from the tiny stdlib target: it learns, resumes bitwise, and two
data-parallel processes (replicated or FSDP2) train the one-process trace."""

from __future__ import annotations

import shutil

import pytest
import torch
import yaml

from tests.dflash.helpers import drafter_document, drafter_spec
from tests.train.util import losses, metrics, torchrun
from turbo_dllm.train.entry import train


@pytest.mark.parametrize("loss", ["speculators_kl", "paper_ce"])
def test_drafter_learns_and_resumes_bitwise(world, tmp_path, loss):
    args = (f"objective.dflash_loss={loss}", "training.steps=8", "checkpoint.interval=4")
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train(drafter_spec(world["target"], world["artifact"], *args), straight)
    trace = losses(straight)
    assert trace[-1] < 0.8 * trace[0], trace
    train(drafter_spec(world["target"], world["artifact"], *args), resumed)
    shutil.rmtree(resumed / "checkpoints/step_00000008")
    train(drafter_spec(world["target"], world["artifact"], *args), resumed)
    assert [r["step"] for r in metrics(resumed)] == list(range(1, 9))
    assert losses(resumed) == trace  # bitwise
    assert [r["grad_norm"] for r in metrics(resumed)] == [r["grad_norm"] for r in metrics(straight)]


@pytest.mark.slow
@pytest.mark.parametrize("axis", ["dp", "fsdp"])
def test_two_processes_train_the_one_process_trace(world, tmp_path, axis):
    args = ("training.steps=3", "checkpoint.interval=null")
    single, double = tmp_path / "single", tmp_path / "double"
    train(drafter_spec(world["target"], world["artifact"], *args), single)
    config = tmp_path / "train.yaml"
    document = drafter_document(
        world["target"],
        world["artifact"],
        *args,
        f"topology.{axis}=2",
        "training.micro_batch_size=2",
    )
    config.write_text(yaml.safe_dump(document))
    torchrun(2, "train", "--config", str(config), "--run-dir", str(double), cwd=tmp_path)
    for key in ("loss", "grad_norm"):
        torch.testing.assert_close(
            [r[key] for r in metrics(double)],
            [r[key] for r in metrics(single)],
            rtol=2e-5,
            atol=2e-5,
        )
