"""The LM-head cross-entropy on CUDA: the Triton softmax-gradient kernel against the torch one."""

from __future__ import annotations

import pytest
import torch

from turbo_dllm.train.losses import linear_cross_entropy
from turbo_dllm.train.softmax_grad import (
    softmax_cross_entropy_,
    softmax_cross_entropy_reference_,
)

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda", 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", [1000, 4096, 151936])  # below, at and over the kernel block
@pytest.mark.parametrize("exclude", [None, 7])
def test_triton_kernel_matches_the_torch_reference(dtype, vocab, exclude):
    torch.manual_seed(0)
    n = 65
    z = (torch.randn(n, vocab, device=CUDA) * 4).to(dtype)
    targets = torch.randint(0, vocab, (n,), device=CUDA)
    if exclude is not None:
        targets[targets == exclude] = 0
    weights = torch.rand(n, device=CUDA) + 0.5
    ours, ref = z.clone(), z.clone()
    loss = softmax_cross_entropy_(ours, targets, weights, exclude, write_grad=True)
    expected = softmax_cross_entropy_reference_(ref, targets, weights, exclude, write_grad=True)
    torch.testing.assert_close(loss, expected.float(), rtol=1e-4, atol=1e-4)
    tol = 1e-6 if dtype == torch.float32 else 8e-3  # one bf16 rounding of values below 1
    torch.testing.assert_close(ours.float(), ref.float(), rtol=0, atol=tol)
    if exclude is not None:
        assert torch.all(ours[:, exclude] == 0)
    # Rows of the gradient sum to zero (softmax sums to one, minus the one-hot).
    assert ours.float().sum(1).abs().max() < (1e-4 if dtype == torch.float32 else 2e-2)
    unchanged = z.clone()
    again = softmax_cross_entropy_(unchanged, targets, weights, exclude, write_grad=False)
    torch.testing.assert_close(again, loss)
    assert torch.equal(unchanged, z)


def test_bf16_linear_cross_entropy_matches_float64_dense():
    """The whole chunked loss on CUDA (Triton kernel, bf16 GEMMs accumulated into a float32
    weight gradient over several chunks) against float64 autograd."""
    torch.manual_seed(0)
    N, H, V = 3000, 256, 50_000
    hidden = torch.randn(N, H, device=CUDA, dtype=torch.float64) / 8
    weight = torch.randn(V, H, device=CUDA, dtype=torch.float64) / 8
    targets = torch.randint(0, V, (N,), device=CUDA)
    token_weights = torch.rand(N, device=CUDA) + 0.5
    h = hidden.bfloat16().requires_grad_(True)
    w = weight.float().requires_grad_(True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        got = linear_cross_entropy(h, w, targets, token_weights, exclude_index=3, chunk_size=1024)
    got.backward()
    h64, w64 = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    logits = (h64 @ w64.t()).index_fill(1, torch.tensor([3], device=CUDA), float("-inf"))
    ce = torch.nn.functional.cross_entropy(logits, targets, reduction="none")
    expected = (ce * token_weights.double()).sum()
    expected.backward()
    assert got.dtype == torch.float32 and w.grad.dtype == torch.float32
    torch.testing.assert_close(got.double(), expected.detach(), rtol=2e-3, atol=0)
    torch.testing.assert_close(h.grad.double(), h64.grad, rtol=0.05, atol=2e-3)
    torch.testing.assert_close(w.grad.double(), w64.grad, rtol=0.05, atol=2e-3)
