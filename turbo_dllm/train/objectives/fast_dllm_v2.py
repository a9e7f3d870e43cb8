"""Fast-dLLM v2 (arXiv 2509.26328): adapt an autoregressive model to block diffusion.

- Per block b a rate p_b = (1 - eps) t_b + eps (eps = objective.eps_min), one Bernoulli draw per
  supervised token gives a mask m.
- Complementary pair: every sequence appears twice, masked by m and by its complement, so each
  supervised token is masked in exactly one of the two rows (2 * batch rows per micro-batch).
- Token shift: the AR next-token head is kept, so masked token j is predicted from the output
  at position j - 1 (of the same noisy stream). Position 0, and the first token of each packed
  document, are never scored.
- Unit weights, full-vocabulary softmax; normalised by the number of scored tokens, which the
  complementary pair makes equal to the number of supervised (shift-valid) tokens.
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

__all__ = ["FastDllmV2", "build", "shift_valid"]


def shift_valid(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Tokens j that can be scored from position j-1: supervised, j >= 1, same document."""
    supervised = batch["loss_mask"].to("cpu", torch.bool)
    valid = torch.zeros_like(supervised)
    valid[:, 1:] = supervised[:, 1:]
    doc_ids = batch.get("doc_ids")
    if doc_ids is not None:
        docs = doc_ids.to("cpu")
        valid[:, 1:] &= docs[:, 1:] == docs[:, :-1]
    return valid


class FastDllmV2:
    name = "fast_dllm_v2"

    def __init__(
        self,
        *,
        block_size: int,
        mask_token_id: int,
        eps: float = 1e-3,
        antithetic: bool = True,
        weighting: str = "unit",
    ) -> None:
        if weighting not in ("inverse_t", "unit"):
            raise ValueError(f"unknown loss weighting {weighting!r}")
        self.block_size = block_size
        self.mask_token_id = mask_token_id
        self.eps = eps
        self.antithetic = antithetic
        self.weighting = weighting

    def supervised_count(self, batch: dict[str, torch.Tensor], key: NoiseKey | None = None) -> int:
        return int(shift_valid(batch).sum())

    def corrupt(self, batch: dict[str, torch.Tensor], key: NoiseKey) -> DiffusionBatch:
        x0 = batch["input_ids"].to("cpu", torch.long)
        supervised = batch["loss_mask"].to("cpu", torch.bool)
        valid = shift_valid(batch)
        rows, L = x0.shape
        layout = BlockDiffusionLayout(L, self.block_size)
        generators = [sample_generator(key, key.first_sample + r) for r in range(rows)]
        t_block = block_noise_levels(
            key,
            rows,
            layout.num_blocks,
            eps_min=0.0,
            eps_max=1.0,
            antithetic=self.antithetic,
            generators=generators,
        )
        rate = ((1.0 - self.eps) * t_block + self.eps).repeat_interleave(self.block_size, dim=1)
        draws = torch.stack([torch.rand(L, generator=g, dtype=torch.float64) for g in generators])
        first = (draws < rate) & supervised
        views = torch.cat([first, ~first & supervised])  # (2 * rows, L): m, then its complement
        x0_pair = torch.cat([x0, x0])
        x_t = torch.where(views, torch.full_like(x0_pair, self.mask_token_id), x0_pair)

        scored = torch.zeros_like(views)
        scored[:, 1:] = views[:, 1:] & torch.cat([valid, valid])[:, 1:]
        row, col = scored.nonzero(as_tuple=True)  # col = the masked token j
        if self.weighting == "inverse_t":
            weights = 1.0 / torch.cat([rate, rate])[row, col]
        else:
            weights = torch.ones(len(row), dtype=torch.float64)
        doc_ids = batch.get("doc_ids")
        return DiffusionBatch(
            input_ids=torch.cat([x_t, x0_pair], dim=1),
            doc_ids=None if doc_ids is None else torch.cat([doc_ids, doc_ids]).to("cpu"),
            score_index=row * (2 * L) + (col - 1),  # output at j-1 predicts token j
            targets=x0_pair[row, col],
            weights=weights.to(torch.float32),
            exclude_index=None,
            layout=layout,
        )


def build(spec, mask_token_id: int, vocab_size: int | None = None) -> FastDllmV2:
    """The objective of a RunSpec's `objective` section (the registry's entry point)."""
    return FastDllmV2(
        block_size=spec.block_size,
        mask_token_id=mask_token_id,
        eps=spec.eps_min,
        antithetic=spec.antithetic,
        weighting=spec.loss_weighting or "unit",
    )
