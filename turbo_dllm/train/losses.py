"""Cross-entropy through the LM head without materialising the logits.

At vocab 150k and 16k scored tokens, full fp32 logits are 10 GB (and as much again for their
gradient). `linear_cross_entropy` walks the tokens in chunks: for each chunk it computes the
logits, the loss and, right away, the gradients with respect to the hidden states and the head
weight, then drops the chunk. The backward pass only scales the stored gradients, so nothing is
recomputed and the peak is one chunk of logits (about `chunk_bytes`) plus the weight gradient.
"""

from __future__ import annotations

import torch

__all__ = ["default_chunk_size", "linear_cross_entropy"]

_CHUNK_BYTES = 1 << 30  # fp32 logits per chunk


def default_chunk_size(vocab_size: int, chunk_bytes: int = _CHUNK_BYTES) -> int:
    """Tokens per chunk so that one chunk of fp32 logits stays near `chunk_bytes`."""
    tokens = chunk_bytes // (4 * vocab_size)
    return int(max(64, min(16384, tokens // 64 * 64 or 64)))


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        token_weights: torch.Tensor,
        exclude_index: int | None,
        chunk_size: int,
        compute_dtype: torch.dtype,
    ) -> torch.Tensor:
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        n = hidden.shape[0]
        w = weight.to(compute_dtype)
        math_dtype = torch.promote_types(compute_dtype, torch.float32)  # never below fp32
        total = torch.zeros((), dtype=math_dtype, device=hidden.device)
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = (
            torch.zeros(weight.shape, dtype=math_dtype, device=weight.device)
            if need_weight
            else None
        )
        for start in range(0, n, chunk_size):
            end = min(start + chunk_size, n)
            h = hidden[start:end].to(compute_dtype)
            tgt = targets[start:end]
            tw = token_weights[start:end].to(math_dtype)
            logits = (h @ w.t()).to(math_dtype)
            if exclude_index is not None:
                logits[:, exclude_index] = float("-inf")
            lse = torch.logsumexp(logits, dim=-1)
            picked = logits.gather(1, tgt[:, None]).squeeze(1)
            total += (tw * (lse - picked)).sum()
            if not (need_hidden or need_weight):
                continue
            # d/dlogits of w * (lse - logit_t) = w * (softmax - onehot), computed in place.
            probs = logits.sub_(lse[:, None]).exp_()
            probs[torch.arange(end - start, device=probs.device), tgt] -= 1.0
            probs.mul_(tw[:, None])
            g = probs.to(compute_dtype)
            del logits, probs
            if need_hidden:
                grad_hidden[start:end] = (g @ w).to(hidden.dtype)
            if need_weight:
                if compute_dtype == math_dtype:
                    grad_weight.addmm_(g.t(), h)
                else:  # mixed-dtype in-place add: no float32 copy of the product
                    grad_weight.add_(g.t() @ h)
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = weight.dtype
        return total

    @staticmethod
    def backward(ctx, grad_total: torch.Tensor):
        grad_hidden, grad_weight = ctx.saved_tensors
        gh = gw = None
        if grad_hidden is not None:
            gh = grad_hidden * grad_total.to(grad_hidden.dtype)
        if grad_weight is not None:
            gw = (grad_weight * grad_total).to(ctx.weight_dtype)
        return gh, gw, None, None, None, None, None


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    token_weights: torch.Tensor | None = None,
    *,
    exclude_index: int | None = None,
    chunk_size: int | None = None,
    compute_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """sum_i w_i * CE(hidden_i @ weight.T, targets_i), chunked; a float32 (or float64) scalar.

    hidden (N, H), weight (V, H), targets (N,) int64, token_weights (N,) or None for ones.
    `exclude_index` removes one vocabulary entry from the softmax (the mask token in the
    standard block-diffusion objective). `compute_dtype` is the matmul dtype (bf16 under
    autocast); softmax math is float32 at least.
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"shapes do not fit: hidden {tuple(hidden.shape)}, weight {tuple(weight.shape)}"
        )
    if token_weights is None:
        token_weights = torch.ones(targets.shape, dtype=torch.float32, device=hidden.device)
    if compute_dtype is None:
        autocast = torch.is_autocast_enabled(hidden.device.type)
        compute_dtype = torch.get_autocast_dtype(hidden.device.type) if autocast else hidden.dtype
    chunk = chunk_size or default_chunk_size(weight.shape[0])
    with torch.autocast(hidden.device.type, enabled=False):
        return _LinearCrossEntropy.apply(
            hidden, weight, targets, token_weights, exclude_index, chunk, compute_dtype
        )
