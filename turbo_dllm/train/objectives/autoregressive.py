"""Plain next-token cross-entropy: train or adapt a target, or an autoregressive drafter.

The model sees one token-causal view of each sequence. It runs on the block-diffusion stream
[x_0 ; x_0] with block size 1, where the clean half is exactly causal attention (a clean query
at token i sees clean keys 0..i, same document): so every parallel layout the decoder supports
(FSDP, tp/sp, the CP baseline, CSBP) trains it unchanged. Token j is scored from the clean
output at j - 1; position 0 and the first token of each packed document are never scored.
The noisy half is an exact copy of the clean one (with x_t = x_0 and B = 1 a noisy query sees
itself plus the clean prefix, the same set) and is never scored: with whole sequences on a rank
the model runs the clean half alone (`train.attention.trim.CLEAN_HALF`); under context or block
parallelism it is still computed, the price of reusing the stream there. Where block
parallelism holds a clean token on several ranks (bp > cp), one of them scores it
(`train.parallel.layout.clean_scorers`).

Unit weights, full-vocabulary softmax, normalised by the global count of scored tokens.
"""

from __future__ import annotations

import torch

from turbo_dllm.train.attention.layout import BlockDiffusionLayout
from turbo_dllm.train.objectives.base import DiffusionBatch, NoiseKey
from turbo_dllm.train.objectives.fast_dllm_v2 import shift_valid

__all__ = ["Autoregressive", "build"]


class Autoregressive:
    name = "autoregressive"

    def supervised_count(self, batch: dict[str, torch.Tensor], key: NoiseKey | None = None) -> int:
        return int(shift_valid(batch).sum())

    def corrupt(self, batch: dict[str, torch.Tensor], key: NoiseKey) -> DiffusionBatch:
        x0 = batch["input_ids"].to("cpu", torch.long)
        rows, L = x0.shape
        row, col = shift_valid(batch).nonzero(as_tuple=True)  # col = the predicted token j
        doc_ids = batch.get("doc_ids")
        return DiffusionBatch(
            input_ids=torch.cat([x0, x0], dim=1),
            doc_ids=None if doc_ids is None else doc_ids.to("cpu"),
            score_index=row * (2 * L) + L + (col - 1),  # clean output at j-1 predicts j
            targets=x0[row, col],
            weights=torch.ones(len(row), dtype=torch.float32),
            exclude_index=None,
            layout=BlockDiffusionLayout(L, 1),
        )


def build(spec, mask_token_id: int, vocab_size: int | None = None) -> Autoregressive:
    """The objective of a RunSpec's `objective` section (the registry's entry point)."""
    return Autoregressive()
