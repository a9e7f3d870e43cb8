"""block_diffusion_attention compiled on a GPU (bf16) against the torch reference, at shapes the
trainer uses: the whole 2L stream with documents, CSBP's local and prefix parts (whose merge by
log-sum-exp must equal the whole-stream attention), every sm90 config the benchmark may sweep,
and the op inside torch.compile. The interpreter runs the same kernels on CPU in
tests/train/test_block_diffusion_attention_triton.py.
"""

from __future__ import annotations

import os

import pytest
import torch

from turbo_dllm.kernels import merge_attention_partials
from turbo_dllm.kernels.block_diffusion import (
    block_diffusion_attention,
    plan_block_diffusion_attention,
)
from turbo_dllm.kernels.selftest import compare_block_diffusion_attention
from turbo_dllm.kernels.triton_ops import triton_module

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda", 0)
TOLERANCE = 3e-2  # max |error| / max |reference|: bf16 inputs and probabilities, fp32 sums


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("block_size", [16, 64, 256])
@pytest.mark.parametrize("seq_len", [2048, 1003])
def test_whole_stream_matches_reference(head_dim, block_size, seq_len):
    """2L = 4096 and 2006: the kernels are compiled apart for stream lengths that are multiples
    of 16 and the rest."""
    errors = compare_block_diffusion_attention(
        "jit",
        seq_len=seq_len,
        block_size=block_size,
        batch=2,
        heads=8,
        kv_heads=2,
        head_dim=head_dim,
        doc_cut=777,
    )
    assert max(errors.values()) < TOLERANCE, errors


@pytest.mark.parametrize("head_dim", [64, 128])
def test_every_loop_and_load_variant_matches_reference(head_dim):
    """Every loop and load flag the sweep may pick, compiled for this GPU, in the configs of
    `flag_configs` that together hold them all (the sweep also checks each variant it times
    against the default on its own shapes): pipelined runs of full tiles, head-major order and
    host TMA at 3 stages; device TMA with tl.range and warp specialisation on the indirect list;
    dQ fused into the dK/dV kernel (fp32 atomics), alone and with pipelined runs."""
    module = triton_module("block_diffusion_attention", "jit")
    configs = module.flag_configs(head_dim)
    for name, config in configs.items():
        errors = compare_block_diffusion_attention(
            "jit", seq_len=1024, block_size=32, head_dim=head_dim, config=config
        )
        assert max(errors.values()) < TOLERANCE, (name, errors)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_gluon_kernels_equal_the_tl_kernels(head_dim):
    """The Gluon dK/dV and dQ kernels, in one partition or split (config.dkdv_gluon,
    dkdv_split, dq_gluon, dq_split) against the `tl` ones on the same inputs, as the trainer
    hands them: q, k, v and dO strided views of (B, S, H, D), GQA groups of 4, two documents in
    one row, a stream (2L = 2000) that no tile size divides; dQ fused into the dK/dV kernel
    against the `tl` dQ kernel; then each config through the whole op (the reference's
    gradients). On the H200 the Gluon and `tl` dK/dV kernels agree bit for bit."""
    from turbo_dllm.kernels.selftest import block_diffusion_tokens

    module = triton_module("block_diffusion_attention", "jit")
    base = module.tl_default(head_dim)
    gluon = module.flag_configs(head_dim)["gluon dkdv"]
    meta = [t.to(CUDA) for t in block_diffusion_tokens(1000, 32, 2, 333)]
    schedule = module.make_schedule(*meta, *meta)
    gen = torch.Generator(device=CUDA).manual_seed(0)

    def rows(heads):  # (B, S, H, D) -> (B, H, S, D), a view
        x = torch.randn(2, 2000, heads, head_dim, device=CUDA, generator=gen)
        return x.bfloat16().transpose(1, 2)

    q, k, v = rows(8), rows(2), rows(2)
    scale = head_dim**-0.5
    out, lse = module.forward(q, k, v, schedule, scale, base)
    grad_out, delta, lse2 = module.backward_prepare(rows(8), None, q, out, lse)
    want = module.backward_dkdv(grad_out, delta, lse2, q, k, v, schedule, scale, base)
    split = module.flag_configs(head_dim)["gluon dkdv split"]
    # the other launch orders: head by head, and chunks of 3 key tiles (the last one short)
    orders = [module.flag_configs(head_dim)[f"gluon dkdv {o}"] for o in ("head-major", "chunks 3")]
    # one partition for both warpgroups, and one each; then dO and v contiguous beside a
    # (B, S, H, D) q and k (two layouts in a pair: the Gluon launchers copy one)
    for config, like in (
        (gluon, False),
        (split, False),
        (split, True),
        *((o, False) for o in orders),
    ):
        go, vv = (grad_out.contiguous(), v.contiguous()) if like else (grad_out, v)
        got = module.backward_dkdv(go, delta, lse2, q, k, vv, schedule, scale, config)
        for name, w, g in zip(("dk", "dv"), want, got, strict=True):
            assert g.shape == w.shape and not g.isnan().any(), name
            error = float((g.float() - w.float()).abs().max() / w.float().abs().max())
            assert error < TOLERANCE / 10, (name, config.dkdv_split, like, error)
    # dQ fused into it (fp32 atomics into a zeroed buffer) against the `tl` dQ kernel
    dq_acc = torch.zeros(q.shape, device=CUDA, dtype=torch.float32)
    fused = gluon.with_part("dkdv", dq=1)
    got = module.backward_dkdv(grad_out, delta, lse2, q, k, v, schedule, scale, fused, dq_acc)
    want_dq = module.backward_dq(grad_out, delta, lse2, q, k, v, schedule, scale, base)
    got_dq = dq_acc * scale
    for name, w, g in zip(("dk", "dv", "dq"), (*want, want_dq), (*got, got_dq), strict=True):
        error = float((g.float() - w.float()).abs().max() / w.float().abs().max())
        assert error < TOLERANCE, (name, error)
    # the Gluon dQ kernel against the `tl` one (dQ stored with q's strides: a view here)
    backward = module.flag_configs(head_dim)["gluon backward"]
    backward_split = module.flag_configs(head_dim)["gluon backward split"]
    # the Gluon dQ in one partition, and split; then with dO and v contiguous
    for config, like in ((backward, False), (backward_split, False), (backward_split, True)):
        go, vv = (grad_out.contiguous(), v.contiguous()) if like else (grad_out, v)
        got_dq = module.backward_dq(go, delta, lse2, q, k, vv, schedule, scale, config)
        assert got_dq.stride() == q.stride()
        error = float((got_dq.float() - want_dq.float()).abs().max() / want_dq.float().abs().max())
        assert error < TOLERANCE / 10, ("gluon dq", config.dq_split, like, error)
    for config in (gluon, split, *orders, fused, backward, backward_split):
        errors = compare_block_diffusion_attention(
            "jit", seq_len=1000, block_size=64, heads=8, kv_heads=2, head_dim=head_dim,
            config=config,
        )  # fmt: skip
        assert max(errors.values()) < TOLERANCE, errors


def _tokens(positions, *, noisy, block_size, docs):
    from turbo_dllm.train.parallel.visibility import TokenSet

    return TokenSet.from_positions(positions, noisy=noisy, block_size=block_size, doc_ids=docs)


def _meta(tokens):
    return tokens.noisy, tokens.block, tokens.doc


def test_csbp_parts_merge_to_the_whole_stream():
    """CSBP rank 0 of 4 (cp 2): local part + prefix part, merged by lse, equal the whole-stream
    attention of the rank's queries over every key, and each part equals its reference."""
    from turbo_dllm.train.parallel.layout import CsbpLayout
    from turbo_dllm.train.parallel.visibility import TokenSet

    seq_len, block_size, heads, kv_heads, dim = 4096, 64, 8, 4, 128
    docs = torch.zeros(1, seq_len, dtype=torch.long, device=CUDA)
    docs[0, 1500:] = 1
    layout = CsbpLayout.build(seq_len, block_size, bp=4, cp=2, ctx_rank=0)
    noisy = _tokens(layout.noisy_positions, noisy=True, block_size=block_size, docs=docs)
    clean = _tokens(layout.clean_positions, noisy=False, block_size=block_size, docs=docs)
    gathered = _tokens(
        layout.gathered_clean_positions, noisy=False, block_size=block_size, docs=docs
    )
    queries = TokenSet.concat(noisy, clean)
    gen = torch.Generator(device=CUDA).manual_seed(0)
    ln, lc, lg = len(noisy), len(clean), len(gathered)
    q = torch.randn(1, heads, ln + lc, dim, device=CUDA, generator=gen).bfloat16()
    k_all = torch.randn(1, kv_heads, ln + lg, dim, device=CUDA, generator=gen).bfloat16()
    v_all = torch.randn(1, kv_heads, ln + lg, dim, device=CUDA, generator=gen).bfloat16()
    k_noisy, k_clean = k_all.split([ln, lg], dim=2)
    v_noisy, v_clean = v_all.split([ln, lg], dim=2)

    def attend(q_tokens, k_tokens, qq, kk, vv, backend):
        plan = plan_block_diffusion_attention(*_meta(q_tokens), *_meta(k_tokens), backend=backend)
        return block_diffusion_attention(qq, kk, vv, plan)

    for backend in ("jit", "reference"):
        own, own_lse = attend(noisy, noisy, q[:, :, :ln], k_noisy, v_noisy, backend)
        prefix, prefix_lse = attend(queries, gathered, q, k_clean, v_clean, backend)
        merged, merged_lse = merge_attention_partials(
            own, own_lse, prefix[:, :, :ln], prefix_lse[:, :, :ln]
        )
        keys = TokenSet.concat(noisy, gathered)
        whole, whole_lse = attend(queries, keys, q, k_all, v_all, backend)
        scale = whole.float().abs().max()
        assert (merged.float() - whole[:, :, :ln].float()).abs().max() / scale < TOLERANCE
        assert torch.allclose(merged_lse, whole_lse[:, :, :ln], atol=2e-2)
        if backend == "jit":
            kernel_parts = (own, own_lse, prefix, prefix_lse)
        else:
            for got, want in zip(kernel_parts, (own, own_lse, prefix, prefix_lse), strict=True):
                finite = torch.isfinite(want)
                err = (got.float() - want.float())[finite].abs().max()
                assert err / want.float()[finite].abs().max() < TOLERANCE
                assert torch.equal(torch.isinf(got), torch.isinf(want))


def test_op_runs_inside_torch_compile():
    from turbo_dllm.kernels.selftest import block_diffusion_tokens

    meta = [t.to(CUDA) for t in block_diffusion_tokens(1024, 32, 2, 300)]
    plan = plan_block_diffusion_attention(*meta, *meta, backend="jit")
    gen = torch.Generator(device=CUDA).manual_seed(1)
    q = torch.randn(2, 8, 2048, 128, device=CUDA, generator=gen).bfloat16().requires_grad_()
    k = torch.randn(2, 4, 2048, 128, device=CUDA, generator=gen).bfloat16().requires_grad_()
    v = torch.randn(2, 4, 2048, 128, device=CUDA, generator=gen).bfloat16().requires_grad_()

    def layer(q, k, v):
        out, _ = block_diffusion_attention(q * 1.0, k, v, plan)
        return (out.float() ** 2).sum()

    eager = torch.autograd.grad(layer(q, k, v), (q, k, v))
    compiled = torch.compile(layer, fullgraph=True)
    got = torch.autograd.grad(compiled(q, k, v), (q, k, v))
    for g, e in zip(got, eager, strict=True):
        torch.testing.assert_close(g, e)


def test_native_backend_imports_the_bundle_copy(monkeypatch):
    """With the sm90 bundle `ci/gpu_qualify.sh` installed: the op comes from the bundle, under
    the shipped source hash, and matches the reference."""
    home = os.environ.get("DLLM_GPU_TEST_HOME")
    if not home:
        pytest.skip("set DLLM_GPU_TEST_HOME to the DLLM_HOME holding the installed sm90 bundle")
    monkeypatch.setenv("DLLM_HOME", home)
    from turbo_dllm.kernels.loader import load_bundle_op

    loaded = load_bundle_op("block_diffusion_attention")
    assert loaded.source is not None and loaded.source.startswith(home)
    assert "cuda" in loaded.devices
    errors = compare_block_diffusion_attention("native", seq_len=1024, block_size=32)
    assert max(errors.values()) < TOLERANCE, errors


def test_trainer_with_turbo_trains_like_flex(tmp_path):
    """model.attention turbo (kernels: jit) in the compiled, checkpointed trainer: the same
    losses as FlexAttention within bf16 noise."""
    from tests.train.util import losses, tiny_spec
    from turbo_dllm.train.entry import train

    common = (
        "training.steps=4",
        "training.compile=true",
        "training.activation_checkpointing=true",
        "model.config_overrides.head_dim=64",
        "data.seq_len=256",
    )
    assert train(tiny_spec(*common, "model.attention=flex"), tmp_path / "flex") == 0
    turbo = tiny_spec(*common, "model.attention=turbo", "kernels=jit")
    assert train(turbo, tmp_path / "turbo") == 0
    torch.testing.assert_close(
        losses(tmp_path / "turbo"), losses(tmp_path / "flex"), atol=5e-2, rtol=2e-2
    )


@pytest.mark.parametrize("attention", ["flex", "turbo"])
def test_keep_attention_checkpointing_trains_like_full_checkpointing(tmp_path, attention):
    """activation_checkpointing: keep_attention in the compiled trainer, for FlexAttention and
    our op: the losses of full checkpointing (the kept outputs are the ones it recomputes)."""
    from tests.train.util import losses, tiny_spec
    from turbo_dllm.train.entry import train

    common = (
        "training.steps=4",
        "training.compile=true",
        "model.config_overrides.head_dim=64",
        "data.seq_len=256",
        f"model.attention={attention}",
        "kernels=jit",
    )
    for mode in ("true", "keep_attention"):
        spec = tiny_spec(*common, f"training.activation_checkpointing={mode}")
        assert train(spec, tmp_path / mode) == 0
    torch.testing.assert_close(
        losses(tmp_path / "keep_attention"), losses(tmp_path / "true"), atol=1e-2, rtol=1e-2
    )
