"""BD3-LM block diffusion (arXiv 2503.09573), masked (absorbing-state) noise.

Per block b a noise level t_b (antithetic across the step's draws, mapped into [eps_min,
eps_max]). Log-linear schedule: alpha_t = 1 - t, so each supervised token of block b is replaced
by the mask token with probability t_b, and the NELBO weight -alpha'_t / (1 - alpha_t) is 1/t_b.
The loss scores masked noisy tokens only, with the mask token excluded from the softmax (the
SUBS parameterisation: the model never predicts "mask"), and is normalised by the number of
supervised tokens, so its expectation is the per-token NELBO.
"""

from __future__ import annotations

import torch

from turbo_dllm.train.attention.layout import BlockDiffusionLayout
from turbo_dllm.train.objectives.base import (
    DiffusionBatch,
    NoiseKey,
    block_noise_levels,
    sample_generator,
)

__all__ = ["BlockDiffusion", "build"]


class BlockDiffusion:
    name = "block_diffusion"

    def __init__(
        self,
        *,
        block_size: int,
        mask_token_id: int,
        eps_min: float = 1e-3,
        eps_max: float = 1.0,
        antithetic: bool = True,
        weighting: str = "inverse_t",
    ) -> None:
        if weighting not in ("inverse_t", "unit"):
            raise ValueError(f"unknown loss weighting {weighting!r}")
        self.block_size = block_size
        self.mask_token_id = mask_token_id
        self.eps_min, self.eps_max = eps_min, eps_max
        self.antithetic = antithetic
        self.weighting = weighting

    def supervised_count(self, batch: dict[str, torch.Tensor], key: NoiseKey | None = None) -> int:
        return int(batch["loss_mask"].sum())

    def corrupt(self, batch: dict[str, torch.Tensor], key: NoiseKey) -> DiffusionBatch:
        x0 = batch["input_ids"].to("cpu", torch.long)
        supervised = batch["loss_mask"].to("cpu", torch.bool)
        rows, L = x0.shape
        layout = BlockDiffusionLayout(L, self.block_size)
        generators = [sample_generator(key, key.first_sample + r) for r in range(rows)]
        t_block = block_noise_levels(
            key,
            rows,
            layout.num_blocks,
            eps_min=self.eps_min,
            eps_max=self.eps_max,
            antithetic=self.antithetic,
            generators=generators,
        )
        t_token = t_block.repeat_interleave(self.block_size, dim=1)  # (rows, L)
        draws = torch.stack([torch.rand(L, generator=g, dtype=torch.float64) for g in generators])
        masked = (draws < t_token) & supervised
        x_t = torch.where(masked, torch.full_like(x0, self.mask_token_id), x0)

        row, col = masked.nonzero(as_tuple=True)
        weights = 1.0 / t_token[row, col] if self.weighting == "inverse_t" else torch.ones(len(row))
        doc_ids = batch.get("doc_ids")
        return DiffusionBatch(
            input_ids=torch.cat([x_t, x0], dim=1),
            doc_ids=None if doc_ids is None else doc_ids.to("cpu"),
            score_index=row * (2 * L) + col,  # noisy half of row `row`
            targets=x0[row, col],
            weights=weights.to(torch.float32),
            exclude_index=self.mask_token_id,
            layout=layout,
        )


def build(spec, mask_token_id: int, vocab_size: int | None = None) -> BlockDiffusion:
    """The objective of a RunSpec's `objective` section (the registry's entry point)."""
    return BlockDiffusion(
        block_size=spec.block_size,
        mask_token_id=mask_token_id,
        eps_min=spec.eps_min,
        eps_max=spec.eps_max,
        antithetic=spec.antithetic,
        weighting=spec.loss_weighting or "inverse_t",
    )
