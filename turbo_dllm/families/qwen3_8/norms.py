"""The hybrid's two RMSNorms as autograd Functions that keep x, not its float32 copies.

Written as plain ops, a bf16 norm keeps for its backward the float32 copy of x, the normalised
float32 x and (the gated one) float32 copies of the gate and of silu(gate): 10-14 bytes a value
where x itself is 2. These keep x (and the gate) in their own dtype plus the per-row rsqrt, and
rebuild the rest in the backward. The forward runs the very ops of the plain form, so outputs are
bitwise the same; the gradients are the same formulas (they differ from autograd's at rounding).
Tensor-parallel DTensors (sequence parallelism hands the norms sharded ones) take the plain form.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

__all__ = ["gated_rms_norm", "zero_centered_rms_norm"]


def _rstd(xf: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)


def _norm_backward(grad_normed: torch.Tensor, normed: torch.Tensor, rstd: torch.Tensor):
    """d/dx of normed = x * rsqrt(mean(x^2) + eps), given the gradient of `normed` (float32)."""
    return rstd * (grad_normed - normed * (grad_normed * normed).mean(-1, keepdim=True))


def _weight_grad(product: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return product.reshape(-1, product.shape[-1]).sum(0).to(weight.dtype)


def _zero_centered(x, weight, eps):
    """(output, per-row rsqrt): the plain form, which the Function's forward runs too."""
    xf = x.float()
    rstd = _rstd(xf, eps)
    return (xf * rstd * (1.0 + weight.float())).to(x.dtype), rstd


def _gated(x, gate, weight, eps):
    """(output, per-row rsqrt): the plain form, which the Function's forward runs too."""
    xf = x.float()
    rstd = _rstd(xf, eps)
    return (weight * (xf * rstd).to(x.dtype) * F.silu(gate.float())).to(x.dtype), rstd


class _ZeroCenteredRMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        out, rstd = _zero_centered(x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        return out

    @staticmethod
    def backward(ctx, grad):
        x, weight, rstd = ctx.saved_tensors
        g, normed = grad.float(), x.float() * rstd
        grad_x = _norm_backward(g * (1.0 + weight.float()), normed, rstd).to(x.dtype)
        return grad_x, _weight_grad(g * normed, weight), None


class _GatedRMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, gate, weight, eps):
        out, rstd = _gated(x, gate, weight, eps)
        ctx.save_for_backward(x, gate, weight, rstd)
        return out

    @staticmethod
    def backward(ctx, grad):
        x, gate, weight, rstd = ctx.saved_tensors
        g, gf = grad.float(), gate.float()
        normed = x.float() * rstd
        sigmoid = torch.sigmoid(gf)
        silu = gf * sigmoid
        scaled = weight.float() * normed.to(x.dtype).float()  # weight * normed, as the forward
        grad_gate = (g * scaled * sigmoid * (1.0 + gf * (1.0 - sigmoid))).to(gate.dtype)
        grad_x = _norm_backward(g * silu * weight.float(), normed, rstd).to(x.dtype)
        grad_weight = _weight_grad(g * silu * normed.to(x.dtype).float(), weight)
        return grad_x, grad_gate, grad_weight, None


def _plain(*tensors) -> bool:
    return not any(isinstance(t, DTensor) for t in tensors)


def zero_centered_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + eps) * (1 + weight), in float32, back to x's dtype."""
    if _plain(x, weight) and torch.is_grad_enabled():
        return _ZeroCenteredRMSNorm.apply(x, weight, eps)
    return _zero_centered(x, weight, eps)[0]


def gated_rms_norm(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """weight * RMSNorm(x) (cast to x's dtype) * silu(gate), back to x's dtype."""
    if _plain(x, gate, weight) and torch.is_grad_enabled():
        return _GatedRMSNorm.apply(x, gate, weight, eps)
    return _gated(x, gate, weight, eps)[0]
