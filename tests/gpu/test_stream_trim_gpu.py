"""The stream trim (`train.attention.trim`) on a GPU, where turbo's windows run compiled Triton
kernels (the CPU suite runs them in the interpreter) and flex's run its compiled kernels:
windowed masks against the reference's slices, forward and every gradient, and a compiled
trainer step, trimmed against the whole stream."""

from __future__ import annotations

import pytest
import torch

from tests.train.util import tiny_spec
from turbo_dllm.train.attention import BlockDiffusionLayout, ReferenceAttention
from turbo_dllm.train.attention.backends import build_attention
from turbo_dllm.train.attention.trim import CLEAN_HALF, LAST_LAYER_QUERIES

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda", 0)
TOLERANCE = 3e-2  # max |error| / max |reference|: bf16 inputs, fp32 sums


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want).abs().max() / want.abs().max())


@pytest.mark.parametrize("docs", [False, True])
@pytest.mark.parametrize("backend", ["turbo", "flex"])
def test_windows_attend_as_the_reference(backend, docs):
    """The last layer's noisy queries over the whole stream, and the clean half alone."""
    L, block = 512, 32
    layout = BlockDiffusionLayout(L, block)
    doc_ids = torch.tensor([[0] * 200 + [1] * (L - 200)], device=CUDA) if docs else None
    gen = torch.Generator(device=CUDA).manual_seed(0)
    q = torch.randn(1, 8, 2 * L, 64, device=CUDA, generator=gen, dtype=torch.bfloat16)
    k, v = (
        torch.randn(1, 2, 2 * L, 64, device=CUDA, generator=gen, dtype=torch.bfloat16)
        for _ in range(2)
    )
    attention, reference = build_attention(backend, CUDA, kernels="jit"), ReferenceAttention()
    for queries, keys in ((range(L), range(2 * L)), (range(L, 2 * L), range(L, 2 * L))):
        rows, cols = slice(queries.start, queries.stop), slice(keys.start, keys.stop)
        grad = torch.randn(1, 8, len(queries), 64, device=CUDA, generator=gen)
        results = []
        for run, dtype in ((attention, torch.bfloat16), (reference, torch.float32)):
            inputs = [
                t.detach().to(dtype).requires_grad_()
                for t in (q[:, :, rows], k[:, :, cols], v[:, :, cols])
            ]
            out = run(*inputs, run.prepare(layout, doc_ids, CUDA, queries=queries, keys=keys))
            out.backward(grad.to(dtype))
            results.append([out.detach()] + [t.grad for t in inputs])
        for name, got, want in zip(("out", "dq", "dk", "dv"), *results, strict=True):
            assert _relative(got, want) < TOLERANCE, (backend, queries, name)


@pytest.mark.parametrize("objective", ["block_diffusion", "autoregressive"])
@pytest.mark.parametrize("attention", ["flex", "turbo"])
def test_a_trimmed_compiled_step_equals_the_whole_stream_s(tmp_path, attention, objective):
    """Through compiled layers on the GPU, a step's loss and gradient norm with the trim are
    the whole stream's (bf16: the kernels' tiles differ between the two, hence a tolerance)."""
    from turbo_dllm.train.distributed import init_distributed
    from turbo_dllm.train.trainer import Trainer

    spec = tiny_spec(
        "training.steps=2",
        f"model.attention={attention}",
        f"objective.name={objective}",
        "kernels=jit",
        "model.config_overrides.head_dim=64",
        "data.seq_len=256",
    )
    stats = []
    for name, trims in (("trimmed", None), ("whole", frozenset())):
        trainer = Trainer(spec, tmp_path / name, init_distributed()).build()
        assert trainer.plan.trims == {CLEAN_HALF, LAST_LAYER_QUERIES}
        if trims is not None:
            trainer.plan.trims = trims
        stats.append(trainer.train_step(0))
    trimmed, whole = stats
    assert trimmed["loss"] == pytest.approx(whole["loss"], rel=1e-2)
    assert trimmed["grad_norm"] == pytest.approx(whole["grad_norm"], rel=3e-2)
    assert trimmed["flops"] < whole["flops"]
