"""qwen3_8's saved-for-backward bytes on CUDA under the trainer's real autocast (the CPU test and
benchmarks/saved_activations.py emulate it), and the mixing's rerun there changes no gradient."""

from __future__ import annotations

import pytest
import torch

from tests.train import test_qwen3_8_memory as memory
from turbo_dllm.families.qwen3_8 import model as hybrid
from turbo_dllm.families.qwen3_8.runtime import build_model
from turbo_dllm.registry import get_family
from turbo_dllm.train.weights import materialize

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_a_bf16_autocast_forward_keeps_less_than_transformers():
    ours, theirs = memory.saved_by_both("cuda", torch.bfloat16)
    # CPU-autocast estimate at the scaled benchmark shape: 0.36x (docs/benchmarks.md).
    assert ours < 0.5 * theirs, (ours, theirs)


def test_rerunning_the_mixing_under_autocast_changes_no_gradient(monkeypatch):
    config = get_family("qwen3_8").resolve_config(
        path=None, from_config="tiny", overrides=memory.SHAPE
    )
    model = materialize(
        build_model(config, memory.attend, torch.bfloat16), torch.device("cuda"), seed=0
    )
    layer = model.model.layers[0].linear_attn
    gen = torch.Generator(device="cuda").manual_seed(2)
    x = torch.randn(2, 256, config.hidden_size, generator=gen, device="cuda")
    x = x.to(torch.bfloat16).requires_grad_()
    grad = torch.randn(2, 256, config.hidden_size, generator=gen, device="cuda").to(x.dtype)
    layout = memory.BlockDiffusionLayout(128, 64)

    def gradients():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = layer(x, hybrid.HybridMask(None, layout))
        return out, torch.autograd.grad(out, (x, *layer.parameters()), grad)

    rerun_out, rerun = gradients()
    monkeypatch.setattr(hybrid.GatedDeltaNet, "_recomputed", lambda self, fn, *args: fn(*args))
    kept_out, kept = gradients()
    assert torch.equal(rerun_out, kept_out)
    for a, b in zip(rerun, kept, strict=True):
        assert torch.equal(a, b)
