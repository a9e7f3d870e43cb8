"""The DFlash2 drafter's own parts on tiny configs: the block-local grouped convolution against
its formula, a fresh DFlash2 drafter equal to a DFlash one, and the selector's greedy draft."""

from __future__ import annotations

import dataclasses

import torch

from tests.dflash.helpers import tiny_drafter_config
from turbo_dllm.families.dflash.config import DFlashConfig
from turbo_dllm.families.dflash.model import (
    DFlash2Drafter,
    DFlashDrafter,
    DFlashGroupedConv,
    DraftContext,
)
from turbo_dllm.families.dflash.plan import draft_attention_mask
from turbo_dllm.train.weights import init_weights

TINY2 = tiny_drafter_config(
    architecture="DFlash2DraftModel",
    conv_kernel_size=3,
    conv_group_size=2,
    selector_rank=3,
    selector_top_k=4,
)


def _drafter(config: DFlashConfig, seed: int = 0):
    model = (DFlash2Drafter if config.is_dflash2 else DFlashDrafter)(config)
    init_weights(model, config, seed)
    return model.double().eval()


def test_grouped_convolution_is_the_formula_and_never_crosses_a_block():
    g = torch.Generator().manual_seed(0)
    conv = DFlashGroupedConv(TINY2).double()
    with torch.no_grad():
        conv.base_kernel.copy_(torch.randn(conv.base_kernel.shape, generator=g))
        conv.kernel_projection.weight.copy_(
            torch.randn(conv.kernel_projection.weight.shape, generator=g)
        )
    rows, blocks, b, h, taps, group = 2, 3, 4, 8, 3, 2
    x = torch.randn(rows, blocks * b, h, generator=g, dtype=torch.float64)
    normed = torch.randn(rows, blocks * b, h, generator=g, dtype=torch.float64)
    kernels = conv.coefficients(normed)
    dyn = (normed @ conv.kernel_projection.weight.T).view(rows, blocks * b, 2, taps, h // group)
    for side in (0, 1):
        got = conv.convolve(x, kernels, side)
        want = torch.zeros_like(x)
        for r in range(rows):
            for t in range(blocks * b):
                for j in range(taps):
                    if t % b - j < 0:  # before the block's first token: nothing
                        continue
                    for c in range(h):
                        coefficient = conv.base_kernel[side, j, c] + dyn[r, t, side, j, c // group]
                        want[r, t, c] += coefficient * x[r, t - j, c]
        torch.testing.assert_close(got, want)
    # a change inside block 1 moves block 1 only
    changed = x.clone()
    changed[:, b : 2 * b] += 1.0
    delta = (
        (conv.convolve(changed, kernels, 0) - conv.convolve(x, kernels, 0)).abs().sum(-1).detach()
    )
    assert bool((delta[:, b : 2 * b] > 0).all())
    assert float(delta[:, :b].sum() + delta[:, 2 * b :].sum()) == 0.0


def _inputs(config: DFlashConfig):
    g = torch.Generator().manual_seed(1)
    length, b = 12, config.block_size
    features = torch.randn(1, length, config.feature_size, generator=g, dtype=torch.float64)
    anchors = torch.tensor([[2, 7]])
    tokens = torch.randint(0, 10, (1, 2 * b), generator=g)
    positions = (anchors[:, :, None] + torch.arange(b)).reshape(1, -1)
    mask = draft_attention_mask(
        anchors, torch.ones_like(anchors, dtype=torch.bool), None, length, b
    )
    return tokens, positions, DraftContext(features, torch.arange(length), mask)


def test_a_fresh_dflash2_drafter_computes_what_a_dflash_drafter_does():
    """Identity base kernels and zero dynamic projections: the convolutions pass through, so a
    freshly initialised DFlash2 drafter equals the DFlash drafter of its shared weights."""
    v1 = _drafter(dataclasses.replace(TINY2, architecture="DFlashDraftModel"))
    v2 = _drafter(TINY2)
    shared = dict(v1.named_parameters())
    extra = {n for n, _ in v2.named_parameters()} - set(shared)
    assert extra == {
        "candidate_selector.predecessor_codebook",
        "candidate_selector.successor_codebook",
        "candidate_selector.hidden_projection.weight",
        *(
            f"layers.{i}.{c}.{p}"
            for i in range(2)
            for c in ("attention_conv", "mlp_conv")
            for p in ("base_kernel", "kernel_projection.weight")
        ),
    }
    for name, param in v2.named_parameters():
        if name in shared:
            assert torch.equal(param, shared[name]), name
    assert float(v2.candidate_selector.successor_codebook.detach().abs().sum()) == 0.0
    assert float(v2.candidate_selector.predecessor_codebook.std()) > 0.0
    inputs = _inputs(TINY2)
    with torch.no_grad():
        torch.testing.assert_close(v2(*inputs), v1(*inputs))
        v2.layers[0].mlp_conv.kernel_projection.weight.fill_(0.1)  # once trained, it differs
        assert not torch.allclose(v2(*inputs), v1(*inputs))


def test_greedy_draft_ranks_the_top_k_by_unary_plus_pair_score():
    config = dataclasses.replace(TINY2, output_multiplier=1.5, final_logit_softcapping=2.0)
    model = _drafter(config)
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(3, 8, generator=g, dtype=torch.float64)
    # a fresh selector (zero successor codebook) keeps the unary argmax
    unary = 2.0 * torch.tanh(1.5 * hidden @ model.lm_head.weight.T / 2.0)
    assert model.greedy_draft(hidden, torch.tensor([3])).tolist() == unary.argmax(-1).tolist()
    selector = model.candidate_selector
    with torch.no_grad():
        selector.successor_codebook.copy_(torch.randn(11, 3, generator=g, dtype=torch.float64) * 5)
    picked, previous = [], 3
    for i in range(3):  # by hand: slot i's candidates scored after the previous pick
        candidates = unary[i].topk(4).indices.tolist()
        projected = selector.hidden_projection.weight @ hidden[i]
        scores = [
            float(unary[i, c])
            + float(
                (selector.predecessor_codebook[previous] * projected)
                @ selector.successor_codebook[c]
            )
            for c in candidates
        ]
        previous = candidates[max(range(4), key=scores.__getitem__)]
        picked.append(previous)
    assert model.greedy_draft(hidden, torch.tensor([3])).tolist() == picked


def test_the_dflash2_config_round_trips_through_config_json():
    config = dataclasses.replace(TINY2, output_multiplier=0.5, final_logit_softcapping=30.0)
    hf = config.to_hf_dict()
    assert hf["architectures"] == ["DFlash2DraftModel"] and "auto_map" not in hf
    assert hf["dflash_config"]["attention_mode"] == "gqa"  # 2 heads over 1 kv head
    assert DFlashConfig.from_hf_dict(hf) == config
    v1 = dataclasses.replace(TINY2, architecture="DFlashDraftModel")
    assert set(v1.to_hf_dict()["dflash_config"]) == {
        "block_size",
        "mask_token_id",
        "target_layer_ids",
    }
    assert DFlashConfig.from_hf_dict(v1.to_hf_dict()).architecture == "DFlashDraftModel"
