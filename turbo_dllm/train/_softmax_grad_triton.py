"""The Triton kernel behind `softmax_grad.softmax_cross_entropy_` on CUDA (imported lazily).

One program per row: an online max / sum-exp pass over the row, then (optionally) a second
pass that writes w * (softmax - onehot) over the row in the logits' dtype. Memory-bound: two
reads and one write of the row, all math in float32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK = 4096


@triton.jit
def _softmax_cross_entropy_kernel(
    logits_ptr,
    row_stride,
    targets_ptr,
    weights_ptr,
    loss_ptr,
    vocab,
    exclude_index,
    HAS_EXCLUDE: tl.constexpr,
    WRITE_GRAD: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * row_stride
    target = tl.load(targets_ptr + row).to(tl.int64)
    weight = tl.load(weights_ptr + row).to(tl.float32)
    offsets = tl.arange(0, BLOCK)

    # Finite start so that exp(m_old - m_new) never sees -inf - -inf.
    running_max = tl.full((), -1.0e30, tl.float32)
    running_sum = tl.zeros((), tl.float32)
    for start in range(0, vocab, BLOCK):
        cols = start + offsets
        z = tl.load(base + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
        if HAS_EXCLUDE:
            z = tl.where(cols == exclude_index, float("-inf"), z)
        new_max = tl.maximum(running_max, tl.max(z, axis=0))
        running_sum = running_sum * tl.exp(running_max - new_max) + tl.sum(
            tl.exp(z - new_max), axis=0
        )
        running_max = new_max
    lse = running_max + tl.log(running_sum)
    picked = tl.load(base + target).to(tl.float32)
    tl.store(loss_ptr + row, weight * (lse - picked))

    if WRITE_GRAD:
        for start in range(0, vocab, BLOCK):
            cols = start + offsets
            in_row = cols < vocab
            z = tl.load(base + cols, mask=in_row, other=float("-inf")).to(tl.float32)
            p = tl.exp(z - lse)
            if HAS_EXCLUDE:
                p = tl.where(cols == exclude_index, 0.0, p)
            p = tl.where(cols == target, p - 1.0, p)
            tl.store(base + cols, (weight * p).to(logits_ptr.dtype.element_ty), mask=in_row)


def softmax_cross_entropy_triton_(
    logits: torch.Tensor,
    targets: torch.Tensor,
    weights: torch.Tensor,
    exclude_index: int | None,
    write_grad: bool,
) -> torch.Tensor:
    n, vocab = logits.shape
    if logits.stride(1) != 1:
        raise ValueError("logits rows must be contiguous")
    loss = torch.empty(n, dtype=torch.float32, device=logits.device)
    if n == 0:
        return loss
    _softmax_cross_entropy_kernel[(n,)](
        logits,
        logits.stride(0),
        targets.contiguous(),
        weights.contiguous(),
        loss,
        vocab,
        -1 if exclude_index is None else int(exclude_index),
        HAS_EXCLUDE=exclude_index is not None,
        WRITE_GRAD=write_grad,
        BLOCK=_BLOCK,
        num_warps=8,
    )
    return loss
