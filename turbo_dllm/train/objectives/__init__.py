"""Training objectives over the block-diffusion stream; `build_objective` maps a RunSpec to one."""

from __future__ import annotations

from turbo_dllm.errors import DllmError
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


def build_objective(spec, mask_token_id: int) -> Objective:
    """The objective of `spec.objective` (an ObjectiveSpec) with a resolved mask token."""
    if spec.name == "block_diffusion":
        return BlockDiffusion(
            block_size=spec.block_size,
            mask_token_id=mask_token_id,
            eps_min=spec.eps_min,
            eps_max=spec.eps_max,
            antithetic=spec.antithetic,
            weighting=spec.loss_weighting or "inverse_t",
        )
    if spec.name == "fast_dllm_v2":
        return FastDllmV2(
            block_size=spec.block_size,
            mask_token_id=mask_token_id,
            eps=spec.eps_min,
            antithetic=spec.antithetic,
            weighting=spec.loss_weighting or "unit",
        )
    raise DllmError(
        f"objective {spec.name!r} is not available in this version",
        hint="use block_diffusion or fast_dllm_v2",
    )
