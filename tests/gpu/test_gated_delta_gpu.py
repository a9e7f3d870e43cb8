"""fla's chunked gated delta rule equals our torch reference on CUDA (forward and backward),
with the block-boundary state capture the qwen3_8 model uses; and the model trains with it."""

from __future__ import annotations

import pytest
import torch

from turbo_dllm.families.qwen3_8.gated_delta import gated_delta_rule

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
fla = pytest.importorskip("fla")


@pytest.fixture(autouse=True)
def _fla_runs_here():
    """fla itself refuses its gated backward on Hopper with Triton in [3.4.0, 3.7.1) (fla #640);
    on such a host the trainer refuses `linear_attention: fla` up front, and these tests cannot
    run (seen on the H200 host, Triton 3.6.0)."""
    import importlib.util

    import triton

    from turbo_dllm.families.qwen3_8.gated_delta import fla_problem

    problem = fla_problem(
        triton.__version__,
        torch.cuda.get_device_capability(),
        importlib.util.find_spec("tilelang") is not None,
    )
    if problem:
        pytest.skip(problem)


def _inputs(B=2, T=256, Hk=2, Hv=4, Dk=64, Dv=64, dtype=torch.bfloat16):
    gen = torch.Generator(device="cuda").manual_seed(0)
    make = lambda *shape: torch.randn(*shape, generator=gen, device="cuda")  # noqa: E731
    q, k = make(B, T, Hk, Dk).to(dtype), make(B, T, Hk, Dk).to(dtype)
    v = make(B, T, Hv, Dv).to(dtype)
    g = -torch.nn.functional.softplus(make(B, T, Hv))  # log decay <= 0, float32 as the model
    beta = torch.sigmoid(make(B, T, Hv)).to(dtype)
    state = 0.1 * make(B, Hv, Dk, Dv)
    return [x.requires_grad_() for x in (q, k, v, g, beta, state)]


def _run(kernel, inputs, capture):
    q, k, v, g, beta, state = inputs
    out, captured, final = gated_delta_rule(
        q, k, v, g, beta, kernel=kernel, initial_state=state, capture_every=capture
    )
    # Every output, every captured state and the final state feed the loss.
    loss = out.float().square().sum() + final.square().sum()
    if captured is not None:
        loss = loss + captured.square().sum()
    grads = torch.autograd.grad(loss, inputs)
    return out.float(), captured, final, grads


@pytest.mark.parametrize("capture", [None, 64, 128])
def test_fla_chunk_kernel_equals_torch_reference(capture):
    inputs = _inputs()
    want = _run("torch", [x.detach().float().requires_grad_() for x in inputs], capture)
    got = _run("fla", inputs, capture)
    torch.testing.assert_close(got[0], want[0], atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(got[2], want[2], atol=3e-2, rtol=3e-2)
    if capture:
        torch.testing.assert_close(got[1], want[1], atol=3e-2, rtol=3e-2)
    for mine, ref in zip(got[3], want[3], strict=True):
        scale = float(ref.abs().max())
        assert float((mine.float() - ref).abs().max()) < 5e-2 * scale


def test_qwen3_8_trains_with_fla_on_gpu(tmp_path):
    from tests.train.test_qwen3_8_training import HYBRID
    from tests.train.util import losses, tiny_spec
    from turbo_dllm.train.entry import train

    spec = tiny_spec(
        "training.steps=20",
        "model.linear_attention=fla",
        "model.attention=flex",
        "model.dtype=bfloat16",
        "objective.block_size=64",
        "data.seq_len=256",
        "checkpoint.interval=null",
        base=HYBRID,
    )
    train(spec, tmp_path)
    trace = losses(tmp_path)
    assert sum(trace[-4:]) / 4 < 0.9 * sum(trace[:4]) / 4, trace
