"""Check a freshly loaded native op against its torch reference (forward and backward).

Run by every build before its library is packed, and by the tests. Shapes are small: this proves
the library computes the same function, it is not a benchmark.
"""

from __future__ import annotations

from turbo_dllm.errors import DllmError

__all__ = ["compare_merge_attention_partials", "self_test"]


def _random_partials(shape, dtype, device, generator, masked: float = 0.2):
    import torch

    *rows, _ = shape
    out_a = torch.randn(shape, generator=generator, device="cpu").to(device=device, dtype=dtype)
    out_b = torch.randn(shape, generator=generator, device="cpu").to(device=device, dtype=dtype)
    lse_a = (torch.randn(rows, generator=generator) * 3).to(device)
    lse_b = (torch.randn(rows, generator=generator) * 3).to(device)
    # Fully masked partials: one side, the other, and both.
    pick = torch.rand(rows, generator=generator).to(device)
    lse_a = torch.where(pick < masked / 2, float("-inf"), lse_a)
    lse_b = torch.where((pick >= masked / 2) & (pick < masked), float("-inf"), lse_b)
    both = torch.rand(rows, generator=generator).to(device) < masked / 4
    lse_a = torch.where(both, float("-inf"), lse_a)
    lse_b = torch.where(both, float("-inf"), lse_b)
    return out_a, lse_a.float(), out_b, lse_b.float()


def compare_merge_attention_partials(
    native, *, device: str = "cpu", dtype=None, shape=(2, 3, 37, 40), seed: int = 0
) -> dict[str, float]:
    """Max abs differences native vs reference, forward and backward, on random inputs."""
    import torch

    from turbo_dllm.kernels import reference

    dtype = dtype or torch.float32
    generator = torch.Generator().manual_seed(seed)
    inputs = _random_partials(shape, dtype, device, generator)
    grad_out = torch.randn(shape, generator=generator).to(device=device, dtype=dtype)
    grad_lse = torch.randn(shape[:-1], generator=generator).to(device)

    def run(fn):
        leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
        out, lse = fn(*leaves)
        finite = torch.isfinite(lse)
        # lse is -inf where both sides are masked; its gradient there is 0 by definition.
        loss = (out.float() * grad_out.float()).sum() + (
            torch.where(finite, lse, 0) * grad_lse
        ).sum()
        loss.backward()
        return [out, lse, *(leaf.grad for leaf in leaves)]

    got, want = run(native), run(reference.merge_attention_partials)
    names = ["out", "lse", "grad_out_a", "grad_lse_a", "grad_out_b", "grad_lse_b"]
    errors: dict[str, float] = {}
    for name, g, w in zip(names, got, want, strict=True):
        g, w = g.detach(), w.detach()
        if g.shape != w.shape or g.dtype != w.dtype:
            raise AssertionError(
                f"{name}: native {g.shape} {g.dtype} vs reference {w.shape} {w.dtype}"
            )
        if torch.isnan(g).any():
            raise AssertionError(f"{name}: native result holds NaN")
        same_inf = torch.equal(torch.isinf(g), torch.isinf(w))
        if not same_inf:
            raise AssertionError(f"{name}: native and reference disagree on infinities")
        finite = torch.isfinite(w)
        errors[name] = float((g.float() - w.float())[finite].abs().max()) if finite.any() else 0.0
    return errors


def self_test(op: str, namespace: str, *, cuda: bool) -> None:
    """Raise DllmError unless the loaded op matches the reference on CPU (and CUDA if present)."""
    import torch

    from turbo_dllm.kernels.ops import op_handle, register_python_side

    if op != "merge_attention_partials":
        raise RuntimeError(f"no self-test for op {op!r}")
    register_python_side(op, namespace)
    handle = op_handle(op, namespace)
    devices = ["cpu"] + (["cuda"] if cuda and torch.cuda.is_available() else [])
    for device in devices:
        for dtype, tolerance in ((torch.float32, 1e-5), (torch.bfloat16, 5e-2)):
            errors = compare_merge_attention_partials(handle, device=device, dtype=dtype)
            worst = max(errors.values())
            if worst > tolerance:
                raise DllmError(
                    f"native {op} on {device} ({dtype}) differs from the reference by {worst:.3g} "
                    f"({errors})",
                    hint="the kernel sources are wrong for this compiler/torch; do not ship it",
                )
