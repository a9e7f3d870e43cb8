"""merge_attention_partials on a GPU: the native CUDA kernel (from an installed sm90 bundle) and
the JIT build, against the torch reference, forward and backward.

The native tests need the DLLM_HOME where `ci/gpu_qualify.sh` installed the bundle:
    DLLM_GPU_TEST_HOME=$DLLM_HOME python -m pytest -q tests/gpu/test_merge_attention_gpu.py
"""

from __future__ import annotations

import functools
import os
import time

import pytest
import torch

from turbo_dllm.kernels import merge_attention_partials, reference
from turbo_dllm.kernels.selftest import _random_partials, compare_merge_attention_partials

pytestmark = pytest.mark.gpu

native = functools.partial(merge_attention_partials, backend="native")
TOLERANCE = {torch.float32: 2e-5, torch.float64: 2e-5, torch.bfloat16: 3e-2, torch.float16: 3e-3}


@pytest.fixture
def qualified_home(monkeypatch):
    home = os.environ.get("DLLM_GPU_TEST_HOME")
    if not home:
        pytest.skip("set DLLM_GPU_TEST_HOME to the DLLM_HOME holding the installed sm90 bundle")
    monkeypatch.setenv("DLLM_HOME", home)
    return home


def test_active_bundle_serves_this_gpu(qualified_home):
    from turbo_dllm.bundles.store import active_bundle
    from turbo_dllm.host import GpuArch

    bundle = active_bundle()
    assert bundle is not None and bundle.target.kind == "cuda"
    major, minor = torch.cuda.get_device_capability()
    assert GpuArch(major, minor) in bundle.target.archs
    op = bundle.manifest.op("merge_attention_partials")
    assert op is not None and "cuda" in op.devices
    print(
        f"\nactive bundle {bundle.bundle_id} ({bundle.short_sha}) on {torch.cuda.get_device_name()}"
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("shape", [(2, 3, 37, 40), (1, 8, 256, 64), (2, 4, 129, 128), (3, 5, 256)])
def test_native_cuda_matches_reference(qualified_home, dtype, shape):
    for seed in range(2):
        errors = compare_merge_attention_partials(
            native, device="cuda", dtype=dtype, shape=shape, seed=seed
        )
        assert max(errors.values()) <= TOLERANCE[dtype], errors


def test_native_cuda_matches_native_cpu(qualified_home):
    g = torch.Generator().manual_seed(3)
    inputs = _random_partials((2, 4, 100, 128), torch.float32, "cpu", g)
    cpu_out, cpu_lse = native(*inputs)
    gpu_out, gpu_lse = native(*(t.cuda() for t in inputs))
    torch.testing.assert_close(gpu_out.cpu(), cpu_out, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(gpu_lse.cpu(), cpu_lse, atol=1e-6, rtol=1e-5)


def test_native_cuda_strided_large_and_other_devices(qualified_home):
    g = torch.Generator().manual_seed(4)
    base = torch.randn(2, 16, 2048, 2 * 128, generator=g).cuda().to(torch.bfloat16)
    out_a, out_b = base[..., :128], base[..., 128:]  # non-contiguous halves of one buffer
    lse_a = (torch.randn(2, 16, 2048, generator=g) * 4).cuda()
    lse_b = (torch.randn(2, 16, 2048, generator=g) * 4).cuda()
    lse_b[:, :, ::7] = float("-inf")
    got = native(out_a, lse_a, out_b, lse_b)
    want = reference.merge_attention_partials(out_a, lse_a, out_b, lse_b)
    torch.testing.assert_close(got[0].float(), want[0].float(), atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(got[1], want[1])
    if torch.cuda.device_count() > 1:  # the device guard: inputs on cuda:1
        moved = [t.to("cuda:1") for t in (out_a, lse_a, out_b, lse_b)]
        out, lse = native(*moved)
        assert out.device == torch.device("cuda:1")
        torch.testing.assert_close(out.float().cpu(), got[0].float().cpu())


def test_native_cuda_under_torch_compile(qualified_home):
    g = torch.Generator().manual_seed(5)
    inputs = [
        t.requires_grad_(True) for t in _random_partials((4, 64, 64), torch.float32, "cuda", g)
    ]
    step = torch.compile(lambda *xs: native(*xs)[0].square().sum(), fullgraph=True)
    step(*inputs).backward()
    ref = [t.detach().clone().requires_grad_(True) for t in inputs]
    reference.merge_attention_partials(*ref)[0].square().sum().backward()
    # Inductor fuses the loss's backward differently from eager: float32 rounding of the lse
    # gradient (a sum over D) differs by ~1e-5, as in the uncompiled float32 comparison.
    tol = TOLERANCE[torch.float32]
    for a, b in zip(inputs, ref, strict=True):
        torch.testing.assert_close(a.grad, b.grad, atol=tol, rtol=tol)


def _time(fn, repeats=20):
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


def test_native_cuda_speed_report(qualified_home):
    """Prints forward+backward time and effective bandwidth, native vs reference (no assert on
    speed: this is a report for the qualification log, correctness is checked above)."""
    shape = (8, 32, 4096, 128)  # batch, heads, rows, head dim: 128M elements per partial
    out_a, out_b = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    lse_a, lse_b = (torch.randn(shape[:-1], device="cuda") for _ in range(2))
    grad = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    leaves = [t.requires_grad_(True) for t in (out_a, lse_a, out_b, lse_b)]

    def run(fn):
        def step():
            for leaf in leaves:
                leaf.grad = None
            out, lse = fn(*leaves)
            torch.autograd.backward([out, lse], [grad, torch.ones_like(lse)])

        return step

    native_s = _time(run(native))
    reference_s = _time(run(reference.merge_attention_partials))
    # bytes moved (bf16 outs, fp32 lse): fwd reads 2 outs + writes 1; bwd reads 3 + writes 2.
    moved = out_a.numel() * 2 * (3 + 5) + lse_a.numel() * 4 * 8
    print(
        f"\nmerge_attention_partials fwd+bwd {shape} bf16: native {native_s * 1e3:.2f} ms "
        f"({moved / native_s / 1e12:.2f} TB/s effective), reference {reference_s * 1e3:.2f} ms, "
        f"speedup {reference_s / native_s:.2f}x"
    )
    assert native_s > 0


@pytest.mark.slow
def test_jit_cuda_build_matches_reference(monkeypatch, tmp_path):
    monkeypatch.setenv("DLLM_HOME", str(tmp_path))
    jit = functools.partial(merge_attention_partials, backend="jit")
    for dtype in (torch.float32, torch.bfloat16):
        errors = compare_merge_attention_partials(
            jit, device="cuda", dtype=dtype, shape=(2, 4, 65, 128)
        )
        assert max(errors.values()) <= TOLERANCE[dtype], errors
