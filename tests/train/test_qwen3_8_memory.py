"""What qwen3_8 keeps for its backward: no more than transformers' model, same results.

The 2026-12-02 H200 run peaked at 141.5 GB for ours with no checkpointing, where transformers'
model ran out of memory without it (docs/benchmarks.md). On CPU the torch chunked Gated DeltaNet's
intermediates were most of it; the linear layers now keep only the mixing's inputs and rerun it
in the backward, and the norms keep x instead of its float32 copies.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import benchmark_module
from turbo_dllm.families.qwen3_8 import model as hybrid
from turbo_dllm.families.qwen3_8.norms import gated_rms_norm, zero_centered_rms_norm
from turbo_dllm.families.qwen3_8.runtime import build_model
from turbo_dllm.registry import get_family
from turbo_dllm.train.attention import BlockDiffusionLayout, dense_mask
from turbo_dllm.train.objectives import NoiseKey
from turbo_dllm.train.objectives.base import score
from turbo_dllm.train.objectives.fast_dllm_v2 import FastDllmV2
from turbo_dllm.train.weights import materialize

transformers = pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[2]

# The preset's layer mix (three Gated DeltaNet layers, then full attention), value heads three
# per key head as in qwen3.8-27b, and its 64-token blocks (= the chunk).
SHAPE = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "linear_num_key_heads": 1,
    "linear_num_value_heads": 3,
    "linear_key_head_dim": 32,
    "linear_value_head_dim": 32,
}
L, BLOCK = 256, 64


def attend(q, k, v, mask):  # both sides: SDPA with the same dense block-diffusion mask
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def _batch(objective):
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, SHAPE["vocab_size"] - 1, (1, L), generator=gen)
    batch = {"input_ids": ids, "loss_mask": torch.ones_like(ids, dtype=torch.bool)}
    return batch, objective.corrupt(batch, NoiseKey(0, 0, 0, 1))


def saved_by_both(device: str = "cpu", dtype: torch.dtype = torch.float32) -> tuple[int, int]:
    """(ours, transformers') bytes saved by one training forward of the same batch, parameters
    left out. bf16 on CUDA: ours under the trainer's autocast, transformers' as the benchmark
    runs it (bf16 weights, no autocast)."""
    config = get_family("qwen3_8").resolve_config(path=None, from_config="tiny", overrides=SHAPE)
    ours = materialize(build_model(config, attend, dtype), torch.device(device), seed=0).train()
    objective = FastDllmV2(block_size=BLOCK, mask_token_id=SHAPE["vocab_size"] - 1)
    batch, diffusion = _batch(objective)
    diffusion = diffusion.to(device)
    layout = diffusion.layout
    rows = diffusion.input_ids.shape[0]
    mask = dense_mask(layout, device=device).expand(rows, -1, -1, -1)
    # counts distinct storages, parameters left out
    SavedBytes = benchmark_module("saved_activations").SavedBytes
    hf_block_diffusion_loss = benchmark_module("train_step").hf_block_diffusion_loss

    autocast = device == "cuda" and dtype == torch.bfloat16
    with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
        with SavedBytes(ours, ()).counting() as saved:
            ours(
                diffusion.input_ids,
                layout.positions(device),
                hybrid.HybridMask(mask, layout),
                output=partial(score, diffusion),
            )
    ours_bytes = saved.total

    hf_config = transformers.Qwen3_5TextConfig(
        **{k: v for k, v in config.to_hf_dict().items() if k != "architectures"}
    )
    torch.manual_seed(0)
    with torch.device(device):
        hf = transformers.AutoModelForCausalLM.from_config(
            hf_config, attn_implementation="sdpa", dtype=dtype
        )
    hf.train()
    hf_mask = {"full_attention": mask, "linear_attention": None}
    with SavedBytes(hf, ()).counting() as saved:
        hf_block_diffusion_loss(hf, objective, batch, diffusion, hf_mask, device)
    return ours_bytes, saved.total


def test_a_training_forward_keeps_less_than_transformers_on_the_same_batch():
    ours_bytes, hf_bytes = saved_by_both()
    # Measured here (float32, transformers 5.24): 1.56x transformers' before (the linear
    # layers' chunked intermediates, per chunk and again per noisy block, were 70 % of ours),
    # 0.47x with the mixing rerun in the backward, 0.37x with the norms keeping x as well. The
    # bound fails either one undone, with room for transformers' side to move a little.
    assert ours_bytes < 0.45 * hf_bytes, (ours_bytes, hf_bytes)


def _plain_zero_centered(x, weight, eps):
    xf = x.float()
    normed = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    return (normed * (1.0 + weight.float())).to(x.dtype)


def _plain_gated(x, gate, weight, eps):
    xf = x.float()
    normed = (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)).to(x.dtype)
    return (weight * normed * F.silu(gate.float())).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_functions_give_the_plain_forms_outputs_bitwise_and_their_gradients(dtype):
    gen = torch.Generator().manual_seed(0)
    x, gate = (torch.randn(2, 5, 3, 16, generator=gen).to(dtype).requires_grad_() for _ in "xz")
    weight = (1 + 0.3 * torch.randn(16, generator=gen)).to(dtype).requires_grad_()
    grad = torch.randn(2, 5, 3, 16, generator=gen).to(dtype)
    cases = [
        (zero_centered_rms_norm, _plain_zero_centered, (x, weight)),
        (gated_rms_norm, _plain_gated, (x, gate, weight)),
    ]
    tolerance = (
        {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    )
    for ours, plain, inputs in cases:
        got, want = ours(*inputs, 1e-6), plain(*inputs, 1e-6)
        assert torch.equal(got, want)
        for a, b in zip(
            torch.autograd.grad(got, inputs, grad),
            torch.autograd.grad(want, inputs, grad),
            strict=True,
        ):
            assert a.dtype == b.dtype
            torch.testing.assert_close(a, b, **tolerance)


def assert_rerun_changes_nothing(monkeypatch, device, dtype, layout, autocast=None):
    """A linear layer's output and every gradient are bitwise the same with the mixing rerun in
    the backward and with it kept (the `_recomputed` hook bypassed)."""
    config = get_family("qwen3_8").resolve_config(path=None, from_config="tiny", overrides=SHAPE)
    model = materialize(build_model(config, attend, dtype), torch.device(device), seed=0)
    layer = model.model.layers[0].linear_attn
    gen = torch.Generator(device=device).manual_seed(2)
    x = torch.randn(2, 256, SHAPE["hidden_size"], generator=gen, device=device)
    x = x.to(dtype or torch.float32).requires_grad_()
    grad = torch.randn(2, 256, SHAPE["hidden_size"], generator=gen, device=device).to(x.dtype)

    def gradients():
        with torch.autocast(device, dtype=autocast, enabled=autocast is not None):
            out = layer(x, hybrid.HybridMask(None, layout))
        return out, torch.autograd.grad(out, (x, *layer.parameters()), grad)

    rerun_out, rerun = gradients()
    monkeypatch.setattr(hybrid.GatedDeltaNet, "_recomputed", lambda self, fn, *args: fn(*args))
    kept_out, kept = gradients()
    assert torch.equal(rerun_out, kept_out)
    for a, b in zip(rerun, kept, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("layout", [None, BlockDiffusionLayout(128, 64)])
def test_rerunning_the_mixing_in_the_backward_changes_no_gradient(monkeypatch, layout):
    assert_rerun_changes_nothing(monkeypatch, "cpu", None, layout)
