"""Check a freshly loaded native op against its torch reference (forward and backward).

Run by every build before its library is packed, and by the tests. Shapes are small: this proves
the library computes the same function, it is not a benchmark.
"""

from __future__ import annotations

from turbo_dllm.errors import DllmError, print_error

__all__ = [
    "compare_block_diffusion_attention",
    "compare_merge_attention_partials",
    "self_test",
    "self_test_triton",
    "warm_block_diffusion_attention",
]


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


def block_diffusion_tokens(seq_len: int, block_size: int, batch: int, doc_cut: int | None):
    """Metadata (noisy, block, doc) of the 2L stream [x_t ; x_0]; row 1 splits at `doc_cut`."""
    import torch

    pos = torch.arange(seq_len)
    noisy = torch.cat(
        [torch.ones(seq_len, dtype=torch.bool), torch.zeros(seq_len, dtype=torch.bool)]
    )
    block = torch.cat([pos // block_size, pos // block_size])
    doc = torch.zeros(batch, seq_len, dtype=torch.long)
    if doc_cut is not None and batch > 1:
        doc[1, doc_cut:] = 1
    return noisy, block, torch.cat([doc, doc], dim=1)


def compare_block_diffusion_attention(
    backend: str = "jit",
    *,
    device: str = "cuda",
    dtype=None,
    seq_len: int = 512,
    block_size: int = 32,
    batch: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 64,
    doc_cut: int | None = 200,
    seed: int = 0,
    config=None,
) -> dict[str, float]:
    """Max abs error / max abs reference, per output and gradient, kernel vs reference."""
    import torch

    from turbo_dllm.kernels.block_diffusion import (
        block_diffusion_attention,
        plan_block_diffusion_attention,
    )

    dtype = dtype or torch.bfloat16
    meta = [t.to(device) for t in block_diffusion_tokens(seq_len, block_size, batch, doc_cut)]
    kernel = plan_block_diffusion_attention(*meta, *meta, backend=backend, config=config)
    reference = plan_block_diffusion_attention(*meta, *meta, backend="reference")
    gen = torch.Generator().manual_seed(seed)
    s = 2 * seq_len

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    q = randn(batch, heads, s, head_dim)
    k, v = randn(batch, kv_heads, s, head_dim), randn(batch, kv_heads, s, head_dim)
    grad_out = torch.randn(batch, heads, s, head_dim, generator=gen).to(device)
    grad_lse = torch.randn(batch, heads, s, generator=gen).to(device)

    def run(plan):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out, lse = block_diffusion_attention(*leaves, plan)
        finite = torch.isfinite(lse)
        loss = (out.float() * grad_out).sum() + (torch.where(finite, lse, 0) * grad_lse).sum()
        loss.backward()
        return [out, lse, *(leaf.grad for leaf in leaves)]

    errors = {}
    for name, g, w in zip(
        ("out", "lse", "dq", "dk", "dv"), run(kernel), run(reference), strict=True
    ):
        g, w = g.detach().float(), w.detach().float()
        if torch.isnan(g).any() or not torch.equal(torch.isinf(g), torch.isinf(w)):
            raise AssertionError(f"{name}: NaN or infinities where the reference has none")
        finite = torch.isfinite(w)
        errors[name] = float((g - w)[finite].abs().max() / w[finite].abs().max().clamp(min=1e-6))
    return errors


def self_test_triton(op: str, backend: str = "jit", tolerance: float = 3e-2) -> str:
    """Compile and check a Triton op on this host's GPU; DllmError on a mismatch."""
    import torch

    if op != "block_diffusion_attention":
        raise RuntimeError(f"no self-test for Triton op {op!r}")
    if not torch.cuda.is_available():
        return f"{op}: no GPU on this host; its Triton kernels compile on first use"
    worst = {}
    for head_dim in (64, 128):
        errors = compare_block_diffusion_attention(backend, head_dim=head_dim)
        worst[head_dim] = max(errors.values())
        if worst[head_dim] > tolerance:
            raise DllmError(
                f"{op} (head dim {head_dim}) differs from the reference by {worst[head_dim]:.3g} "
                f"({errors})",
                hint="the kernels are wrong for this GPU/Triton; do not ship them",
            )
    warmed = warm_block_diffusion_attention(backend)
    return (
        f"{op}: matches the reference on {torch.cuda.get_device_name()} (worst {worst}); "
        f"{warmed} kernel variants compiled"
    )


def _bshd_as_bhsd(shape, *, contiguous: bool):
    """A random (B, S, H, D) tensor seen as (B, H, S, D): the model's view, or a copy."""
    import torch

    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    return (x.contiguous() if contiguous else x).requires_grad_(True)


def warm_block_diffusion_attention(backend: str = "jit") -> int:
    """Launch forward and backward in every kernel variant training reaches (head dims 64 and
    128; a stream length 2L that is a multiple of 16 and one that is not, the kernels' two
    specialisations; one doc row for the batch or one per row; grouped or plain heads; q/k/v
    contiguous or as the model's (B, S, H, D) views; with and without a gradient through the
    lse), so the compiled kernels a bundle ships (bundles/triton_cache.py) cover what runs.
    Returns the number of variants launched."""
    import itertools

    import torch

    from turbo_dllm.kernels.block_diffusion import (
        block_diffusion_attention,
        plan_block_diffusion_attention,
    )

    heads = 4
    variants = itertools.product(
        (64, 128), (256, 260), (1, 2), (1, 2), (False, True), (False, True)
    )
    count = 0
    for head_dim, seq_len, batch, group, model_layout, through_lse in variants:
        meta = [t.cuda() for t in block_diffusion_tokens(seq_len, 32, batch, 100)]
        plan = plan_block_diffusion_attention(*meta, *meta, backend=backend)

        q, k, v = (
            _bshd_as_bhsd((batch, 2 * seq_len, n, head_dim), contiguous=not model_layout)
            for n in (heads, heads // group, heads // group)
        )
        out, lse = block_diffusion_attention(q, k, v, plan)
        loss = out.float().sum() + (torch.nan_to_num(lse, neginf=0.0).sum() if through_lse else 0)
        loss.backward()
        count += 1
    torch.cuda.synchronize()
    return count


def _main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m turbo_dllm.kernels.selftest")
    parser.add_argument("--op", required=True)
    args = parser.parse_args(argv)
    try:
        print(self_test_triton(args.op))
    except DllmError as error:
        print_error(error.message, error.hint)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
