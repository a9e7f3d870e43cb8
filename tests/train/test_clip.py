"""Gradient clipping: torch's `clip_grad_norm_`, or the clip factor handed to a fused AdamW."""

from __future__ import annotations

import copy

import pytest
import torch

from turbo_dllm.train.distributed import clip_grad_norm, clip_in_optimizer


def _two_models(scale: float):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    twin = copy.deepcopy(model)
    x = torch.randn(5, 8)
    for m in (model, twin):
        (m(x).square().sum() * scale).backward()
    return model, twin


@pytest.mark.parametrize("scale", [100.0, 1e-4])  # clipped, and under the limit
def test_fused_adamw_clips_as_clip_grad_norm_does(scale):
    model, twin = _two_models(scale)
    fused = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
    plain = torch.optim.AdamW(twin.parameters(), lr=0.1)
    norm = clip_in_optimizer(fused, list(model.parameters()), 0.5)
    expected = clip_grad_norm(list(twin.parameters()), 0.5)
    torch.testing.assert_close(norm, expected)
    assert float(fused.grad_scale) == pytest.approx(max(float(expected) / 0.5, 1.0), rel=1e-5)
    if scale > 1:  # the gradients are scaled by the optimizer, not here
        pairs = zip(model.parameters(), twin.parameters(), strict=True)
        assert all(not torch.equal(a.grad, b.grad) for a, b in pairs)
    fused.step()
    plain.step()
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=1e-7)  # left clipped, too


def test_not_fused_or_no_limit_leaves_the_clip_to_clip_grad_norm():
    model, _ = _two_models(100.0)
    params = list(model.parameters())
    fused = torch.optim.AdamW(params, lr=0.1, fused=True)
    fused.grad_scale = torch.tensor(3.0)  # a previous step's factor must not survive
    assert clip_in_optimizer(fused, params, None) is None
    assert fused.grad_scale is None
    plain = torch.optim.AdamW(params, lr=0.1)
    assert clip_in_optimizer(plain, params, 0.5) is None
    assert getattr(plain, "grad_scale", None) is None
