"""Block diffusion through Gated DeltaNet: captured clean states, restarted noisy blocks."""

from __future__ import annotations

import pytest
import torch

from turbo_dllm.families.qwen3_8 import model as hybrid
from turbo_dllm.families.qwen3_8.gated_delta import gated_delta_rule
from turbo_dllm.families.qwen3_8.runtime import build_model
from turbo_dllm.registry import get_family
from turbo_dllm.train.attention import BlockDiffusionLayout, ReferenceAttention
from turbo_dllm.train.weights import materialize

transformers = pytest.importorskip("transformers")


def _inputs(T=48, B=2, Hk=2, Hv=4, Dk=8, Dv=6, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, Hk, Dk, generator=gen, dtype=dtype)
    k = torch.randn(B, T, Hk, Dk, generator=gen, dtype=dtype)
    v = torch.randn(B, T, Hv, Dv, generator=gen, dtype=dtype)
    g = -torch.rand(B, T, Hv, generator=gen, dtype=dtype)
    beta = torch.rand(B, T, Hv, generator=gen, dtype=dtype)
    state = 0.3 * torch.randn(B, Hv, Dk, Dv, generator=gen, dtype=dtype)
    return q, k, v, g, beta, state


@pytest.mark.parametrize("capture", [None, 8, 16])
def test_chunked_equals_recurrent(capture):
    q, k, v, g, beta, state = _inputs()
    out_c, cap_c, final_c = gated_delta_rule(
        q, k, v, g, beta, kernel="torch", initial_state=state, capture_every=capture, chunk=16
    )
    out_r, cap_r, final_r = gated_delta_rule(
        q, k, v, g, beta, kernel="recurrent", initial_state=state, capture_every=capture
    )
    torch.testing.assert_close(out_c, out_r, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(final_c, final_r, atol=1e-5, rtol=1e-4)
    if capture:
        assert cap_c.shape == (2, 48 // capture, 4, 8, 6)
        torch.testing.assert_close(cap_c, cap_r, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(cap_c[:, 0], state)


def test_torch_reference_equals_transformers_chunked_form():
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule

    q, k, v, g, beta, state = _inputs(T=40)  # not a multiple of the chunk: padded
    ours, _, final = gated_delta_rule(q, k, v, g, beta, initial_state=state, chunk=16)
    # Each key head serves Hv // Hk consecutive value heads. transformers 5.17's function takes
    # q/k already repeated (its Qwen3_5GatedDeltaNet repeats them before the call); later ones
    # repeat inside. Repeated here, both compute the same grouped form.
    group = v.shape[2] // k.shape[2]
    theirs, their_final = torch_chunk_gated_delta_rule(
        q.repeat_interleave(group, dim=2),
        k.repeat_interleave(group, dim=2),
        v,
        g,
        beta,
        chunk_size=16,
        initial_state=state,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(final, their_final, atol=1e-5, rtol=1e-4)


def test_captured_state_continues_the_sequence():
    """Running tokens [b*B, T) from the state captured at b*B equals the tail of the whole run."""
    q, k, v, g, beta, _ = _inputs()
    whole, captured, _ = gated_delta_rule(q, k, v, g, beta, capture_every=16, chunk=16)
    tail, _, _ = gated_delta_rule(
        *(x[:, 32:] for x in (q, k, v, g, beta)), initial_state=captured[:, 2], chunk=16
    )
    torch.testing.assert_close(tail, whole[:, 32:], atol=1e-5, rtol=1e-4)


def _block_diffusion_case(q, k, v, g, beta, block):
    """Clean stream with captured states, then each noisy block from its state (the model's
    path, at the kernel level); here noisy = clean inputs perturbed, shared decays."""
    rows, T = q.shape[:2]
    n = T // block
    _, states, _ = gated_delta_rule(q, k, v, g, beta, capture_every=block, chunk=block)
    flat = [x.reshape(rows * n, block, *x.shape[2:]) for x in (q.flip(1), k, v, g, beta)]
    noisy, _, _ = gated_delta_rule(
        *flat, initial_state=states.reshape(rows * n, *states.shape[2:]), chunk=block
    )
    return noisy


def test_gradients_flow_through_captured_states_gradcheck():
    q, k, v, g, beta, _ = _inputs(T=8, B=1, Hk=1, Hv=2, Dk=3, Dv=2, dtype=torch.float64)
    inputs = [x.clone().requires_grad_() for x in (q, k, v, g, beta)]
    assert torch.autograd.gradcheck(
        lambda *xs: _block_diffusion_case(*xs, block=4), inputs, eps=1e-6, atol=1e-5
    )


def test_the_scan_op_backward_is_the_loop_s_autograd():
    """The chunk scan runs as a custom op with a hand-written reverse scan: its gradients are
    autograd's through the plain loop (float64, every input and every output), and gradcheck
    holds."""
    from turbo_dllm.families.qwen3_8.gated_delta import _scan_chunks, _scan_loop

    torch.manual_seed(0)
    b, h, n, c, dk, dv = 2, 3, 5, 4, 6, 7
    shapes = [(b, h, n, c, dv), (b, h, n, c, dk), (b, h, n, c, dk), (b, h, n, 1, 1), (b, h, dk, dv)]
    base = [torch.randn(shape, dtype=torch.float64) * 0.3 for shape in shapes]
    base[3] = base[3].abs().clamp(max=1.0)  # a decay
    loop_in = [x.clone().requires_grad_() for x in base]
    op_in = [x.clone().requires_grad_() for x in base]
    loop_out, op_out = _scan_loop(*loop_in), _scan_chunks(*op_in)
    weights = [torch.randn_like(t) for t in loop_out]
    for out in (loop_out, op_out):
        sum((t * w).sum() for t, w in zip(out, weights, strict=True)).backward()
    for a, o in zip(loop_out, op_out, strict=True):
        assert torch.equal(a, o)
    for a, o in zip(loop_in, op_in, strict=True):
        torch.testing.assert_close(o.grad, a.grad, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(_scan_chunks, [x.clone().requires_grad_() for x in base])


# --- the layer and the model ----------------------------------------------------------------
def _tiny_model(kernel="torch"):
    config = get_family("qwen3_8").resolve_config(
        path=None,
        from_config="tiny",
        overrides={"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 96},
    )
    model = materialize(
        build_model(config, ReferenceAttention(), linear_attention=kernel),
        torch.device("cpu"),
        seed=1,
    )
    with torch.no_grad():  # non-trivial norms; slow decays, so the state carries far
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(0.2 * torch.randn_like(param))
            if name.endswith("A_log"):
                param.fill_(-4.0)
    return model.eval()


def _restart_matches_prefix_run(layer, L=32, block=8, rows=2):
    """Each noisy block's output in the stream forward == the same layer run causally over
    [clean prefix ; that noisy block]: the state and the conv window are handed on exactly."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(rows, 2 * L, 64, generator=gen)
    layout = BlockDiffusionLayout(L, block)
    with torch.no_grad():
        stream = layer(x, hybrid.HybridMask(None, layout))
        worst = 0.0
        for b in range(L // block):
            prefix = torch.cat([x[:, L : L + b * block], x[:, b * block : (b + 1) * block]], 1)
            alone = layer(prefix, hybrid.HybridMask(None))[:, -block:]
            worst = max(worst, (alone - stream[:, b * block : (b + 1) * block]).abs().max().item())
        clean = layer(x[:, L:], hybrid.HybridMask(None))
    torch.testing.assert_close(stream[:, L:], clean, atol=1e-5, rtol=1e-4)
    return worst


def test_noisy_block_restarts_from_the_clean_prefix_state():
    layer = _tiny_model().model.layers[0].linear_attn
    assert _restart_matches_prefix_run(layer) < 1e-5


def test_a_broken_state_hand_off_is_caught(monkeypatch):
    """The check above fails when the noisy blocks start from zero instead of the clean state."""
    layer = _tiny_model().model.layers[0].linear_attn
    real = hybrid.gated_delta_rule

    def forgetful(*args, initial_state=None, **kwargs):
        return real(*args, **kwargs)  # drops the captured state

    monkeypatch.setattr(hybrid, "gated_delta_rule", forgetful)
    assert _restart_matches_prefix_run(layer) > 1e-3


def test_a_broken_conv_window_is_caught(monkeypatch):
    layer = _tiny_model().model.layers[0].linear_attn
    monkeypatch.setattr(
        layer,
        "_noisy_conv",
        lambda noisy, clean, block, which=None, tail=None: layer._conv(
            noisy.reshape(-1, block, noisy.shape[-1])
        ),
    )
    assert _restart_matches_prefix_run(layer) > 1e-3


def test_nothing_leaks_between_noisy_blocks_in_the_model():
    """Changing noisy block 1 changes only noisy block 1's outputs (and never the clean half)."""
    model = _tiny_model()
    L, block = 32, 8
    layout = BlockDiffusionLayout(L, block)
    mask = hybrid.HybridMask(ReferenceAttention().prepare(layout, None, "cpu"), layout)
    ids = torch.randint(0, 500, (1, 2 * L))
    changed = ids.clone()
    changed[0, block : 2 * block] = torch.randint(0, 500, (block,))
    with torch.no_grad():
        a = model(ids, layout.positions(), mask)
        b = model(changed, layout.positions(), mask)
    moved = (a - b).abs().amax(-1)[0]
    assert moved[block : 2 * block].min() > 0
    assert moved[:block].max() == 0 and moved[2 * block :].max() == 0
