"""DiffusionGemma on CUDA: flex equals reference on the canvas masks, and bf16 training runs."""

from __future__ import annotations

import pytest
import torch

from tests.families.dg_util import ours, tiny_hf_dict
from tests.train.util import losses, tiny_spec
from turbo_dllm.train.attention import CanvasLayout, FlexAttention, ReferenceAttention
from turbo_dllm.train.entry import train

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda", 0)


def test_flex_logits_equal_reference_logits():
    # (FlexAttention's CUDA kernels take head dims of 16 and more)
    model, _ = ours(hf=tiny_hf_dict(sliding_window=40, head_dim=16, global_head_dim=32), seed=0)
    model = model.to(CUDA)
    layout = CanvasLayout(256, 32, 40)
    torch.manual_seed(0)
    ids = torch.randint(0, 97, (2, layout.stream_len), device=CUDA)
    outs = []
    for base in (ReferenceAttention(), FlexAttention(compile=True)):
        from turbo_dllm.families.diffusion_gemma.attention import StreamAttention

        attention = StreamAttention(base, model.config)
        model.set_attention(attention)
        with torch.no_grad():
            mask = attention.prepare(layout, None, CUDA)
            outs.append(model(ids, layout.positions(CUDA), mask))
    torch.testing.assert_close(outs[1], outs[0], atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("compiled_layer", [False, True])
def test_flex_takes_512_wide_heads_forward_and_backward(compiled_layer):
    """DiffusionGemma's full-attention heads are 512 wide: torch's default forward tiles ask for
    more shared memory than a Hopper block has (flex_kernel_options keeps them in), alone and
    inside a compiled layer. Output and every gradient equal the reference's."""
    layout = CanvasLayout(512, 64, 128)
    torch.manual_seed(0)
    q = torch.randn(1, 4, layout.stream_len, 512, device=CUDA, dtype=torch.bfloat16)
    k, v = (
        torch.randn(1, 2, layout.stream_len, 512, device=CUDA, dtype=torch.bfloat16) for _ in "kv"
    )
    results = []
    for backend in (ReferenceAttention(), FlexAttention(compile=True)):
        mask = backend.prepare(layout, None, CUDA)
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        attend = (
            torch.compile(backend.__call__)
            if compiled_layer and backend.name == "flex"
            else backend
        )
        out = attend(*leaves, mask)
        out.float().square().sum().backward()
        results.append([out.float(), *(t.grad.float() for t in leaves)])
    for got, want in zip(results[1], results[0], strict=True):
        assert ((got - want).norm() / want.norm()).item() < 2e-2


def test_native_sft_trains_with_flex_compile_and_bf16(tmp_path):
    base = {
        "launch": {"seed": 0},
        "model": {
            "family": "diffusion_gemma",
            "from_config": "tiny",
            "attention": "flex",
            "dtype": "bfloat16",
        },
        "objective": {"name": "diffusiongemma_sft", "block_size": 32},
        "data": {"synthetic": {"num_sequences": 32, "vocab_size": 512}, "seq_len": 256},
        "training": {
            "micro_batch_size": 2,
            "steps": 6,
            "compile": True,
            "mlp_chunks": 2,
            "activation_checkpointing": True,
        },
        "optimizer": {"lr": 0.003},
        "scheduler": {"name": "constant", "warmup_steps": 0},
        "checkpoint": {"interval": None},
        "logging": {"console": False},
    }
    train(tiny_spec(base=base), tmp_path)
    trace = losses(tmp_path)
    assert all(torch.isfinite(torch.tensor(trace))) and trace[-1] < trace[0]


def test_context_parallel_flex_equals_reference_on_each_ranks_share():
    """cp's compiled flex mask (the family's predicate on stream indices, a sliding layer's)
    equals the dense reference for every rank's queries over the gathered keys (no collective:
    the attention after the gather; tests/families has the CPU eager-flex check of both kinds)."""
    from turbo_dllm.families.diffusion_gemma.context import GemmaCpAttention, local_stream

    layout = CanvasLayout(256, 32, 40).with_window(40)
    cp = 2
    gathered = torch.cat([local_stream(layout, cp, r)[0] for r in range(cp)])
    torch.manual_seed(0)
    k = torch.randn(2, 2, gathered.numel(), 64, device=CUDA, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    for rank in range(cp):
        local, _ = local_stream(layout, cp, rank)
        q = torch.randn(2, 4, local.numel(), 64, device=CUDA, dtype=torch.bfloat16)
        outs = [
            GemmaCpAttention(layout, local, gathered, None, backend, CUDA)._attend(q, k, v)
            for backend in ("reference", "flex")
        ]
        torch.testing.assert_close(outs[1].float(), outs[0].float(), atol=2e-2, rtol=2e-2)
