"""What every block-diffusion objective produces, and the noise every one of them draws from.

An objective turns a loader batch {input_ids, loss_mask, doc_ids} into a `DiffusionBatch`: the
2L model input [x_t ; x_0] (one or more rows per sequence), which noisy positions are scored, the
targets and per-token weights. The trainer runs the model once and scores through the chunked
LM-head cross-entropy; the loss is that sum divided by the GLOBAL supervised-token count (all
micro-batches of the step, all data-parallel ranks), so it does not depend on how the batch is
split.

Noise is a pure function of (seed, step, global sample index). It does not consume a running RNG,
so a resumed run draws exactly the noise the uninterrupted run drew, and a sample gets the same
noise whichever rank or micro-batch it lands in.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Protocol

import torch

from turbo_dllm.train.attention.layout import BlockDiffusionLayout, one_document_per_row
from turbo_dllm.train.losses import linear_cross_entropy

__all__ = [
    "DiffusionBatch",
    "NoiseKey",
    "Objective",
    "block_noise_levels",
    "sample_generator",
    "score",
]


@dataclass(frozen=True)
class NoiseKey:
    """Where a micro-batch sits in its optimizer step, for keyed noise draws.

    `first_sample` is the global index (within the step) of the micro-batch's first sequence;
    `samples_per_step` is the global batch (dp * micro_batch * grad_accumulation).
    """

    seed: int
    step: int
    first_sample: int
    samples_per_step: int


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """`t` on `device` without the host waiting for the device's queued work: a CPU tensor
    bound for CUDA is staged in pinned memory first (a copy from pageable memory may wait for
    the stream), then copied asynchronously."""
    device = torch.device(device)
    if device.type == "cuda" and t.device.type == "cpu":
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


def _key_seed(*parts: object) -> int:
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def sample_generator(key: NoiseKey, sample: int, purpose: str = "sample") -> torch.Generator:
    """A CPU generator private to one sequence of one step (and to one `purpose`: draws of
    different purposes never share a stream)."""
    return torch.Generator().manual_seed(_key_seed(purpose, key.seed, key.step, sample))


def block_noise_levels(
    key: NoiseKey,
    batch: int,
    num_blocks: int,
    *,
    eps_min: float,
    eps_max: float,
    antithetic: bool,
    generators: list[torch.Generator],
) -> torch.Tensor:
    """Per-block noise level t in [eps_min, eps_max], shape (batch, num_blocks), float64.

    Antithetic (stratified) sampling: one uniform u per step, then t_i = (u + i/N) mod 1 over the
    N = samples_per_step * num_blocks draws of the whole step, so every step covers [0, 1)
    evenly. Draw i of (sample s, block b) is i = b * samples_per_step + s: each sequence gets
    levels spread over the whole range rather than one narrow band.
    """
    if antithetic:
        u = torch.rand(
            (),
            generator=torch.Generator().manual_seed(_key_seed("u", key.seed, key.step)),
            dtype=torch.float64,
        )
        total = key.samples_per_step * num_blocks
        samples = key.first_sample + torch.arange(batch, dtype=torch.float64)[:, None]
        blocks = torch.arange(num_blocks, dtype=torch.float64)[None, :]
        raw = torch.remainder(u + (blocks * key.samples_per_step + samples) / total, 1.0)
    else:
        raw = torch.stack(
            [torch.rand(num_blocks, generator=g, dtype=torch.float64) for g in generators]
        )
    return eps_min + (eps_max - eps_min) * raw


@dataclass
class DiffusionBatch:
    """One micro-batch ready for the model.

    input_ids (R, 2L) rows [x_t ; x_0]; doc_ids (R, L) or None; score_index (n,) flat indices into
    the model's hidden states viewed as (R * 2L, H) (the positions whose output is scored: noisy
    for the diffusion objectives, clean for the autoregressive one, both for SFT);
    targets (n,); weights (n,) float32. exclude_index: vocabulary entry left out of the softmax.
    term_sizes: for an objective of several loss terms (each normalised by its own count), how
    many of the scored positions, in order, belong to each; `score` then sums per term.
    model_kwargs: extra model inputs of the objective (e.g. self-conditioning rows).
    """

    input_ids: torch.Tensor
    doc_ids: torch.Tensor | None
    score_index: torch.Tensor
    targets: torch.Tensor
    weights: torch.Tensor
    exclude_index: int | None
    layout: BlockDiffusionLayout
    term_sizes: tuple[int, ...] | None = None
    model_kwargs: dict[str, torch.Tensor] = field(default_factory=dict)
    # Which half of the [x_t ; x_0] stream holds every scored position: "noisy", "clean", or
    # None (both, or not that stream). Found on the host like the documents; `to` carries it.
    scored_half: str | None = None

    def __post_init__(self) -> None:
        # One document per row is no boundary at all. Found here, on the host, so the attention
        # backends take their cached one-document masks without a device sync to find out.
        docs = self.doc_ids
        if docs is not None and docs.device.type == "cpu" and one_document_per_row(docs):
            self.doc_ids = None
        if self.score_index.device.type == "cpu":
            self.scored_half = self._find_scored_half()

    def _find_scored_half(self) -> str | None:
        layout, width = self.layout, self.input_ids.shape[-1]
        if not isinstance(layout, BlockDiffusionLayout) or width != layout.stream_len:
            return None
        noisy = self.score_index % width < layout.seq_len
        if bool(noisy.all()):
            return "noisy"
        return "clean" if not bool(noisy.any()) else None

    def to(self, device: torch.device | str) -> DiffusionBatch:
        return DiffusionBatch(
            input_ids=to_device(self.input_ids, device),
            doc_ids=None if self.doc_ids is None else to_device(self.doc_ids, device),
            score_index=to_device(self.score_index, device),
            targets=to_device(self.targets, device),
            weights=to_device(self.weights, device),
            exclude_index=self.exclude_index,
            layout=self.layout,
            term_sizes=self.term_sizes,
            model_kwargs={k: to_device(v, device) for k, v in self.model_kwargs.items()},
            scored_half=self.scored_half,
        )

    @property
    def num_scored(self) -> int:
        return int(self.targets.numel())

    @property
    def stream_tokens(self) -> int:
        """Tokens the model runs over (for the FLOP count)."""
        return int(self.input_ids.numel())

    def attention_pairs(self) -> int:
        """(query, key) pairs the mask allows, over the whole micro-batch."""
        from turbo_dllm.train.attention.layout import allowed_pairs

        rows = 1 if self.doc_ids is not None else self.input_ids.shape[0]
        return allowed_pairs(self.layout, self.doc_ids) * rows


def score(
    batch: DiffusionBatch,
    hidden: torch.Tensor,
    head_weight: torch.Tensor,
    softcap: float | None = None,
) -> torch.Tensor:
    """Weighted CE summed over the scored positions (a model's `output` hook).

    `softcap`: the model's final logit soft-capping (c * tanh(z / c)), where it has one.
    """
    flat = hidden.reshape(-1, hidden.shape[-1]).index_select(0, batch.score_index)
    if batch.term_sizes is None:
        return linear_cross_entropy(
            flat,
            head_weight,
            batch.targets,
            batch.weights,
            exclude_index=batch.exclude_index,
            softcap=softcap,
        )
    sums, start = [], 0
    for size in batch.term_sizes:
        part = slice(start, start + size)
        sums.append(
            linear_cross_entropy(
                flat[part],
                head_weight,
                batch.targets[part],
                batch.weights[part],
                exclude_index=batch.exclude_index,
                softcap=softcap,
            )
        )
        start += size
    return torch.stack(sums)


class Objective(Protocol):
    name: str

    def supervised_count(self, batch: dict[str, torch.Tensor], key: NoiseKey | None = None) -> int:
        """Tokens of this loader batch the loss is normalised by (known before the forward).

        `key` is the micro-batch's noise key: an objective whose scored set is drawn (the
        DFlash anchors) counts what that draw will score; the others ignore it."""
        ...

    def corrupt(self, batch: dict[str, torch.Tensor], key: NoiseKey) -> DiffusionBatch:
        """Draw the noise and build the model input (on the CPU)."""
        ...
