"""How the ranks of a context group share each training sequence: the trainer's one hook.

The model is plain (it attends with whatever backend it was given); a *sequence plan* decides
which tokens of the 2L stream [x_t ; x_0] a rank feeds it, with which RoPE positions, which
attention object the layers call, and which of the objective's scored positions are local:

    plan = build_sequence_plan(dims, attention, merge_backend=...)
    model = build_model(config, plan.attention_backend)          # every layer calls the plan
    inputs = plan.prepare(diffusion_batch, device)                # per micro-batch
    loss_sum = model(inputs.input_ids, inputs.positions, inputs.mask, output=partial(score, inputs.batch))

* `WholeSequence` (no cp/bp): the full stream, the trainer's own attention backend; with the
  model family's `trims` (`train.attention.trim`), only the rows whose outputs the loss reads.
* `ContextParallel` (cp and/or bp > 1): this rank's share (`CsbpLayout` or `CpLayout`) and a
  per-step `CsbpAttention` / `CpAttention` as the layers' mask object (with the last-layer trim,
  a `LastLayerQueries` of two).

Each rank's loss covers only the scored positions it holds, so the sum over ranks is the
single-rank loss; dividing by the global supervised-token count is left to the trainer. A clean
token held by several ranks (BP only, fused: bp > cp) is scored by one of them, its scorer
(`CsbpLayout.scored_clean`); the others' copies only serve as keys and values. Each rank's graph
computes those copies exactly as one process does, so the gradients summed over the ranks are
one process's.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Protocol

import torch

from turbo_dllm.train.attention.layout import allowed_pairs_by_stream, one_document_per_row
from turbo_dllm.train.attention.trim import CLEAN_HALF, LAST_LAYER_QUERIES, LastLayerQueries
from turbo_dllm.train.objectives.base import DiffusionBatch
from turbo_dllm.train.parallel.cp import CpAttention
from turbo_dllm.train.parallel.csbp import CsbpAttention
from turbo_dllm.train.parallel.dims import ParallelDims
from turbo_dllm.train.parallel.layout import CpLayout, CsbpLayout, zigzag_positions
from turbo_dllm.train.parallel.partial_attention import AttentionName

__all__ = [
    "ContextParallel",
    "ModelInputs",
    "SequencePlan",
    "WholeSequence",
    "build_sequence_plan",
    "call_mask",
    "model_work",
]


@dataclass
class ModelInputs:
    """What one rank feeds the model for one micro-batch; `batch` is what `score` reads."""

    input_ids: torch.Tensor  # (R, S_local)
    positions: torch.Tensor  # (S_local,)
    mask: Any
    batch: DiffusionBatch  # score_index / targets / weights restricted to this rank
    output: Any = None  # the model's output hook; None: `score` over `batch`


class SequencePlan(Protocol):
    attention_backend: Any
    context_size: int

    def prepare(self, batch: DiffusionBatch, device: torch.device) -> ModelInputs: ...


def model_work(plan: Any, batch: DiffusionBatch) -> dict[str, Any]:
    """What the model computes for a (host) batch under `plan`: the keyword arguments of the
    family config's `step_flops`. A plan that computes less than the whole stream says so
    (`work`); the others run it all."""
    if hasattr(plan, "work"):
        return plan.work(batch)
    return dict(
        stream_tokens=batch.stream_tokens,
        scored_tokens=batch.num_scored,
        pairs=batch.attention_pairs(),
    )


def _trimmed_work(batch: DiffusionBatch, trim: str | None) -> dict[str, Any]:
    """`step_flops`'s arguments for a whole (host) batch of which the model computes only what
    `trim` leaves (`train.attention.trim`)."""
    work: dict[str, Any] = dict(stream_tokens=batch.stream_tokens, scored_tokens=batch.num_scored)
    if trim is None:
        work["pairs"] = batch.attention_pairs()
        return work
    # the counts sum over the rows of documents; without, one row counts for each
    rows = 1 if batch.doc_ids is not None else batch.input_ids.shape[0]
    noisy, clean = (rows * n for n in allowed_pairs_by_stream(batch.layout, batch.doc_ids))
    if trim == CLEAN_HALF:
        work["stream_tokens"] //= 2
        work["pairs"] = clean
    else:  # LAST_LAYER_QUERIES
        work["pairs"] = noisy + clean
        work["last_layer"] = (batch.stream_tokens // 2, noisy)
    return work


def _last_layer_trim(batch: DiffusionBatch, trims: frozenset[str]) -> bool:
    """Whether the model's last layer may compute the noisy rows alone: every scored position
    is noisy, no extra rows ride along, and the family's model takes the trim."""
    return LAST_LAYER_QUERIES in trims and batch.scored_half == "noisy" and not batch.model_kwargs


def call_mask(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any) -> torch.Tensor:
    """The layers' backend under context parallelism: the per-step mask object attends."""
    return mask(q, k, v)


class WholeSequence:
    """Every rank holds whole sequences (data parallelism only).

    `trims`: the work the model family may skip (`train.attention.trim`); a batch takes the one
    its scored positions allow, and the scored indices are renumbered for the rows computed."""

    context_size = 1

    def __init__(self, attention: Any, trims: frozenset[str] = frozenset()) -> None:
        self.attention_backend = attention
        self.trims = trims

    def trim(self, batch: DiffusionBatch) -> str | None:
        """The trim this batch takes, or None: the whole stream in every layer."""
        if batch.model_kwargs:  # an objective's extra rows (self-conditioning) ride along
            return None
        if batch.scored_half == "clean" and CLEAN_HALF in self.trims:
            return CLEAN_HALF
        return LAST_LAYER_QUERIES if _last_layer_trim(batch, self.trims) else None

    def work(self, batch: DiffusionBatch) -> dict[str, Any]:
        """`model_work` for this plan: the stream and mask pairs the trimmed model computes."""
        return _trimmed_work(batch, self.trim(batch))

    def prepare(self, batch: DiffusionBatch, device: torch.device) -> ModelInputs:
        layout, backend, trim = batch.layout, self.attention_backend, self.trim(batch)
        positions = layout.positions(device)
        if trim is None:
            mask = backend.prepare(layout, batch.doc_ids, device)
            return ModelInputs(batch.input_ids, positions, mask, batch)
        L, S = layout.seq_len, layout.stream_len
        row, col = batch.score_index // S, batch.score_index % S
        if trim == CLEAN_HALF:
            clean = range(L, S)
            mask = backend.prepare(layout, batch.doc_ids, device, queries=clean, keys=clean)
            kept = replace(batch, input_ids=batch.input_ids[:, L:], score_index=row * L + col - L)
            return ModelInputs(kept.input_ids, positions[L:], mask, kept)
        every = backend.prepare(layout, batch.doc_ids, device)
        last = backend.prepare(layout, batch.doc_ids, device, queries=range(L))
        kept = replace(batch, score_index=row * L + col)
        return ModelInputs(batch.input_ids, positions, LastLayerQueries(every, last, L), kept)


class ContextParallel:
    """CSBP (bp > 1) or the CP baseline (cp > 1, bp == 1) over the context group of `dims`.

    `trims` (`train.attention.trim`): with `LAST_LAYER_QUERIES`, a batch scored on noisy
    positions only has the model's last layer attend from the rank's noisy tokens alone (they
    come first in its local order). With `CLEAN_HALF`, a batch scored on clean positions only
    (the autoregressive objective) leaves the noisy stream out: the clean stream alone is
    sharded zigzag over the whole context group and attended as the CP baseline does
    (`CpAttention(clean_only=True)`), each clean token on one rank, which scores it. Half the
    work, and no clean prefix recomputed (CSBP with cp < bp) or replicated."""

    attention_backend = staticmethod(call_mask)

    def __init__(
        self,
        dims: ParallelDims,
        *,
        backend: AttentionName = "reference",
        merge_backend: str = "reference",
        kernels: str = "native",
        trims: frozenset[str] = frozenset(),
    ) -> None:
        if dims.mode == "none":
            raise ValueError("ContextParallel needs cp > 1 or bp > 1")
        self.dims = dims
        self.backend = backend
        self.merge_backend = merge_backend
        self.kernels = kernels  # where `turbo` takes its kernels from (native or jit)
        self.trims = trims
        self.context_size = dims.context
        self.ctx_rank = dims.get_mesh("context").get_local_rank()
        cp_mesh = dims.get_optional_mesh("cp")
        self.cp_group = cp_mesh.get_group() if cp_mesh is not None else None
        self.context_group = dims.get_mesh("context").get_group() if self.context_size > 1 else None
        # keyed by (seq_len, block_size, device), plus CLEAN_HALF for the clean stream alone
        self._layouts: dict[tuple, CsbpLayout | CpLayout] = {}
        self._static: dict[tuple, Any] = {}  # by (that key, the last-layer trim)
        self._indices: dict[tuple, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def layout(self, seq_len: int, block_size: int, device=None) -> CsbpLayout | CpLayout:
        """This rank's share of a (seq_len, block_size) sequence, its tensors on `device`.

        Built and moved once per shape: a copy from pageable host memory in every micro-batch
        may make the host wait for the device's queued work."""
        key = (seq_len, block_size, str(device))
        if key not in self._layouts:
            dims = self.dims
            if dims.mode == "csbp":
                layout = CsbpLayout.build(seq_len, block_size, dims.bp, dims.cp, self.ctx_rank)
            else:
                layout = CpLayout.build(seq_len, block_size, dims.cp, self.ctx_rank)
            moved = {
                field.name: value.to(device)
                for field in fields(layout)
                if isinstance(value := getattr(layout, field.name), torch.Tensor)
            }
            self._layouts[key] = replace(layout, **moved) if device is not None else layout
        return self._layouts[key]

    def _attention(
        self, layout: CsbpLayout | CpLayout, doc_ids: torch.Tensor, noisy_queries: bool = False
    ) -> Any:
        if isinstance(layout, CsbpLayout):
            return CsbpAttention(
                layout,
                doc_ids,
                self.cp_group,
                backend=self.backend,
                merge_backend=self.merge_backend,
                kernels=self.kernels,
                noisy_queries=noisy_queries,
            )
        return CpAttention(
            layout,
            doc_ids,
            self.cp_group,
            backend=self.backend,
            kernels=self.kernels,
            noisy_queries=noisy_queries,
        )

    def _masks(self, layout: CsbpLayout | CpLayout, doc_ids: torch.Tensor, trim: bool) -> Any:
        """The layers' mask object: one attention for every layer, or (`trim`) a
        `LastLayerQueries` whose last layer attends from the noisy tokens alone."""
        every = self._attention(layout, doc_ids)
        if not trim:
            return every
        queries = int(layout.noisy_positions.numel())  # the rank's noisy tokens come first
        return LastLayerQueries(every, self._attention(layout, doc_ids, True), queries)

    def clean_half(self, batch: DiffusionBatch) -> bool:
        """Whether this batch runs the clean stream alone (`CLEAN_HALF`): every scored position
        is clean, no extra rows ride along, and the stream splits into 2 x context chunks."""
        return (
            CLEAN_HALF in self.trims
            and batch.scored_half == "clean"
            and not batch.model_kwargs
            and batch.layout.seq_len % (2 * self.context_size) == 0
        )

    def work(self, batch: DiffusionBatch) -> dict[str, Any]:
        """`model_work` for the whole batch (each rank of a context group counts it all)."""
        if self.clean_half(batch):
            return _trimmed_work(batch, CLEAN_HALF)
        trim = LAST_LAYER_QUERIES if _last_layer_trim(batch, self.trims) else None
        return _trimmed_work(batch, trim)

    def _clean_layout(self, seq_len: int, block_size: int, device) -> CpLayout:
        """This rank's clean chunks when the clean stream alone is sharded over the context
        group (zigzag, like the CP baseline's; chunks need not be whole blocks: the attention
        reads each token's block from its position)."""
        key = (seq_len, block_size, str(device), CLEAN_HALF)
        if key not in self._layouts:
            world = self.context_size
            self._layouts[key] = CpLayout(
                seq_len=seq_len,
                block_size=block_size,
                cp=world,
                rank=self.ctx_rank,
                positions=zigzag_positions(seq_len, world, self.ctx_rank).to(device),
                gathered_positions=torch.cat(
                    [zigzag_positions(seq_len, world, r) for r in range(world)]
                ).to(device),
            )
        return self._layouts[key]

    def _indices_of(self, layout: CsbpLayout | CpLayout, seq_len: int, clean_half: bool):
        """(this rank's indices into the stream [x_t ; x_0], their RoPE positions, each stream
        position's local row where this rank scores it, else -1)."""
        if clean_half:  # the clean chunks alone; each clean token sits on one rank, its scorer
            held = layout.positions
            local_of = torch.full((2 * seq_len,), -1, dtype=torch.long, device=held.device)
            local_of[seq_len + held] = torch.arange(held.numel(), device=held.device)
            return seq_len + held, held, local_of
        noisy, clean = layout.noisy_positions, layout.clean_positions
        stream_index = torch.cat([noisy, seq_len + clean])
        # the noisy tokens it holds, and the clean ones it is the scorer of (a clean token held
        # by several ranks, bp > cp, counts once)
        local = torch.arange(stream_index.numel(), device=stream_index.device)
        scores = torch.cat([torch.ones_like(noisy, dtype=torch.bool), layout.scored_clean])
        local_of = torch.full((2 * seq_len,), -1, dtype=torch.long, device=local.device)
        local_of[stream_index[scores]] = local[scores]
        return stream_index, torch.cat([noisy, clean]), local_of

    def prepare(self, batch: DiffusionBatch, device: torch.device) -> ModelInputs:
        seq_len, block_size = batch.layout.seq_len, batch.layout.block_size
        clean_half = self.clean_half(batch)
        if clean_half:
            layout = self._clean_layout(seq_len, block_size, device)
            key: tuple = (seq_len, block_size, str(device), CLEAN_HALF)
        else:
            layout = self.layout(seq_len, block_size, device)
            key = (seq_len, block_size, str(device))
        if key not in self._indices:
            self._indices[key] = self._indices_of(layout, seq_len, clean_half)
        stream_index, positions, local_of = self._indices[key]
        doc_ids = batch.doc_ids
        trim = not clean_half and _last_layer_trim(batch, self.trims)
        one_document = one_document_per_row(doc_ids)
        if one_document and (key, trim) in self._static:
            mask: Any = self._static[(key, trim)]  # same layout, no documents: reuse the masks
        else:
            if one_document:  # a broadcast row of zeros: the masks hold for every batch
                doc_ids = torch.zeros(1, seq_len, dtype=torch.long, device=device)
            if clean_half:  # every layer attends over the context group's clean chunks
                mask = CpAttention(
                    layout,
                    doc_ids.to(device),
                    self.context_group,
                    backend=self.backend,
                    kernels=self.kernels,
                    clean_only=True,
                )
            else:
                mask = self._masks(layout, doc_ids.to(device), trim)
            if one_document:
                self._static[(key, trim)] = mask
        # Scored positions: keep those this rank scores, renumbered locally.
        score_index = batch.score_index.to(device)
        row, col = score_index // (2 * seq_len), score_index % (2 * seq_len)
        local = local_of[col]
        keep = local >= 0
        # The model's output rows: the rank's whole share, or its noisy tokens alone (first).
        width = mask.queries if isinstance(mask, LastLayerQueries) else stream_index.numel()
        scored = replace(
            batch,
            input_ids=batch.input_ids.to(device).index_select(1, stream_index),
            score_index=row[keep] * width + local[keep],
            targets=batch.targets.to(device)[keep],
            weights=batch.weights.to(device)[keep],
        )
        return ModelInputs(
            input_ids=scored.input_ids,
            positions=positions,
            mask=mask,
            batch=scored,
        )


def build_sequence_plan(
    dims: ParallelDims | None,
    attention: Any,
    *,
    merge_backend: str = "reference",
    trims: frozenset[str] = frozenset(),
) -> SequencePlan:
    """The plan for `dims`; `attention` is the trainer's backend (its `name` picks the kernel);
    `trims`: the work the model may skip (`train.attention.trim`)."""
    if dims is None or dims.mode == "none":
        return WholeSequence(attention, trims)
    backend = getattr(attention, "name", "reference")
    kernels = getattr(attention, "kernels", "native")  # TurboAttention's kernel source
    return ContextParallel(
        dims, backend=backend, merge_backend=merge_backend, kernels=kernels, trims=trims
    )
