"""DiffusionGemma against transformers' DiffusionGemmaForBlockDiffusion on the same weights."""

from __future__ import annotations

import pytest
import torch

from tests.families.dg_util import hf_model, ours
from turbo_dllm.families.base import hf_cache_argument
from turbo_dllm.train.attention import CanvasLayout

transformers = pytest.importorskip("transformers")


def _hf_clean_logits(hf, ids):
    out = hf.model.encoder(input_ids=ids)
    logits = hf.lm_head(out.last_hidden_state).float()
    cap = hf.final_logit_softcapping
    return torch.tanh(logits / cap) * cap


def _hf_block_logits(hf, prefix, block):
    cache = transformers.DynamicCache(config=hf.config.text_config)
    encoder = hf.model.encoder
    encoder(input_ids=prefix, **{hf_cache_argument(type(encoder).forward): cache})
    return hf(decoder_input_ids=block, **{hf_cache_argument(type(hf).forward): cache}).logits


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dg")
    hf = hf_model(folder)
    model, attention = ours(folder)
    return hf, model, attention


@pytest.mark.parametrize("canvas_start", [0, 6])
def test_logits_equal_transformers_on_clean_stream_and_noisy_blocks(pair, canvas_start):
    hf, model, attention = pair
    L, B = 20, 4
    torch.manual_seed(1)
    x0 = torch.randint(0, 97, (2, L))
    layout = CanvasLayout(L, B, canvas_start)
    xt = torch.randint(0, 97, (2, layout.canvas_len))
    mask = attention.prepare(layout, None, torch.device("cpu"))
    with torch.no_grad():
        logits = model(torch.cat([xt, x0], 1), layout.positions(), mask)
        clean = _hf_clean_logits(hf, x0)
        torch.testing.assert_close(logits[:, layout.canvas_len :], clean, atol=2e-5, rtol=1e-4)
        for block in range(layout.canvas_blocks):
            start = canvas_start + block * B
            canvas = xt[:, block * B : (block + 1) * B]
            expected = _hf_block_logits(hf, x0[:, :start], canvas) if start else None
            if expected is None:  # HF needs a non-empty prompt: compare block 0 at start 0 below
                continue
            got = logits[:, block * B : (block + 1) * B]
            torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


def test_parameter_count_equals_transformers(pair):
    hf, model, _ = pair
    text = sum(p.numel() for name, p in hf.named_parameters() if "vision" not in name)
    scalars = sum(
        t.numel()
        for name, t in hf.state_dict().items()
        if name.startswith("model.decoder") and name.endswith("layer_scalar")
    )
    assert model.config.num_params() == text + scalars
    assert model.config.num_params() == sum(p.numel() for p in model.parameters())


def test_the_pad_row_gets_no_gradient_through_the_embedding_lookup(tmp_path):
    """transformers' embedding has padding_idx = pad_token_id (its row zero at init, never
    updated by the lookup). Ours had none: pad tokens in the canvas (its tail past the row, a
    row's trailing padding) gave that zero row a gradient of ~1e7 through the RMSNorms, and the
    clip divided every other gradient by it."""
    hf_model(tmp_path)
    model, attention = ours(tmp_path)
    embed = model.model.decoder.embed_tokens
    assert not embed.weight[0].any()  # HF's zero pad row
    layout = CanvasLayout(20, 4, 6)
    torch.manual_seed(1)
    x0 = torch.randint(1, 97, (2, 20))
    x0[1, 15:] = 0  # trailing padding
    xt = torch.cat([x0[:, 6:], torch.zeros(2, 2, dtype=torch.long)], 1)  # canvas tail: pad
    mask = attention.prepare(layout, None, torch.device("cpu"))
    model.train()
    logits = model(torch.cat([xt, x0], 1), layout.positions(), mask)
    logits[:, : layout.canvas_len].log_softmax(-1)[..., 5].mean().backward()
    assert float(embed.weight.grad.norm()) < 1e3, float(embed.weight.grad.norm())
    assert embed.padding_idx == 0


def test_a_random_init_zeroes_the_pad_row_as_transformers_does():
    """From scratch (no folder), transformers' `_init_weights` zeroes the padding_idx row; ours
    drew it from N(0, 0.02) and, the lookup giving it no gradient, kept it so for good."""
    model, _ = ours()
    embed = model.model.decoder.embed_tokens
    assert embed.padding_idx == 0
    assert not embed.weight[0].any() and embed.weight[1:].abs().sum(-1).all()


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [("attention_bias", True, "has no biases"), ("attention_dropout", 0.1, "attention dropout")],
)
def test_attention_settings_the_model_does_not_apply_are_refused(tmp_path, key, value, words):
    """transformers builds q/k/v/o biases for attention_bias and drops attention weights for
    attention_dropout; ours has neither, so such a config.json trained another model, silently.
    A model.config_overrides entry back to the default trains it."""
    from tests.families.dg_util import hf_model, tiny_hf_dict
    from tests.train.util import tiny_spec
    from turbo_dllm.errors import DllmError
    from turbo_dllm.families.diffusion_gemma.config import DiffusionGemmaConfig

    with pytest.raises(DllmError, match=words):
        DiffusionGemmaConfig.from_hf_dict(tiny_hf_dict(**{key: value}))
    if key == "attention_bias":
        return  # (transformers' checkpoint would hold the biases: no override makes it ours)
    hf_model(tmp_path, tiny_hf_dict(**{key: value}))
    base = {"model": {"family": "diffusion_gemma", "path": str(tmp_path), "from_config": None},
            "objective": {"name": "diffusiongemma_sft", "block_size": 4},
            "data": {"synthetic": {"vocab_size": 97}, "seq_len": 32}}  # fmt: skip
    with pytest.raises(DllmError, match=words):
        tiny_spec(base=base)
    spec = tiny_spec(f"model.config_overrides.{key}=0.0", base=base)
    assert spec.model.config_overrides == {key: 0.0}
