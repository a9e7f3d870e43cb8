"""The block-diffusion attention pattern over the 2L stream [x_t ; x_0].

Layout: a sequence of L tokens in blocks of B (L % B == 0). The model sees 2L positions: index
i < L is the noisy token x_t[i], index L + i is the clean token x_0[i]; both use RoPE position i.
Who may attend to whom (the design's semantics), with blk(i) = (i mod L) // B:

    noisy q -> noisy kv   iff blk(q) == blk(kv)     local: the block itself, bidirectional
    noisy q -> clean kv   iff blk(kv) <  blk(q)     prefix: clean blocks strictly before
    clean q -> clean kv   iff blk(kv) <= blk(q)     prefix: block-causal inside the clean half
    clean q -> noisy kv   never                     clean never sees noise

and, for packed data, only within one document: doc[q mod L] == doc[kv mod L].

The predicate is split into a LOCAL part (noisy block with itself) and a PREFIX part (every
query against clean keys). Context-sharded block parallelism relies on that split: the local
part needs only the rank's own noisy block, the prefix part needs clean K/V from other ranks,
and the two partial attentions are merged by their log-sum-exp. Every function here takes
broadcastable integer tensors (q_idx, kv_idx), so the same code builds dense masks, FlexAttention
mask_mods, per-shard masks (pass the global indices of the shard) and the pair counts for MFU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# The rule itself lives with the op's reference (one definition); these name stream indices.
from turbo_dllm.kernels.reference import local_visible, prefix_visible

__all__ = [
    "BlockDiffusionLayout",
    "allowed",
    "allowed_pairs",
    "allowed_pairs_by_stream",
    "dense_mask",
    "local_allowed",
    "one_document_per_row",
    "prefix_allowed",
]


@dataclass(frozen=True)
class BlockDiffusionLayout:
    """L (tokens per stream) and B (diffusion block size); the stream has 2L positions."""

    seq_len: int
    block_size: int

    def __post_init__(self) -> None:
        if self.seq_len <= 0 or self.block_size <= 0 or self.seq_len % self.block_size:
            raise ValueError(
                f"seq_len ({self.seq_len}) must be a positive multiple of "
                f"block_size ({self.block_size})"
            )

    @property
    def stream_len(self) -> int:
        return 2 * self.seq_len

    @property
    def num_blocks(self) -> int:
        return self.seq_len // self.block_size

    def positions(self, device: torch.device | str | None = None) -> torch.Tensor:
        """RoPE positions of the stream: 0..L-1 for x_t, then 0..L-1 again for x_0."""
        base = torch.arange(self.seq_len, device=device)
        return torch.cat([base, base])

    # --- index helpers (work on tensors of any broadcastable shape) ------------------------
    def is_noisy(self, idx: torch.Tensor) -> torch.Tensor:
        return idx < self.seq_len

    def token(self, idx: torch.Tensor) -> torch.Tensor:
        """Position within the sequence (0..L-1) of stream index `idx`."""
        return torch.where(idx < self.seq_len, idx, idx - self.seq_len)

    def block(self, idx: torch.Tensor) -> torch.Tensor:
        return self.token(idx) // self.block_size


def _tags(layout: BlockDiffusionLayout, q_idx: torch.Tensor, kv_idx: torch.Tensor):
    return (
        layout.is_noisy(q_idx),
        layout.block(q_idx),
        layout.is_noisy(kv_idx),
        layout.block(kv_idx),
    )


def local_allowed(
    layout: BlockDiffusionLayout, q_idx: torch.Tensor, kv_idx: torch.Tensor
) -> torch.Tensor:
    """Noisy query -> noisy key of the same block (ignores documents)."""
    return local_visible(*_tags(layout, q_idx, kv_idx))


def prefix_allowed(
    layout: BlockDiffusionLayout, q_idx: torch.Tensor, kv_idx: torch.Tensor
) -> torch.Tensor:
    """Any query -> clean key of an earlier block (noisy q) or same-or-earlier block (clean q)."""
    return prefix_visible(*_tags(layout, q_idx, kv_idx))


def allowed(
    layout: BlockDiffusionLayout,
    q_idx: torch.Tensor,
    kv_idx: torch.Tensor,
    doc_q: torch.Tensor | None = None,
    doc_kv: torch.Tensor | None = None,
) -> torch.Tensor:
    """The full predicate: (local | prefix) & same document (when doc ids are given)."""
    ok = local_allowed(layout, q_idx, kv_idx) | prefix_allowed(layout, q_idx, kv_idx)
    if doc_q is not None and doc_kv is not None:
        ok = ok & (doc_q == doc_kv)
    return ok


def dense_mask(
    layout: BlockDiffusionLayout,
    doc_ids: torch.Tensor | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Boolean mask (B or 1, 1, 2L, 2L), True = may attend. `doc_ids`: (B, L) per token."""
    idx = torch.arange(layout.stream_len, device=device)
    q, kv = idx[:, None], idx[None, :]
    if doc_ids is None:
        return allowed(layout, q, kv)[None, None]
    doc_ids = doc_ids.to(device)
    stream_docs = torch.cat([doc_ids, doc_ids], dim=1)  # (B, 2L)
    return allowed(layout, q, kv, stream_docs[:, :, None], stream_docs[:, None, :])[:, None]


def one_document_per_row(doc_ids: torch.Tensor | None) -> bool:
    """Whether doc_ids (R, L) hold no document boundary: None, or one id across each row (a
    host sync when they sit on a device)."""
    return doc_ids is None or bool((doc_ids == doc_ids[:, :1]).all())


def allowed_pairs(layout: BlockDiffusionLayout, doc_ids: torch.Tensor | None = None) -> int:
    """How many (query, key) pairs the mask allows, summed over the batch; O(L) per row.

    Used for the attention share of model FLOPs. With documents, assumes each document is one
    contiguous run of positions (what packing produces).
    """
    if not isinstance(layout, BlockDiffusionLayout):  # a CanvasLayout: one document per row
        return layout.pairs()
    return sum(allowed_pairs_by_stream(layout, doc_ids))


def allowed_pairs_by_stream(
    layout: BlockDiffusionLayout, doc_ids: torch.Tensor | None = None
) -> tuple[int, int]:
    """`allowed_pairs` split by the query's stream: (the noisy queries', the clean queries'),
    for a model that computes only some of those rows (`train.attention.trim`)."""
    L, B = layout.seq_len, layout.block_size
    pos = torch.arange(L)
    blk_start = (pos // B) * B
    if doc_ids is None:
        start = torch.zeros(1, L, dtype=torch.long)
        end = torch.full((1, L), L, dtype=torch.long)
    else:
        docs = doc_ids.to("cpu").long()
        rows = docs.shape[0]
        new_run = torch.ones_like(docs, dtype=torch.bool)
        new_run[:, 1:] = docs[:, 1:] != docs[:, :-1]
        start = torch.where(new_run, pos.expand(rows, L), 0).cummax(dim=1).values
        run_end = torch.ones_like(new_run)
        run_end[:, :-1] = new_run[:, 1:]
        flipped = torch.where(run_end, pos.expand(rows, L) + 1, L + 1).flip(1)
        end = flipped.cummin(dim=1).values.flip(1)

    def overlap(lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
        return (torch.minimum(hi, end) - torch.maximum(lo, start)).clamp(min=0)

    local = overlap(blk_start, blk_start + B)  # noisy q: its own noisy block
    noisy_prefix = overlap(torch.zeros_like(blk_start), blk_start)  # clean blocks before
    clean_prefix = overlap(torch.zeros_like(blk_start), blk_start + B)  # clean blocks <= own
    return int((local + noisy_prefix).sum()), int(clean_prefix.sum())
