"""Scaled RoPE (YaRN) in the decoder family, held to transformers' logits on the same weights;
the RoPE types training cannot reproduce are refused naming what is supported."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from turbo_dllm.errors import DllmError
from turbo_dllm.families.decoder.config import DecoderConfig
from turbo_dllm.families.decoder.runtime import build_model
from turbo_dllm.registry import get_family
from turbo_dllm.train.weights import materialize

transformers = pytest.importorskip("transformers")

VOCAB, LENGTH = 97, 48
# Positions 0..47 run past the original 16, where YaRN's interpolation shows.
QWEN3_PUBLISHED = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}


def _causal(q, k, v, mask):
    return F.scaled_dot_product_attention(
        q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1]
    )


def _hf_model(model_type: str, rope_scaling: dict):
    shape = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=64,
        rope_theta=10000.0,
        rope_scaling=rope_scaling,
    )
    torch.manual_seed(0)
    if model_type == "qwen3":
        return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**shape)).eval()
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**shape)).eval()


def _assert_same_logits(config, folder, hf) -> None:
    """Our model of `folder` (built from `config`) gives `hf`'s logits."""
    ours = materialize(
        build_model(config, _causal), torch.device("cpu"), seed=0, weights_from=str(folder)
    ).eval()
    ids = torch.randint(0, VOCAB, (2, LENGTH))
    with torch.no_grad():
        torch.testing.assert_close(
            ours(ids, torch.arange(LENGTH)), hf(input_ids=ids).logits, atol=2e-5, rtol=1e-4
        )


@pytest.mark.parametrize(
    "model_type,rope_scaling",
    [
        ("qwen3", QWEN3_PUBLISHED),
        ("qwen3", {**QWEN3_PUBLISHED, "attention_factor": 1.3}),
        (
            "llama",  # the legacy "type" key, the ramp's bounds untruncated, mscale's ratio
            {
                "type": "yarn",
                "factor": 8.0,
                "original_max_position_embeddings": 16,
                "beta_fast": 16.0,
                "beta_slow": 2.0,
                "truncate": False,
                "mscale": 2.0,
                "mscale_all_dim": 1.0,
            },
        ),
    ],
)
def test_yarn_logits_equal_transformers(tmp_path, model_type, rope_scaling):
    hf = _hf_model(model_type, dict(rope_scaling))
    hf.save_pretrained(tmp_path)
    config = get_family("causal_lm").resolve_config(path=str(tmp_path), from_config=None)
    assert config.rope_scaling["rope_type"] == "yarn"
    assert DecoderConfig.from_hf_dict(config.to_hf_dict()) == config
    # The config.json we export gives transformers the same RoPE.
    written = hf.config.__class__(**config.to_hf_dict()).rope_parameters
    assert {k: written[k] for k in rope_scaling if k != "type"} == {
        k: v for k, v in rope_scaling.items() if k != "type"
    }
    _assert_same_logits(config, tmp_path, hf)


@pytest.mark.parametrize("model_type,rope_type", [("qwen3", "yarn"), ("llama", "llama3")])
def test_a_config_without_the_original_length_reads_as_transformers_reads_it(
    tmp_path, model_type, rope_type
):
    """transformers' config takes `original_max_position_embeddings` from
    `max_position_embeddings` (64 here) when a config.json leaves it out; it was refused."""
    rope = {"rope_type": rope_type, "factor": 4.0}
    if rope_type == "llama3":
        rope.update(low_freq_factor=1.0, high_freq_factor=4.0)
    _hf_model(model_type, {**rope, "original_max_position_embeddings": 64}).save_pretrained(
        tmp_path
    )
    path = tmp_path / "config.json"
    written = json.loads(path.read_text())
    del written["rope_parameters"]["original_max_position_embeddings"]
    path.write_text(json.dumps(written))
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert hf.config.rope_parameters["original_max_position_embeddings"] == 64
    config = get_family("causal_lm").resolve_config(path=str(tmp_path), from_config=None)
    assert config.rope_scaling["original_max_position_embeddings"] == 64
    _assert_same_logits(config, tmp_path, hf)


def _config(**rope) -> dict:
    return {
        **get_family("causal_lm").presets["tiny"],
        "model_type": "llama",
        "rope_scaling": rope,
    }


@pytest.mark.parametrize(
    "rope,needle",
    [
        ({"rope_type": "yarn"}, "rope_scaling lacks 'factor'"),
        ({**QWEN3_PUBLISHED, "factor": 0}, "rope_scaling.factor must be a finite number > 0"),
        ({**QWEN3_PUBLISHED, "beta_fast": "32"}, "rope_scaling.beta_fast must be a finite number"),
        ({**QWEN3_PUBLISHED, "mscale": -1.0}, "rope_scaling.mscale must be a finite number >= 0"),
        ({**QWEN3_PUBLISHED, "attention_factor": 0.0}, "rope_scaling.attention_factor must be"),
        ({**QWEN3_PUBLISHED, "truncate": "no"}, "rope_scaling.truncate must be true or false"),
    ],
)
def test_bad_yarn_keys_are_refused(rope, needle):
    with pytest.raises(DllmError, match=needle):
        DecoderConfig.from_hf_dict(_config(**rope))


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "dynamic", "factor": 2.0},
        {
            "rope_type": "longrope",
            "short_factor": [1.0] * 16,
            "long_factor": [2.0] * 16,
            "original_max_position_embeddings": 16,
        },
    ],
)
def test_run_time_rope_types_are_refused_naming_the_supported_ones(rope):
    with pytest.raises(DllmError) as refused:
        DecoderConfig.from_hf_dict(_config(**rope))
    message = str(refused.value)
    assert f"rope type {rope['rope_type']!r} is not supported" in message
    assert "follow each sequence's length at run time" in message
    assert "(supported: default, linear, llama3, yarn)" in message


def test_qwen3_8_takes_the_original_length_as_transformers_does():
    """The Qwen3.8 reader fills a yarn RoPE's original length as Qwen3_5TextConfig does."""
    from turbo_dllm.families.qwen3_8.config import PRESETS, Qwen38Config

    tiny = {**PRESETS["tiny"], "max_position_embeddings": 256}
    rope = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6, "partial_rotary_factor": 0.25}
    ours = Qwen38Config.from_hf_dict({**tiny, "rope_parameters": rope})
    theirs = transformers.Qwen3_5TextConfig(rope_parameters=dict(rope), max_position_embeddings=256)
    assert theirs.rope_parameters["original_max_position_embeddings"] == 256
    assert ours.rope_scaling["original_max_position_embeddings"] == 256
