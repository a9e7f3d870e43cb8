"""The torch chunked gated delta rule on CUDA: the GPU path where fla refuses the host (Hopper
with Triton < 3.7.1 and no TileLang, as on the H200 host). bf16 inputs with the model's 64-token
chunks and block-boundary capture equal the float64 token loop, forward and backward; and the
compiled form (its chunk recurrence left out of the graph) equals the eager one."""

from __future__ import annotations

import pytest
import torch

from turbo_dllm.families.qwen3_8.gated_delta import gated_delta_rule

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _inputs(dtype, B=2, T=256, Hk=2, Hv=4, Dk=64, Dv=64):
    gen = torch.Generator(device="cuda").manual_seed(0)
    make = lambda *shape: torch.randn(*shape, generator=gen, device="cuda")  # noqa: E731
    q, k, v = make(B, T, Hk, Dk), make(B, T, Hk, Dk), make(B, T, Hv, Dv)
    g = -torch.nn.functional.softplus(make(B, T, Hv))
    beta = torch.sigmoid(make(B, T, Hv))
    state = 0.1 * make(B, Hv, Dk, Dv)
    return [x.to(dtype).requires_grad_() for x in (q, k, v, g, beta, state)]


def _run(rule, inputs, kernel):
    q, k, v, g, beta, state = inputs
    out, captured, final = rule(
        q, k, v, g, beta, kernel=kernel, initial_state=state, capture_every=64
    )
    loss = out.float().square().sum() + final.square().sum() + captured.square().sum()
    return out.float(), captured.float(), torch.autograd.grad(loss, inputs)


def _close(got, want, tolerance):
    for mine, ref in zip(got, want, strict=True):
        scale = float(ref.abs().max()) or 1.0
        assert float((mine.float() - ref.float()).abs().max()) < tolerance * scale


def test_torch_chunked_bf16_equals_the_float64_token_loop():
    inputs = _inputs(torch.bfloat16)
    want = _run(
        gated_delta_rule, [x.detach().double().requires_grad_() for x in inputs], "recurrent"
    )
    got = _run(gated_delta_rule, inputs, "torch")
    _close(got[:2], want[:2], 3e-2)
    _close(got[2], want[2], 5e-2)


def test_compiled_torch_chunked_equals_eager():
    inputs = _inputs(torch.bfloat16)
    want = _run(gated_delta_rule, inputs, "torch")
    compiled = torch.compile(gated_delta_rule, dynamic=False)
    got = _run(compiled, inputs, "torch")
    _close(got[:2], want[:2], 1e-2)
    _close(got[2], want[2], 1e-2)
