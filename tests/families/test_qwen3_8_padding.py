"""qwen3_8's pad row as transformers' Qwen3_5TextModel has it: `padding_idx = pad_token_id`.

transformers zeroes that row at init and the lookup gives it no gradient. Ours had no
padding_idx: fed a zero row (a random HF folder's pad row, also when the mask token migration
had put the mask token there), the first zero-centred RMSNorm gave it its gradient at x = 0,
~1/sqrt(rms_norm_eps) = 1000x the others', a grad norm of thousands at the first steps (the
clip at 1.0 then divided every other gradient by it).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from turbo_dllm.families.qwen3_8.runtime import build_model
from turbo_dllm.registry import get_family
from turbo_dllm.train.weights import materialize

transformers = pytest.importorskip("transformers")

PAD = 40
SHAPE = dict(
    vocab_size=48,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    layer_types=["linear_attention", "full_attention"],
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
    linear_num_key_heads=1,
    linear_num_value_heads=2,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    max_position_embeddings=64,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    pad_token_id=PAD,
)


def _causal(q, k, v, mask):
    return F.scaled_dot_product_attention(
        q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1]
    )


def _gradients(model, logits_of, ids, targets):
    model.zero_grad()
    logits = logits_of(ids)
    F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1)).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def test_the_pad_row_gets_transformers_gradients(tmp_path):
    torch.manual_seed(0)
    hf = transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(**SHAPE)).train()
    assert not hf.model.embed_tokens.weight[PAD].any()  # transformers' zero pad row
    hf.save_pretrained(tmp_path)
    config = get_family("qwen3_8").resolve_config(path=str(tmp_path), from_config=None)
    model = materialize(
        build_model(config, _causal), torch.device("cpu"), seed=0, weights_from=str(tmp_path)
    ).train()
    ids = torch.randint(0, PAD, (2, 24))
    ids[:, 3::3] = PAD  # e.g. the mask token put on the pad row, as in a noisy half
    targets = torch.randint(0, PAD, (2, 24))
    expected = _gradients(hf, lambda x: hf(input_ids=x).logits, ids, targets)
    got = _gradients(model, lambda x: model(x, torch.arange(24)), ids, targets)
    assert not got["model.embed_tokens.weight"][PAD].any()  # was ~1000x the other rows'
    for name, grad in got.items():
        torch.testing.assert_close(grad, expected[name], atol=1e-5, rtol=1e-4, msg=name)


def test_a_random_init_zeroes_the_pad_row_as_transformers_does():
    family = get_family("qwen3_8")
    config = family.resolve_config(path=None, from_config="tiny", overrides={"pad_token_id": 7})
    model = materialize(build_model(config, _causal), torch.device("cpu"), seed=0)
    embed = model.model.embed_tokens.weight
    assert not embed[7].any() and embed[8].any()
    plain = family.resolve_config(path=None, from_config="tiny")
    assert build_model(plain, _causal).model.embed_tokens.padding_idx is None
