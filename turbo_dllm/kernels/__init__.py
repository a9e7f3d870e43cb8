"""Kernel ops with three backends: `reference` (pure torch), `native` (the active bundle), `jit`.

    from turbo_dllm.kernels import merge_attention_partials
    out, lse = merge_attention_partials(out_a, lse_a, out_b, lse_b, backend="native")

The Triton op `block_diffusion_attention` (a per-step plan, then one call per layer) lives in
`turbo_dllm.kernels.block_diffusion`, with the same reference / native / jit backends.

Importing this package is cheap; nothing is loaded or built until an op is first called with a
native or jit backend. A native op that cannot be used raises a DllmError with the fixing
command: there is never a silent fallback to the reference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

__all__ = ["BACKENDS", "Backend", "merge_attention_partials"]

Backend = Literal["reference", "native", "jit"]
BACKENDS: tuple[str, ...] = ("reference", "native", "jit")


def merge_attention_partials(
    out_a: torch.Tensor,
    lse_a: torch.Tensor,
    out_b: torch.Tensor,
    lse_b: torch.Tensor,
    backend: Backend = "reference",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two partial attention results by their log-sum-exp -> (out, lse).

    out_*: (..., S, D) any float dtype (the same for both); lse_*: (..., S) float32
    natural-log sum-exp. A side with lse = -inf (fully masked) weighs 0; both -inf give out 0
    and lse -inf, never NaN. Differentiable in all four inputs.
    """
    from turbo_dllm.kernels import reference

    if backend == "reference":
        return reference.merge_attention_partials(out_a, lse_a, out_b, lse_b)
    reference._check(out_a, lse_a, out_b, lse_b)
    from turbo_dllm.kernels.dispatch import resolve_namespace
    from turbo_dllm.kernels.ops import op_handle

    namespace = resolve_namespace("merge_attention_partials", backend, out_a.device.type)
    out, lse = op_handle("merge_attention_partials", namespace)(out_a, lse_a, out_b, lse_b)
    return out, lse
