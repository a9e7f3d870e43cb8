"""Data parallel training with real processes (torchrun, gloo, FSDP2) against one process."""

from __future__ import annotations

import os

import pytest
import torch

from tests.train.util import losses, metrics, tiny_spec, torchrun, write_config
from turbo_dllm.train.entry import train

ARGS = ("training.steps=6", "checkpoint.interval=3", "checkpoint.keep_last=2")


@pytest.mark.slow
@pytest.mark.parametrize("axis", ["fsdp", "dp"])
def test_two_processes_match_one_and_checkpoint_reshards(tmp_path, axis):
    """Same global batch (2 ranks x 2 = 1 rank x 4): same losses; the dp=2 checkpoint then
    resumes in one process and continues the same trace."""
    single, double = tmp_path / "single", tmp_path / "double"
    train(tiny_spec(*ARGS), single)
    config = write_config(tmp_path / "train.yaml", *ARGS)
    torchrun(
        2,
        "train",
        "--config",
        str(config),
        "--run-dir",
        str(double),
        "--set",
        f"topology.{axis}=2",
        "--set",
        "training.micro_batch_size=2",
        cwd=tmp_path,
    )
    torch.testing.assert_close(losses(double), losses(single), rtol=2e-5, atol=2e-5)
    if axis == "dp":
        return
    meta = (double / "checkpoints/step_00000003/checkpoint.json").read_text()
    assert '"dp_shard": 2' in meta
    resumed = tmp_path / "resumed"
    train(
        tiny_spec(*ARGS, f"checkpoint.resume={double / 'checkpoints/step_00000003'}"),
        resumed,
    )
    assert [r["step"] for r in metrics(resumed)] == [4, 5, 6]
    torch.testing.assert_close(losses(resumed), losses(single)[3:], rtol=2e-5, atol=2e-5)


def test_init_distributed_grows_allocator_segments_unless_the_user_chose(monkeypatch):
    from turbo_dllm.train.distributed import ALLOC_CONF_VARIABLE, init_distributed

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv(ALLOC_CONF_VARIABLE, raising=False)
    init_distributed()
    assert os.environ[ALLOC_CONF_VARIABLE] == "expandable_segments:True"
    monkeypatch.setenv(ALLOC_CONF_VARIABLE, "max_split_size_mb:512")
    init_distributed()
    assert os.environ[ALLOC_CONF_VARIABLE] == "max_split_size_mb:512"
