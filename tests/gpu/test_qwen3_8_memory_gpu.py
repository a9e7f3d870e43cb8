"""qwen3_8's saved-for-backward bytes on CUDA under the trainer's real autocast (the CPU test and
benchmarks/saved_activations.py emulate it), and the mixing's rerun there changes no gradient."""

from __future__ import annotations

import pytest
import torch

from tests.train import test_qwen3_8_memory as memory

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_a_bf16_autocast_forward_keeps_less_than_transformers():
    ours, theirs = memory.saved_by_both("cuda", torch.bfloat16)
    # CPU-autocast estimate at the scaled benchmark shape: 0.36x (docs/benchmarks.md).
    assert ours < 0.5 * theirs, (ours, theirs)


def test_rerunning_the_mixing_under_autocast_changes_no_gradient(monkeypatch):
    layout = memory.BlockDiffusionLayout(128, 64)
    memory.assert_rerun_changes_nothing(monkeypatch, "cuda", torch.bfloat16, layout, torch.bfloat16)
