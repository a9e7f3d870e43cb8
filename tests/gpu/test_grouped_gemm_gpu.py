"""DiffusionGemma's experts on CUDA: torch._grouped_mm against the per-expert loop."""

from __future__ import annotations

import pytest
import torch

from turbo_dllm.families.diffusion_gemma.experts import (
    GroupedExperts,
    grouped_gemm_kind,
    grouped_matmul,
)

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda", 0)


def test_bf16_on_hopper_selects_grouped_mm_and_float32_the_loop():
    x = torch.zeros(8, 256, device=CUDA, dtype=torch.bfloat16)
    w = torch.zeros(4, 512, 256, device=CUDA, dtype=torch.bfloat16)
    hopper = torch.cuda.get_device_capability(CUDA) >= (9, 0)
    assert grouped_gemm_kind(x, w) == ("grouped_mm" if hopper else "loop")
    assert grouped_gemm_kind(x.float(), w.float()) == "loop"


@pytest.mark.parametrize("counts", [[5, 0, 17, 42], [0, 0, 64, 0], [1, 1, 1, 1]])
def test_grouped_mm_equals_the_loop_forward_and_backward(counts):
    torch.manual_seed(0)
    x = torch.randn(sum(counts), 256, device=CUDA, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(4, 512, 256, device=CUDA, dtype=torch.bfloat16, requires_grad=True)
    offsets = torch.cumsum(torch.tensor(counts, device=CUDA), 0).to(torch.int32)
    if grouped_gemm_kind(x, w) != "grouped_mm":
        pytest.skip("torch._grouped_mm does not run here (needs sm90+)")
    grad = torch.randn(sum(counts), 512, device=CUDA, dtype=torch.bfloat16)
    outs = {}
    for kind in ("grouped_mm", "loop"):
        x.grad = w.grad = None
        y = grouped_matmul(x, w, offsets, kind)
        y.backward(grad)
        outs[kind] = (y.float(), x.grad.float(), w.grad.float())
    for got, want in zip(outs["grouped_mm"], outs["loop"], strict=True):
        torch.testing.assert_close(got, want, atol=0.5, rtol=2e-2)


def test_experts_module_agrees_across_kinds():
    if torch.cuda.get_device_capability(CUDA) < (9, 0):
        pytest.skip("torch._grouped_mm needs sm90+")
    torch.manual_seed(0)
    experts = GroupedExperts(8, 256, 128, lambda t: torch.nn.functional.gelu(t, approximate="tanh"))
    experts = experts.to(CUDA, torch.bfloat16)
    torch.nn.init.normal_(experts.gate_up_proj, std=0.02)
    torch.nn.init.normal_(experts.down_proj, std=0.02)
    x = torch.randn(300, 256, device=CUDA, dtype=torch.bfloat16)
    index = torch.randint(0, 8, (300, 2), device=CUDA)
    weights = torch.rand(300, 2, device=CUDA)
    results = {}
    for kind in ("grouped_mm", "loop"):
        experts.gemm = kind
        results[kind] = experts(x, weights, index).float()
    torch.testing.assert_close(results["grouped_mm"], results["loop"], atol=2e-2, rtol=2e-2)
