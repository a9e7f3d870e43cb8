"""Masked attention that also returns its log-sum-exp, so partial results can be merged.

CSBP splits a noisy query's keys into two sets (its own block, local; the clean prefix, gathered)
and merges the two partial outputs by their log-sum-exp. Both partials come from here:

* `reference`: dense float32 math with an explicit boolean mask (CPU, tests, small shapes);
* `flex`: `torch.nn.attention.flex_attention` with a block-sparse mask built once per step
  (GPU; masked tiles are skipped, so work follows the block-diffusion sparsity).
* `turbo`: our Triton op `block_diffusion_attention` with its tile lists built once per step
  (GPU; `kernels` native: the active bundle, jit: the shipped source). It returns the lse the
  merge needs from the same kernel, with its gradient.

The mask is built once when the attention is constructed (per step: it depends on the layout and
the document ids only) and reused by every layer.

Shapes: q (B, H, Sq, D), k/v (B, Hkv, Sk, D) with H % Hkv == 0 (grouped-query attention).
Returns out (B, H, Sq, D) in q's dtype and lse (B, H, Sq) in float32 (or wider), natural log; a
query that sees no key gets out 0 and lse -inf.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch

from turbo_dllm.kernels.reference import visible
from turbo_dllm.train.parallel.visibility import TokenSet, tokens_mask

__all__ = [
    "AttentionName",
    "PartialAttention",
    "build_partial_attention",
    "dense_attention_with_lse",
]

# The attention kernels by name (RunSpec model.attention); the callable a layer holds is
# `turbo_dllm.families.decoder.model.AttentionBackend`.
AttentionName = Literal["reference", "flex", "turbo"]
PartialAttention = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]
]


def dense_attention_with_lse(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference attention in float32 (float64 stays float64); `mask` (B|1, 1, Sq, Sk) bool.

    Fully masked rows are made finite before the softmax and zeroed after, so neither the
    forward nor the backward produces NaN (their lse is -inf, their gradient zero).
    """
    batch, heads, sq, dim = q.shape
    kv_heads, sk = k.shape[1], k.shape[2]
    if heads % kv_heads:
        raise ValueError(f"query heads {heads} are not a multiple of key/value heads {kv_heads}")
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    group = heads // kv_heads
    compute = torch.promote_types(q.dtype, torch.float32)
    qf = q.to(compute).reshape(batch, kv_heads, group, sq, dim)
    kf = k.to(compute)[:, :, None]
    vf = v.to(compute)[:, :, None]
    visible = mask[:, :, None]  # (B, 1, 1, Sq, Sk)
    scores = torch.matmul(qf, kf.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~visible, float("-inf"))
    any_visible = visible.any(-1)  # (B, 1, 1, Sq)
    scores = torch.where(any_visible[..., None], scores, torch.zeros((), dtype=scores.dtype))
    lse = torch.logsumexp(scores, dim=-1) if sk else scores.new_zeros(scores.shape[:-1])
    probs = torch.exp(scores - lse[..., None])
    probs = torch.where(visible, probs, torch.zeros((), dtype=probs.dtype))
    out = torch.matmul(probs, vf)
    lse = torch.where(any_visible, lse, torch.full((), float("-inf"), dtype=lse.dtype))
    out = out.reshape(batch, heads, sq, dim).to(q.dtype)
    return out, lse.reshape(batch, heads, sq)


def _reference(q_tokens: TokenSet, k_tokens: TokenSet, scale: float | None) -> PartialAttention:
    mask = tokens_mask(q_tokens, k_tokens)

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        return dense_attention_with_lse(q, k, v, mask, scale)

    return attend


_compiled_flex: Callable | None = None


def _flex_attention() -> Callable:
    global _compiled_flex
    if _compiled_flex is None:
        from torch.nn.attention.flex_attention import flex_attention

        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex


def _flex(q_tokens: TokenSet, k_tokens: TokenSet, scale: float | None) -> PartialAttention:
    from turbo_dllm.train.attention.backends import create_block_mask_for, flex_kernel_options

    qn, qb, qd = q_tokens.noisy, q_tokens.block, q_tokens.doc
    kn, kb, kd = k_tokens.noisy, k_tokens.block, k_tokens.doc

    def mask_mod(b, h, q_idx, kv_idx):
        return visible(qn[q_idx], qb[q_idx], qd[b, q_idx], kn[kv_idx], kb[kv_idx], kd[b, kv_idx])

    batch = qd.shape[0]
    block_mask = create_block_mask_for(qd.device)(  # compiled on the GPU: no Sq x Sk mask
        mask_mod, batch, None, len(q_tokens), len(k_tokens), device=qd.device
    )
    flex = _flex_attention()

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        out, lse = flex(
            q,
            k,
            v,
            block_mask=block_mask,
            scale=scale,
            enable_gqa=q.shape[1] != k.shape[1],
            return_lse=True,
            kernel_options=flex_kernel_options(q),
        )
        return out, lse.float()

    return attend


def _turbo(
    q_tokens: TokenSet, k_tokens: TokenSet, scale: float | None, kernels: str
) -> PartialAttention:
    from turbo_dllm.kernels.block_diffusion import (
        block_diffusion_attention,
        plan_block_diffusion_attention,
    )

    plan = plan_block_diffusion_attention(
        q_tokens.noisy,
        q_tokens.block,
        q_tokens.doc,
        k_tokens.noisy,
        k_tokens.block,
        k_tokens.doc,
        backend=kernels,
    )

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        return block_diffusion_attention(q, k, v, plan, scale)

    return attend


def build_partial_attention(
    q_tokens: TokenSet,
    k_tokens: TokenSet,
    backend: AttentionName = "reference",
    scale: float | None = None,
    kernels: str = "native",
) -> PartialAttention:
    """Attention of the queries described by `q_tokens` over the keys of `k_tokens`.

    `kernels` (native or jit) says where `turbo` takes its kernels from."""
    if backend == "reference":
        return _reference(q_tokens, k_tokens, scale)
    if backend == "flex":
        return _flex(q_tokens, k_tokens, scale)
    if backend == "turbo":
        return _turbo(q_tokens, k_tokens, scale, kernels)
    raise ValueError(f"unknown attention backend {backend!r} (reference, flex, turbo)")
