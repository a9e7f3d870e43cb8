"""The Python side of each native op: fake (meta) kernels and autograd, per torch.ops namespace.

The C++ library defines an op's schema and its CPU/CUDA kernels; this module makes it a full
torch custom op once loaded: `register_fake` (shapes for torch.compile and meta tensors) and
`register_autograd` (backward through the op's `_backward` kernel).
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["OPS", "op_handle", "register_python_side"]

_REGISTERED: set[tuple[str, str]] = set()


def _register_merge_attention_partials(namespace: str) -> None:
    import torch

    forward = f"{namespace}::merge_attention_partials"
    backward = f"{namespace}::merge_attention_partials_backward"

    @torch.library.register_fake(forward)
    def _fake_forward(out_a, lse_a, out_b, lse_b):
        return torch.empty_like(out_a), torch.empty_like(lse_a)

    @torch.library.register_fake(backward)
    def _fake_backward(grad_out, grad_lse, out_a, lse_a, out_b, lse_b):
        return (
            torch.empty_like(out_a),
            torch.empty_like(lse_a),
            torch.empty_like(out_b),
            torch.empty_like(lse_b),
        )

    backward_op = getattr(torch.ops, namespace).merge_attention_partials_backward

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    def grad(ctx, grad_out, grad_lse):
        return tuple(backward_op(grad_out, grad_lse, *ctx.saved_tensors))

    torch.library.register_autograd(forward, grad, setup_context=setup_context)


# op name -> function registering its Python side for one namespace
OPS: dict[str, Callable[[str], None]] = {
    "merge_attention_partials": _register_merge_attention_partials,
}


def register_python_side(op: str, namespace: str) -> None:
    """Idempotent: a namespace's op is registered once per process."""
    if (op, namespace) in _REGISTERED:
        return
    if op not in OPS:
        raise RuntimeError(f"no Python registration for native op {op!r}")
    OPS[op](namespace)
    _REGISTERED.add((op, namespace))


def op_handle(op: str, namespace: str):
    """`torch.ops.<namespace>.<op>` (the library must be loaded)."""
    import torch

    return getattr(getattr(torch.ops, namespace), op)
