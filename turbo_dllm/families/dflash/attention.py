"""The drafter's attention over [target context | draft blocks], without the wasted pairs.

Every draft token attends to (part of) the C context rows and to the B tokens of its own block.
One SDPA over all Q = N x B draft tokens against [context, all Q draft tokens] computes a
Q x (C + Q) score matrix of which the draft part is block-diagonal: at the benchmark's shapes
(C = 1024, Q = 2048) two thirds of it is masked out. `draft_attention` splits the queries into
G groups of whole blocks and runs one SDPA over (R x G) rows of [context, the group's own draft
tokens]: Q x (C + Q / G) scores, for G copies of the context's keys and values. The mask is the
same (R, 1, Q, C + Q) one, sliced per group, so every query sees exactly the keys it saw before
and the result equals the single SDPA's up to summation order.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["attention_groups", "draft_attention", "masked_attention"]


def masked_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """SDPA over an explicit boolean mask, grouped K/V heads expanded to the query heads first.

    With a mask and `enable_gqa`, CUDA's memory-efficient kernel took only equal head counts
    until recent torch versions, and SDPA then falls back to its math path: float32 score
    matrices (R, H, Q, K) written and read several times, forward and backward (the drafter's
    are 16 x 16 x 2048 x 3072 in the speculative benchmark). Expanded heads keep a fused kernel
    on every version; the repeated K/V are small next to the scores."""
    if mask is not None and k.shape[1] != q.shape[1]:
        repeat = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1]
    )


def attention_groups(queries: int, context: int, block_size: int) -> int:
    """How many groups of whole blocks to split `queries` draft tokens into: groups of about
    a quarter of the context (the scores then are (C + C/4) per query, not C + Q), 1 when the
    draft tokens are few next to the context or when no divisor of the block count comes
    close (each group costs a copy of the context's keys and values)."""
    blocks = queries // block_size
    per_group = max(1, (context // 4) // block_size)  # blocks per group, at most
    if blocks <= per_group:
        return 1
    best = max(d for d in range(1, per_group + 1) if blocks % d == 0)
    groups = blocks // best
    return groups if groups <= 2 * -(-blocks // per_group) else 1


def draft_attention(
    q: torch.Tensor,
    context_k: torch.Tensor,
    context_v: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    block_size: int,
) -> torch.Tensor:
    """Attention of the draft queries q (R, H, Q, D) over [context (R, Hkv, C, D), draft
    (R, Hkv, Q, D)] under `mask` (R, 1, Q, C + Q) (None: every key), (R, H, Q, D) out."""
    rows, heads, queries, dim = q.shape
    c = context_k.shape[2]
    groups = 1 if mask is None else attention_groups(queries, c, block_size)
    if groups == 1:
        keys = torch.cat([context_k, k], dim=2)
        values = torch.cat([context_v, v], dim=2)
        return masked_attention(q, keys, values, mask)
    g, n = groups, queries // groups  # n draft tokens (whole blocks) per group

    def per_group(x: torch.Tensor) -> torch.Tensor:  # (R, h, Q, D) -> (R * G, h, n, D)
        return x.unflatten(2, (g, n)).transpose(1, 2).flatten(0, 1)

    def with_context(ctx: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
        # (R * G, H, C + n, D) in one copy: the context's rows for every group and the group's
        # own rows, the K/V heads already expanded to the query heads (as masked_attention)
        kv_heads = ctx.shape[1]
        shape = (rows, g, kv_heads, heads // kv_heads, -1, dim)
        ctx = ctx[:, None, :, None].expand(shape)
        own = own.unflatten(2, (g, n)).transpose(1, 2)[:, :, :, None].expand(shape)
        return torch.cat([ctx, own], dim=4).flatten(2, 3).flatten(0, 1)

    # the mask's context columns per group, and the draft columns of the group's own tokens
    context_mask = mask[..., :c].unflatten(2, (g, n)).transpose(1, 2).flatten(0, 1)
    local = mask[..., c:].unflatten(2, (g, n)).unflatten(4, (g, n))  # (R, 1, G, n, G, n)
    local = local.diagonal(dim1=2, dim2=4).permute(0, 4, 1, 2, 3).flatten(0, 1)
    grouped_mask = torch.cat([context_mask, local], dim=-1)  # (R * G, 1, n, C + n)
    out = masked_attention(
        per_group(q), with_context(context_k, k), with_context(context_v, v), grouped_mask
    )
    return out.unflatten(0, (rows, g)).transpose(1, 2).flatten(2, 3)  # (R, H, Q, D)
