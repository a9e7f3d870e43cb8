"""The canvas pattern: the predicate by hand, flex equals reference, the pair count, the MoE."""

from __future__ import annotations

import warnings

import pytest
import torch

from turbo_dllm.families.diffusion_gemma.experts import GroupedExperts, grouped_matmul
from turbo_dllm.train.attention import CanvasLayout, FlexAttention, ReferenceAttention


def _by_hand(layout: CanvasLayout, q: int, kv: int) -> bool:
    C, B, W = layout.canvas_len, layout.block_size, layout.window
    if q < C:
        block = q // B
        if kv < C:
            return kv // B == block
        j, start = kv - C, layout.canvas_start + block * B
        return j < start and (W is None or j >= start - (W - 1))
    if kv < C:
        return False
    i, j = q - C, kv - C
    return j <= i and (W is None or j > i - W)


@pytest.mark.parametrize("start,window", [(0, None), (5, None), (5, 6), (0, 3)])
def test_predicate_dense_mask_and_pairs_agree_with_the_definition(start, window):
    layout = CanvasLayout(18, 4, start, window=window)
    S = layout.stream_len
    want = torch.tensor([[_by_hand(layout, q, k) for k in range(S)] for q in range(S)])
    assert torch.equal(layout.dense_mask()[0, 0], want)
    assert layout.pairs() == int(want.sum())


@pytest.mark.parametrize("window", [None, 5])
def test_flex_equals_reference_on_the_canvas_layout_on_cpu(window):
    torch.manual_seed(0)
    layout = CanvasLayout(32, 8, 6, window=window)
    q, k, v = (torch.randn(2, h, layout.stream_len, 8) for h in (4, 2, 2))
    flex, ref = FlexAttention(compile=False), ReferenceAttention()
    cpu = torch.device("cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = flex(q, k, v, flex.prepare(layout, None, cpu))
    torch.testing.assert_close(got, ref(q, k, v, ref.prepare(layout, None, cpu)))


def test_grouped_experts_equal_a_per_token_loop():
    torch.manual_seed(0)
    experts = GroupedExperts(5, 12, 6, torch.nn.functional.silu)
    torch.nn.init.normal_(experts.gate_up_proj)
    torch.nn.init.normal_(experts.down_proj)
    x = torch.randn(9, 12)
    index = torch.stack([torch.randperm(5)[:3] for _ in range(9)])
    weights = torch.rand(9, 3)
    want = torch.zeros(9, 12)
    for t in range(9):
        for slot in range(3):
            e = int(index[t, slot])
            gate, up = (experts.gate_up_proj[e] @ x[t]).chunk(2)
            want[t] += weights[t, slot] * (
                experts.down_proj[e] @ (torch.nn.functional.silu(gate) * up)
            )
    torch.testing.assert_close(experts(x, weights, index), want, atol=1e-5, rtol=1e-5)


def test_an_unknown_grouped_gemm_kind_is_an_error():
    from turbo_dllm.errors import DllmError

    with pytest.raises(DllmError, match="grouped GEMM"):
        grouped_matmul(torch.zeros(2, 4), torch.zeros(1, 3, 4), torch.tensor([2]), "magic")


def test_compiled_checkpointed_layers_trace_the_grouped_gemm_path_whole(tmp_path):
    """The trainer's compiled, checkpointed layers on the GPU's grouped-GEMM path: one graph
    each (bincount's data-dependent size broke it, and a break inside a checkpointed layer
    left the whole layer eager)."""
    from tests.train.util import tiny_spec
    from turbo_dllm.train.distributed import init_distributed
    from turbo_dllm.train.trainer import Trainer

    base = {
        "launch": {"seed": 0},
        "model": {"family": "diffusion_gemma", "from_config": "tiny", "dtype": "bfloat16"},
        "objective": {"name": "diffusiongemma_sft", "block_size": 16},
        "data": {"synthetic": {"num_sequences": 4, "vocab_size": 512}, "seq_len": 64},
        "training": {"micro_batch_size": 1, "steps": 1, "activation_checkpointing": True},
        "scheduler": {"name": "constant", "warmup_steps": 0},
        "checkpoint": {"interval": None},
        "logging": {"console": False},
    }
    from torch._dynamo.utils import counters

    trainer = Trainer(tiny_spec(base=base), tmp_path, init_distributed()).build()
    torch._dynamo.reset()
    counters.clear()
    for layer in trainer.model.model.decoder.layers:
        layer.experts.gemm = "grouped_mm"  # (the CPU loop reads its offsets on the host)
        layer.compile(backend="eager", dynamic=False)  # as apply_compile, inductor aside
    assert torch.isfinite(torch.tensor(trainer.train_step(0)["loss"]))
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] == 2  # one per layer kind (sliding, full)


@pytest.mark.parametrize("window", [None, 40])
def test_context_parallel_flex_mask_equals_the_reference_on_each_ranks_share(window, monkeypatch):
    """cp's flex block mask (the predicate on stream indices) against the dense reference, for
    every rank's queries over the gathered keys; eager flex here (CUDA compiles it: tests/gpu)."""
    from torch.nn.attention.flex_attention import flex_attention

    import turbo_dllm.train.parallel.partial_attention as partial_attention
    from turbo_dllm.families.diffusion_gemma.context import GemmaCpAttention, local_stream

    monkeypatch.setattr(partial_attention, "_flex_attention", lambda: flex_attention)
    layout = CanvasLayout(256, 32, 40).with_window(window)
    gathered = torch.cat([local_stream(layout, 2, r)[0] for r in range(2)])
    torch.manual_seed(0)
    k = torch.randn(2, 2, gathered.numel(), 16)
    v = torch.randn_like(k)
    cpu = torch.device("cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager flex warns that it is unfused
        for rank in range(2):
            local, _ = local_stream(layout, 2, rank)
            q = torch.randn(2, 4, local.numel(), 16)
            ref, flex = (
                GemmaCpAttention(layout, local, gathered, None, backend, cpu)._attend(q, k, v)
                for backend in ("reference", "flex")
            )
            torch.testing.assert_close(flex, ref, atol=1e-5, rtol=1e-5)
