"""Training objectives over the block-diffusion stream, each listed in `turbo_dllm.registry`."""

from __future__ import annotations

from turbo_dllm.train.objectives.base import DiffusionBatch, NoiseKey, Objective, score
from turbo_dllm.train.objectives.block_diffusion import BlockDiffusion
from turbo_dllm.train.objectives.fast_dllm_v2 import FastDllmV2

__all__ = [
    "BlockDiffusion",
    "DiffusionBatch",
    "FastDllmV2",
    "NoiseKey",
    "Objective",
    "build_objective",
    "score",
]


def build_objective(spec, mask_token_id: int, vocab_size: int | None = None) -> Objective:
    """The objective of `spec.objective` (an ObjectiveSpec) with a resolved mask token (and the
    model's vocabulary, for objectives that draw tokens from it)."""
    from turbo_dllm.registry import get_objective

    return get_objective(spec.name).build(spec, mask_token_id, vocab_size=vocab_size)
