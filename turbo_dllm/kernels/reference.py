"""Pure-torch reference implementations of the native ops: the ground truth of every kernel test.

They run anywhere torch runs (`kernels: reference` in a RunSpec) and are written for clarity and
exact edge cases, not speed.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "block_diffusion_attention",
    "block_diffusion_visible",
    "local_visible",
    "prefix_visible",
    "visible",
    "merge_attention_partials",
    "merge_attention_partials_backward",
]


def _merge_weights(
    lse_a: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(w_a, w_b, lse) with the -inf rules: a -inf side weighs 0; both -inf give lse -inf."""
    m = torch.maximum(lse_a, lse_b).detach()  # a stabilizer only: lse does not depend on it
    finite = torch.isfinite(m)
    m_safe = torch.where(finite, m, torch.zeros_like(m))
    e_a = torch.exp(lse_a - m_safe)
    e_b = torch.exp(lse_b - m_safe)
    total = e_a + e_b
    seen = total > 0
    total_safe = torch.where(seen, total, torch.ones_like(total))
    lse = torch.where(seen, m_safe + torch.log(total_safe), torch.full_like(total, -torch.inf))
    return e_a / total_safe, e_b / total_safe, lse


def merge_attention_partials(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge attention over two disjoint key sets by their log-sum-exp.

    out_*: (..., S, D) in any float dtype; lse_*: (..., S) float32 natural-log sum-exp of the
    scores. Returns (out, lse): out in out_a's dtype (accumulated in float32 or wider), lse
    float32. Differentiable in all four inputs through autograd.
    """
    _check(out_a, lse_a, out_b, lse_b)
    w_a, w_b, lse = _merge_weights(lse_a, lse_b)
    acc = torch.promote_types(out_a.dtype, torch.float32)
    # A side with weight 0 is never read, so a fully masked partial may hold anything.
    a = torch.where(w_a.unsqueeze(-1) > 0, out_a.to(acc), 0)
    b = torch.where(w_b.unsqueeze(-1) > 0, out_b.to(acc), 0)
    out = w_a.unsqueeze(-1).to(acc) * a + w_b.unsqueeze(-1).to(acc) * b
    return out.to(out_a.dtype), lse


def merge_attention_partials_backward(
    grad_out: torch.Tensor | None,
    grad_lse: torch.Tensor | None,
    out_a: torch.Tensor,
    lse_a: torch.Tensor,
    out_b: torch.Tensor,
    lse_b: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The closed-form backward the native kernels implement (grad_out_a, grad_lse_a, ...).

    grad_out_x = w_x * g;  grad_lse_x = w_x * (sum_D g * (out_x - out) + grad_lse).
    """
    _check(out_a, lse_a, out_b, lse_b)
    with torch.no_grad():
        w_a, w_b, _ = _merge_weights(lse_a, lse_b)
        acc = torch.promote_types(out_a.dtype, torch.float32)
        a = torch.where(w_a.unsqueeze(-1) > 0, out_a.to(acc), 0)
        b = torch.where(w_b.unsqueeze(-1) > 0, out_b.to(acc), 0)
        out = w_a.unsqueeze(-1).to(acc) * a + w_b.unsqueeze(-1).to(acc) * b
        g = torch.zeros_like(out) if grad_out is None else grad_out.to(acc)
        upstream = torch.zeros_like(lse_a) if grad_lse is None else grad_lse.to(torch.float32)
        dot_a = (g * (a - out)).sum(-1)
        dot_b = (g * (b - out)).sum(-1)
        grad_lse_a = torch.where(w_a > 0, w_a * (dot_a + upstream), 0).to(torch.float32)
        grad_lse_b = torch.where(w_b > 0, w_b * (dot_b + upstream), 0).to(torch.float32)
        grad_out_a = (w_a.unsqueeze(-1).to(acc) * g).to(out_a.dtype)
        grad_out_b = (w_b.unsqueeze(-1).to(acc) * g).to(out_b.dtype)
    return grad_out_a, grad_lse_a, grad_out_b, grad_lse_b


def _check(out_a, lse_a, out_b, lse_b) -> None:
    if out_a.dim() < 2:
        raise ValueError(f"out_a must be (..., S, D), got shape {tuple(out_a.shape)}")
    if out_a.shape != out_b.shape or out_a.dtype != out_b.dtype:
        raise ValueError(
            f"out_a {tuple(out_a.shape)} {out_a.dtype} and out_b {tuple(out_b.shape)} "
            f"{out_b.dtype} must match in shape and dtype"
        )
    rows = out_a.shape[:-1]
    if lse_a.shape != rows or lse_b.shape != rows:
        raise ValueError(
            f"lse must be out.shape[:-1] = {tuple(rows)}, got {tuple(lse_a.shape)} "
            f"and {tuple(lse_b.shape)}"
        )
    if lse_a.dtype != torch.float32 or lse_b.dtype != torch.float32:
        raise ValueError(f"lse must be float32, got {lse_a.dtype} and {lse_b.dtype}")


def local_visible(q_noisy, q_block, k_noisy, k_block) -> torch.Tensor:
    """The local part of the rule, elementwise: a noisy query sees the noisy keys of its block."""
    return q_noisy & k_noisy & (q_block == k_block)


def prefix_visible(q_noisy, q_block, k_noisy, k_block) -> torch.Tensor:
    """The prefix part, elementwise: any query sees clean keys of earlier blocks (noisy query) or
    of the same and earlier blocks (clean query); clean never sees noisy."""
    return ~k_noisy & torch.where(q_noisy, k_block < q_block, k_block <= q_block)


def visible(q_noisy, q_block, q_doc, k_noisy, k_block, k_doc) -> torch.Tensor:
    """The block-diffusion attention rule on per-token tags (docs/architecture.md,
    "Block-diffusion semantics"), elementwise and broadcasting: the one definition every mask is
    built from (dense masks, FlexAttention mask_mods, CSBP's parts, this op's reference).

    Noisy query of block i: noisy keys of block i and clean keys of blocks < i; clean query of
    block i: clean keys of blocks <= i; never another document.
    """
    rule = local_visible(q_noisy, q_block, k_noisy, k_block) | prefix_visible(
        q_noisy, q_block, k_noisy, k_block
    )
    return rule & (q_doc == k_doc)


def block_diffusion_visible(q_noisy, q_block, q_doc, k_noisy, k_block, k_doc) -> torch.Tensor:
    """(B, Sq, Sk) bool: `visible` over token sets; noisy/block (S,), doc (B, S)."""
    return visible(
        q_noisy.bool()[None, :, None],
        q_block.long()[None, :, None],
        q_doc.long()[:, :, None],
        k_noisy.bool()[None, None, :],
        k_block.long()[None, None, :],
        k_doc.long()[:, None, :],
    )


def block_diffusion_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    visible: torch.Tensor,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense masked attention -> (out in q's dtype, lse float32 natural log), differentiable.

    q (B, H, Sq, D), k/v (B, Hkv, Sk, D), H % Hkv == 0; `visible` (B, Sq, Sk) bool. Math in
    float32 (float64 stays float64). A query that sees no key gets out 0 and lse -inf, and no
    NaN in either direction.
    """
    batch, heads, sq, dim = q.shape
    kv_heads = k.shape[1]
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    compute = torch.promote_types(q.dtype, torch.float32)
    qf = q.to(compute).reshape(batch, kv_heads, heads // kv_heads, sq, dim)
    kf, vf = k.to(compute)[:, :, None], v.to(compute)[:, :, None]
    mask = visible[:, None, None]  # (B, 1, 1, Sq, Sk)
    scores = torch.matmul(qf, kf.transpose(-1, -2)) * scale
    seen = mask.any(-1)
    scores = torch.where(mask, scores, float("-inf"))
    scores = torch.where(seen[..., None], scores, 0.0)  # finite rows for the softmax
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.where(mask, torch.exp(scores - lse[..., None]), 0.0)
    out = torch.matmul(probs, vf).reshape(batch, heads, sq, dim).to(q.dtype)
    lse = torch.where(seen, lse, float("-inf")).reshape(batch, heads, sq)
    return out, lse.to(torch.promote_types(lse.dtype, torch.float32))
