"""Context parallelism (`topology.cp`) for DiffusionGemma: the stream sharded over the cp ranks.

The stream is [canvas (C) ; clean (L)] (`CanvasLayout`). Each of the two parts is split zigzag
into 2*cp equal chunks (rank r holds chunks r and 2cp-1-r of each: the noisy blocks' clean
prefixes and the clean stream's causal rows both grow along the sequence, so every rank does
about the same work); a rank's local stream is [its canvas tokens ; its clean tokens], so the
model's self-conditioning still finds the canvas first (`StreamMasks.canvas_len` is the local
canvas length). Everything but attention is per token and stays local: the embeddings, norms,
dense MLP, router and experts (an expert-parallel dispatch would run on the rank's own tokens),
the head and the loss (each rank scores only the positions it holds; the trainer sums).

Per layer the rank all-gathers the packed K+V of every rank's local stream (all-gather context
parallelism, as the CP baseline of the decoder family does it) and attends its queries over all
S keys with the family's predicate (`CanvasLayout.allowed`, the layer type's window) evaluated
on stream indices: a canvas query sees its own block and the clean prefix in its window, a
clean query the clean keys before it. Backward reduce-scatters dK/dV to their owners through
the gather's autograd node. The masks depend only on the layout: built once per layout.

Block parallelism (`topology.bp`, cp 1; `GemmaBlockParallel`): a rank owns whole canvas blocks
(dual-end pairs, so every rank's noisy blocks see about as much clean prefix) and holds the whole
clean stream, so nothing is communicated in attention (as CSBP at cp 1, where each rank holds the
clean prefix it needs); the clean stream is computed on every rank and its next-token loss
scored once, rank r taking the clean positions p with p % bp == r.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist

from turbo_dllm.errors import DllmError
from turbo_dllm.families.diffusion_gemma.attention import canvas_of
from turbo_dllm.families.diffusion_gemma.config import DiffusionGemmaConfig
from turbo_dllm.families.diffusion_gemma.model import StreamMasks
from turbo_dllm.train.attention.canvas import CanvasLayout
from turbo_dllm.train.attention.layout import one_document_per_row
from turbo_dllm.train.objectives.base import DiffusionBatch
from turbo_dllm.train.parallel.collectives import start_all_gather
from turbo_dllm.train.parallel.csbp import pack_kv, unpack_kv
from turbo_dllm.train.parallel.layout import (
    blocks_to_positions,
    dual_end_block_assignment,
    zigzag_positions,
)
from turbo_dllm.train.parallel.partial_attention import dense_attention_with_lse
from turbo_dllm.train.parallel.plan import ModelInputs, call_mask

__all__ = ["GemmaBlockParallel", "GemmaContextParallel", "GemmaCpAttention", "local_stream"]


def local_stream(layout: CanvasLayout, cp: int, rank: int) -> tuple[torch.Tensor, int]:
    """Stream indices rank `rank` holds, [canvas ; clean], and how many are canvas."""
    C, L = layout.canvas_len, layout.seq_len
    if C % (2 * cp) or L % (2 * cp):
        raise DllmError(
            f"context parallelism splits the canvas ({C} tokens) and the clean stream ({L}) "
            f"into 2*cp = {2 * cp} equal chunks",
            hint="use a block size and data.seq_len divisible by 2*cp",
        )
    canvas = zigzag_positions(C, cp, rank)
    return torch.cat([canvas, C + zigzag_positions(L, cp, rank)]), canvas.numel()


class GemmaCpAttention:
    """One layer type's attention of this rank's queries over every rank's keys (`group`: the
    ranks whose K/V are gathered, in the order of `gathered`; None: the keys are local)."""

    def __init__(
        self,
        layout: CanvasLayout,
        local: torch.Tensor,
        gathered: torch.Tensor,
        group: dist.ProcessGroup,
        backend: str,
        device: torch.device,
    ) -> None:
        self.group, self.num_local = group, local.numel()
        local, gathered = local.to(device), gathered.to(device)
        if backend == "reference":
            mask = layout.allowed(local[:, None], gathered[None, :])[None, None]
            self._attend = lambda q, k, v: dense_attention_with_lse(q, k, v, mask)[0]
        elif backend == "flex":
            from turbo_dllm.train.attention.backends import flex_kernel_options
            from turbo_dllm.train.attention.block_mask import block_mask_from_predicate
            from turbo_dllm.train.parallel.partial_attention import _flex_attention

            def mask_mod(b, h, q_idx, kv_idx):
                return layout.allowed(local[q_idx], gathered[kv_idx])

            # eager (train.attention.block_mask): the layout changes with each batch's canvas
            # start, and compiling the builder costs minutes
            block_mask = block_mask_from_predicate(
                mask_mod, local.numel(), gathered.numel(), device
            )
            flex = _flex_attention()
            self._attend = lambda q, k, v: flex(
                q,
                k,
                v,
                block_mask=block_mask,
                enable_gqa=q.shape[1] != k.shape[1],
                kernel_options=flex_kernel_options(q),
            )
        else:
            raise DllmError(
                f"diffusion_gemma's context parallelism has no {backend!r} attention",
                hint="set model.attention to reference or flex",
            )

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if q.shape[2] != self.num_local or k.shape[2] != self.num_local:
            raise ValueError(
                f"this cp rank holds {self.num_local} tokens, got q {tuple(q.shape)}, "
                f"k {tuple(k.shape)}"
            )
        if self.group is not None:
            k, v = unpack_kv(start_all_gather(pack_kv(k, v), self.group).wait())
        return self._attend(q, k, v)


class GemmaContextParallel:
    """The family's sequence plan under cp > 1 (the trainer's `build_sequence_plan` hook)."""

    attention_backend = staticmethod(call_mask)

    def __init__(self, dims: Any, backend: str, config: DiffusionGemmaConfig) -> None:
        self.cp = dims.cp
        self.context_size = dims.context
        cp_mesh = dims.get_mesh("cp")
        self.rank, self.group = cp_mesh.get_local_rank(), cp_mesh.get_group()
        self.backend = backend
        self.windows = {kind: config.window(kind) for kind in set(config.layer_types)}
        self._masks: dict[tuple, tuple[torch.Tensor, StreamMasks]] = {}

    def _layout_masks(
        self, layout: CanvasLayout, device: torch.device
    ) -> tuple[torch.Tensor, StreamMasks]:
        key = (layout, str(device))
        if key not in self._masks:
            if len(self._masks) >= 4:  # (the canvas follows the batch's response start)
                self._masks.clear()
            local, canvas = local_stream(layout, self.cp, self.rank)
            gathered = torch.cat([local_stream(layout, self.cp, r)[0] for r in range(self.cp)])
            masks = {
                kind: GemmaCpAttention(
                    layout.with_window(window), local, gathered, self.group, self.backend, device
                )
                for kind, window in self.windows.items()
            }
            self._masks[key] = (local.to(device), StreamMasks(masks=masks, canvas_len=canvas))
        return self._masks[key]

    def prepare(self, batch: DiffusionBatch, device: torch.device) -> ModelInputs:
        layout = canvas_of(batch.layout)
        local, masks = self._layout_masks(layout, device)
        return _local_inputs(batch, layout, local, None, masks, device)


class GemmaBlockParallel:
    """The family's sequence plan under bp > 1, cp 1 (see the top)."""

    attention_backend = staticmethod(call_mask)

    def __init__(self, dims: Any, backend: str, config: DiffusionGemmaConfig) -> None:
        self.bp = dims.bp
        self.context_size = dims.context
        self.rank = dims.get_mesh("context").get_local_rank()
        self.backend = backend
        self.windows = {kind: config.window(kind) for kind in set(config.layer_types)}
        self._masks: dict[tuple, tuple[torch.Tensor, torch.Tensor, StreamMasks]] = {}

    def _layout_masks(self, layout: CanvasLayout, device: torch.device):
        key = (layout, str(device))
        if key not in self._masks:
            if len(self._masks) >= 4:  # (the canvas follows the batch's response start)
                self._masks.clear()
            C, L = layout.canvas_len, layout.seq_len
            try:
                owned = dual_end_block_assignment(layout.canvas_blocks, self.bp)[self.rank]
            except ValueError:
                raise DllmError(
                    f"block parallelism gives each of the bp = {self.bp} ranks a pair of canvas "
                    f"blocks; this batch's response canvas has {layout.canvas_blocks}",
                    hint="use a smaller bp or block size, or data with longer responses",
                ) from None
            canvas = blocks_to_positions(tuple(sorted(owned)), layout.block_size)
            clean = torch.arange(L)
            local = torch.cat([canvas, C + clean])
            scores = torch.zeros(layout.stream_len, dtype=torch.bool)
            scores[canvas] = True
            scores[C + clean[clean % self.bp == self.rank]] = True  # each clean loss once
            masks = {
                kind: GemmaCpAttention(
                    layout.with_window(window), local, local, None, self.backend, device
                )
                for kind, window in self.windows.items()
            }
            self._masks[key] = (
                local.to(device),
                scores.to(device),
                StreamMasks(masks=masks, canvas_len=canvas.numel()),
            )
        return self._masks[key]

    def prepare(self, batch: DiffusionBatch, device: torch.device) -> ModelInputs:
        layout = canvas_of(batch.layout)
        local, scores, masks = self._layout_masks(layout, device)
        return _local_inputs(batch, layout, local, scores, masks, device)


def _local_inputs(
    batch: DiffusionBatch,
    layout: CanvasLayout,
    local: torch.Tensor,
    scores: torch.Tensor | None,
    masks: StreamMasks,
    device: torch.device,
) -> ModelInputs:
    """This rank's model inputs: the stream at `local`, the scored positions it holds (and, if
    given, `scores` marks as its own) renumbered into its local stream."""
    doc_ids = batch.doc_ids
    if not one_document_per_row(doc_ids):
        raise DllmError(
            "DiffusionGemma trains one example per row; the batch packs several documents",
            hint="prepare the data without packing (one prompt/response per sequence)",
        )
    S = layout.stream_len
    local_of = torch.full((S,), -1, dtype=torch.long, device=device)
    local_of[local] = torch.arange(local.numel(), device=device)
    score_index = batch.score_index.to(device)
    row, col = score_index // S, score_index % S
    at = local_of[col]
    keep = at >= 0 if scores is None else (at >= 0) & scores[col]
    # Term boundaries move with the kept positions (the native SFT has two loss terms).
    sizes = batch.term_sizes
    if sizes is not None:
        ends = torch.tensor(sizes).cumsum(0).tolist()
        kept = keep.cpu().long().cumsum(0)
        counts = [int(kept[end - 1]) if end else 0 for end in ends]
        sizes = tuple(b - a for a, b in zip([0, *counts[:-1]], counts, strict=True))
    scored = replace(
        batch,
        input_ids=batch.input_ids.to(device).index_select(1, local),
        score_index=row[keep] * local.numel() + at[keep],
        targets=batch.targets.to(device)[keep],
        weights=batch.weights.to(device)[keep],
        term_sizes=sizes,
    )
    return ModelInputs(
        input_ids=scored.input_ids,
        positions=layout.positions(device).index_select(0, local),
        mask=masks,
        batch=scored,
    )
