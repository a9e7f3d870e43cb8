"""Cross-entropy through the LM head without materialising the logits.

At vocab 150k and 16k scored tokens, full fp32 logits are 10 GB (and as much again for their
gradient). `linear_cross_entropy` walks the tokens in chunks: for each chunk it computes the
logits, the loss and, right away, the gradients with respect to the hidden states and the head
weight, then drops the chunk. The backward pass only scales the stored gradients, so nothing is
recomputed and the peak is one chunk of logits (about `chunk_bytes`) plus the weight gradient.
On CUDA the softmax gradient is written over the logits in their own dtype by one Triton
kernel (`softmax_grad`), so a chunk costs no float32 copy.
"""

from __future__ import annotations

import math

import torch

from turbo_dllm.train.softmax_grad import softmax_cross_entropy_

__all__ = ["default_chunk_size", "linear_cross_entropy"]

_CHUNK_BYTES = 1 << 30  # logits (and their float32 math copy off CUDA) per chunk


def default_chunk_size(
    vocab_size: int, chunk_bytes: int = _CHUNK_BYTES, element_size: int = 4
) -> int:
    """Tokens per chunk so that one chunk of logits stays near `chunk_bytes`."""
    tokens = chunk_bytes // (element_size * vocab_size)
    return int(max(64, min(16384, tokens // 64 * 64 or 64)))


def _even_chunks(n: int, limit: int) -> int:
    """The chunk size that splits n into the fewest near-equal pieces of at most `limit`
    (multiples of 64): 4096 tokens at a limit of 3520 become 2 x 2048, not 3520 + 576."""
    if n <= 0:  # nothing scored (a micro-batch can draw no masked token): any size loops 0 times
        return limit
    pieces = math.ceil(n / limit)
    return min(limit, math.ceil(math.ceil(n / pieces) / 64) * 64)


def _accumulate_outer(
    grad_weight: torch.Tensor, g: torch.Tensor, h: torch.Tensor, first: bool
) -> None:
    """grad_weight += g.T @ h (= g.T @ h when `first`: the buffer is then uninitialised), in
    grad_weight's (float32+) dtype without a product copy."""
    beta = 0.0 if first else 1.0  # addmm ignores the input at beta 0, NaN included
    if grad_weight.dtype == g.dtype:
        grad_weight.addmm_(g.t(), h, beta=beta)
    elif g.is_cuda:  # cuBLAS accumulates bf16/fp16 products straight into float32
        torch.addmm(grad_weight, g.t(), h, beta=beta, out_dtype=grad_weight.dtype, out=grad_weight)
    elif first:
        grad_weight.copy_(g.t() @ h)
    else:
        grad_weight.add_(g.t() @ h)


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
        softcap: float | None,
    ) -> torch.Tensor:
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        n = hidden.shape[0]
        w = weight.to(compute_dtype)
        math_dtype = torch.promote_types(compute_dtype, torch.float32)  # never below fp32
        total = torch.zeros((), dtype=math_dtype, device=hidden.device)
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = (
            torch.empty(weight.shape, dtype=math_dtype, device=weight.device)
            if need_weight
            else None
        )
        if need_weight and n == 0:
            grad_weight.zero_()
        for start in range(0, n, chunk_size):
            end = min(start + chunk_size, n)
            h = hidden[start:end].to(compute_dtype)
            logits = h @ w.t()
            write_grad = need_hidden or need_weight
            if softcap is not None:  # z -> c * tanh(z / c); keep tanh for the chain rule
                capped = torch.tanh(logits.to(math_dtype) / softcap)
                logits.copy_(capped * softcap)
            losses = softmax_cross_entropy_(
                logits, targets[start:end], token_weights[start:end], exclude_index, write_grad
            )
            total += losses.sum().to(math_dtype)
            if not write_grad:
                continue
            if softcap is not None:  # d(c tanh(z/c))/dz = 1 - tanh^2
                logits.copy_(logits.to(math_dtype) * (1.0 - capped.square()))
                del capped
            g = logits  # now w * (softmax - onehot), in compute dtype
            if need_hidden:
                if hidden.dtype == compute_dtype:
                    torch.mm(g, w, out=grad_hidden[start:end])
                else:
                    grad_hidden[start:end] = (g @ w).to(hidden.dtype)
            if need_weight:
                _accumulate_outer(grad_weight, g, h, first=start == 0)
            del logits, g
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = weight.dtype
        return total

    @staticmethod
    def backward(ctx, grad_total: torch.Tensor):
        grad_hidden, grad_weight = ctx.saved_tensors
        gh = gw = None
        if grad_hidden is not None:
            gh = grad_hidden * grad_total.to(grad_hidden.dtype)
        if grad_weight is not None:  # scaled and cast in one pass over the (V, H) buffer
            gw = torch.empty(grad_weight.shape, dtype=ctx.weight_dtype, device=grad_weight.device)
            torch.mul(grad_weight, grad_total, out=gw)
        return gh, gw, None, None, None, None, None, None


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    token_weights: torch.Tensor | None = None,
    *,
    exclude_index: int | None = None,
    chunk_size: int | None = None,
    compute_dtype: torch.dtype | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """sum_i w_i * CE(hidden_i @ weight.T, targets_i), chunked; a float32 (or float64) scalar.

    With `softcap` c the logits are c * tanh(z / c) (Gemma's final logit soft-capping).

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
    if chunk_size is None:
        logit_bytes = compute_dtype.itemsize
        if not hidden.is_cuda and logit_bytes < 4:
            logit_bytes += 4  # the torch reference's float32 copy
        limit = default_chunk_size(weight.shape[0], element_size=logit_bytes)
        chunk_size = _even_chunks(hidden.shape[0], limit)
    with torch.autocast(hidden.device.type, enabled=False):
        return _LinearCrossEntropy.apply(
            hidden,
            weight,
            targets,
            token_weights,
            exclude_index,
            chunk_size,
            compute_dtype,
            softcap,
        )
