"""DiffusionGemma's native SFT: uniform-state noise on the response canvas, plus the encoder's
next-token loss, with self-conditioning.

Per micro-batch the canvas is the response: from the earliest supervised position of the batch
(one shared response start) to the end, padded to whole blocks of B (`CanvasLayout`). Per canvas
block a noise level t (antithetic over the step's draws, in [eps_min, eps_max]); each supervised
canvas token is replaced by a uniform random id in [0, V) with probability t. Every supervised
canvas token is a label, replaced or not (uniform-state diffusion: the model must also keep the
right tokens). Two loss terms, each normalised globally:

    decoder = sum_examples sum_blocks (sum_{tokens of the block} CE) / n_block_tokens / n_valid_blocks
              / (valid examples over the step: every micro-batch and data-parallel rank)
    encoder = sum over adjacent clean pairs (i, i+1) of each row's example (its trailing padding
              excluded) of CE(next token) / (pairs over the step)
    loss    = decoder + encoder_loss_weight * encoder

(so the token weights are 1 / (n_block_tokens * n_valid_blocks) and encoder_loss_weight, and
`supervised_count` gives the two global denominators). Self-conditioning: each example with
probability p gets a no-grad first pass whose soft embeddings condition the second
(`self_conditioning` model input). The routers are frozen (`frozen_parameters`).
"""

from __future__ import annotations

import torch

from turbo_dllm.errors import DllmError
from turbo_dllm.train.attention.canvas import CanvasLayout
from turbo_dllm.train.objectives.base import (
    DiffusionBatch,
    NoiseKey,
    block_noise_levels,
    sample_generator,
)

__all__ = ["DiffusionGemmaSft", "build", "example_ends", "response_start"]


def example_ends(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """(rows,) where each row's example ends: the end of its first segment (`doc_ids`), the
    rest of the row being padding (the loader numbers a padding run as a segment of its own).

    A row whose supervised tokens reach past its first segment holds several documents (packed
    data): refused, since a row is one example (prompt and response) here.
    """
    supervised = batch["loss_mask"].to("cpu", torch.bool)
    rows, L = supervised.shape
    docs = batch.get("doc_ids")
    if docs is None:
        return torch.full((rows,), L, dtype=torch.long)
    docs = docs.to("cpu")
    inside = docs == docs[:, :1]  # segment ids only grow along a row: a prefix
    if bool((supervised & ~inside).any()):
        row = int((supervised & ~inside).any(dim=1).nonzero()[0])
        raise DllmError(
            f"DiffusionGemma trains one example per row; a row of this batch (row {row}) packs "
            "several documents",
            hint="prepare the data with packing.block_size equal to packing.seq_len (each "
            "document then starts its own row, padded after it) and overflow: truncate",
        )
    return inside.sum(dim=1)


def response_start(loss_mask: torch.Tensor) -> int:
    """The batch's shared response start: its earliest supervised position."""
    rows = loss_mask.any(dim=1)
    if not bool(rows.any()):
        raise DllmError(
            "a diffusiongemma_sft batch has no supervised (response) token",
            hint="the data's loss_mask marks each example's response",
        )
    first = torch.where(loss_mask, torch.arange(loss_mask.shape[1]), loss_mask.shape[1])
    return int(first.min())


class DiffusionGemmaSft:
    name = "diffusiongemma_sft"
    frozen_parameters = ("router.",)  # native SFT keeps the routing of the pretrained model

    def __init__(
        self,
        *,
        block_size: int,
        vocab_size: int,
        eps_min: float = 1e-3,
        eps_max: float = 1.0,
        antithetic: bool = True,
        self_conditioning_probability: float = 0.5,
        encoder_loss_weight: float = 1.0,
    ) -> None:
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.eps_min, self.eps_max = eps_min, eps_max
        self.antithetic = antithetic
        self.p_self_conditioning = self_conditioning_probability
        self.encoder_loss_weight = encoder_loss_weight

    def supervised_count(self, batch: dict[str, torch.Tensor], key=None) -> tuple[int, int]:
        """(valid examples, encoder next-token pairs inside the examples): the two terms'
        global denominators."""
        supervised = batch["loss_mask"].to("cpu", torch.bool)
        pairs = (example_ends(batch) - 1).clamp(min=0)
        return int(supervised.any(dim=1).sum()), int(pairs.sum())

    def corrupt(self, batch: dict[str, torch.Tensor], key: NoiseKey) -> DiffusionBatch:
        x0 = batch["input_ids"].to("cpu", torch.long)
        supervised = batch["loss_mask"].to("cpu", torch.bool)
        rows, L = x0.shape
        B = self.block_size
        ends = example_ends(batch)  # a row's trailing padding is neither noised nor scored
        start = response_start(supervised)
        if L - start < B:
            raise DllmError(
                f"the response canvas ({L - start} tokens from position {start}) is shorter "
                f"than one block ({B})",
                hint="use a smaller objective.block_size or data with longer responses",
            )
        layout = CanvasLayout(L, B, start)
        C, nb = layout.canvas_len, layout.canvas_blocks
        pad = C - (L - start)
        canvas_x0 = torch.nn.functional.pad(x0[:, start:], (0, pad))
        canvas_sup = torch.nn.functional.pad(supervised[:, start:], (0, pad))
        generators = [sample_generator(key, key.first_sample + r) for r in range(rows)]
        t_block = block_noise_levels(
            key,
            rows,
            nb,
            eps_min=self.eps_min,
            eps_max=self.eps_max,
            antithetic=self.antithetic,
            generators=generators,
        )
        t_token = t_block.repeat_interleave(B, dim=1)  # (rows, C)
        draws = torch.stack([torch.rand(C, generator=g, dtype=torch.float64) for g in generators])
        noise = torch.stack([torch.randint(self.vocab_size, (C,), generator=g) for g in generators])
        chosen = (
            torch.stack([torch.rand((), generator=g, dtype=torch.float64) for g in generators])
            < self.p_self_conditioning
        )
        replaced = (draws < t_token) & canvas_sup
        x_t = torch.where(replaced, noise, canvas_x0)

        # decoder term: every supervised canvas token, 1 / (block tokens * valid blocks)
        per_block = canvas_sup.view(rows, nb, B).sum(-1)  # (rows, nb)
        valid_blocks = (per_block > 0).sum(-1).clamp(min=1)  # (rows,)
        row, col = canvas_sup.nonzero(as_tuple=True)
        dec_weight = 1.0 / (per_block[row, col // B] * valid_blocks[row]).double()
        S = C + L
        dec_index = row * S + col
        dec_target = canvas_x0[row, col]
        # encoder term: the clean stream's next token at every adjacent pair of the example
        erow, ecol = torch.meshgrid(torch.arange(rows), torch.arange(L - 1), indexing="ij")
        inside = ecol + 1 < ends[:, None]
        erow, ecol = erow[inside], ecol[inside]
        enc_index = erow * S + C + ecol
        enc_target = x0[erow, ecol + 1]
        enc_weight = torch.full((len(erow),), self.encoder_loss_weight, dtype=torch.float64)
        return DiffusionBatch(
            input_ids=torch.cat([x_t, x0], dim=1),
            doc_ids=None,  # one example per row (example_ends): no document boundary to mask
            score_index=torch.cat([dec_index, enc_index]),
            targets=torch.cat([dec_target, enc_target]),
            weights=torch.cat([dec_weight, enc_weight]).to(torch.float32),
            exclude_index=None,
            layout=layout,
            term_sizes=(len(dec_index), len(enc_index)),
            model_kwargs={"self_conditioning": chosen},
        )


def build(spec, mask_token_id: int, vocab_size: int | None = None) -> DiffusionGemmaSft:
    if vocab_size is None:
        raise DllmError("diffusiongemma_sft needs the model's vocabulary size")
    return DiffusionGemmaSft(
        block_size=spec.block_size,
        vocab_size=vocab_size,
        eps_min=spec.eps_min,
        eps_max=spec.eps_max,
        antithetic=spec.antithetic,
        self_conditioning_probability=spec.self_conditioning_probability,
        encoder_loss_weight=spec.encoder_loss_weight,
    )
