"""Forward KL(target || drafter) through a frozen LM head, without [N, V] logits.

`frozen_linear_kl(hidden, weight, teacher_hidden, token_weights)` = sum_i w_i KL(p_i || q_i)
with p_i = softmax(teacher_hidden_i @ W.T) (the target's distribution) and
q_i = softmax(hidden_i @ W.T) (the drafter's). Rows are walked in chunks: each chunk's two
logit tiles are made, the loss and d/d hidden = w (q - p) @ W computed, and dropped, so the
peak is one chunk of logits. The head is frozen and the teacher has no gradient: the backward
only scales the stored gradient of `hidden`.
"""

from __future__ import annotations

import torch

from turbo_dllm.train.losses import _even_chunks, default_chunk_size

__all__ = ["frozen_linear_argmax", "frozen_linear_kl"]


class _FrozenLinearKL(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, teacher_hidden, token_weights, chunk_size, compute_dtype):
        n = hidden.shape[0]
        w = weight.to(compute_dtype)
        math_dtype = torch.promote_types(compute_dtype, torch.float32)  # never below fp32
        total = torch.zeros((), dtype=math_dtype, device=hidden.device)
        grad = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        for start in range(0, n, chunk_size):
            end = min(start + chunk_size, n)
            draft = (hidden[start:end].to(compute_dtype) @ w.t()).to(math_dtype)
            teacher = (teacher_hidden[start:end].to(compute_dtype) @ w.t()).to(math_dtype)
            log_q = torch.log_softmax(draft, dim=-1)
            log_p = torch.log_softmax(teacher, dim=-1)
            p = log_p.exp()
            scale = token_weights[start:end].to(math_dtype)
            total += (scale * (p * (log_p - log_q)).sum(-1)).sum()
            if grad is not None:
                g = (log_q.exp() - p) * scale[:, None]
                grad[start:end] = (g.to(compute_dtype) @ w).to(hidden.dtype)
            del draft, teacher, log_q, log_p, p
        ctx.save_for_backward(grad)
        return total

    @staticmethod
    def backward(ctx, grad_total):
        (grad,) = ctx.saved_tensors
        gh = None if grad is None else grad * grad_total.to(grad.dtype)
        return gh, None, None, None, None, None


def frozen_linear_kl(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    teacher_hidden: torch.Tensor,
    token_weights: torch.Tensor | None = None,
    *,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """sum_i w_i KL(softmax(t_i W^T) || softmax(h_i W^T)); float32 scalar, grad to `hidden`."""
    if hidden.shape != teacher_hidden.shape or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"shapes do not fit: hidden {tuple(hidden.shape)}, teacher "
            f"{tuple(teacher_hidden.shape)}, weight {tuple(weight.shape)}"
        )
    if token_weights is None:
        token_weights = torch.ones(hidden.shape[0], device=hidden.device)
    autocast = torch.is_autocast_enabled(hidden.device.type)
    compute_dtype = torch.get_autocast_dtype(hidden.device.type) if autocast else hidden.dtype
    if chunk_size is None:
        # two float32 logit tiles (and their softmax math) per chunk
        limit = default_chunk_size(weight.shape[0], element_size=16)
        chunk_size = _even_chunks(hidden.shape[0], limit)
    with torch.autocast(hidden.device.type, enabled=False):
        return _FrozenLinearKL.apply(
            hidden,
            weight.detach(),
            teacher_hidden.detach(),
            token_weights,
            chunk_size,
            compute_dtype,
        )


@torch.no_grad()
def frozen_linear_argmax(
    hidden: torch.Tensor, weight: torch.Tensor, *, chunk_size: int | None = None
) -> torch.Tensor:
    """(N,) long: argmax_v (hidden_i @ W.T)_v, in row chunks (one chunk of logits at a time)."""
    autocast = torch.is_autocast_enabled(hidden.device.type)
    dtype = torch.get_autocast_dtype(hidden.device.type) if autocast else hidden.dtype
    if chunk_size is None:
        limit = default_chunk_size(weight.shape[0], element_size=hidden.element_size())
        chunk_size = _even_chunks(hidden.shape[0], limit)
    w = weight.detach().to(dtype).t()
    out = torch.empty(hidden.shape[0], dtype=torch.long, device=hidden.device)
    with torch.autocast(hidden.device.type, enabled=False):
        for start in range(0, hidden.shape[0], chunk_size):
            end = min(start + chunk_size, hidden.shape[0])
            out[start:end] = (hidden[start:end].to(dtype) @ w).argmax(-1)
    return out
