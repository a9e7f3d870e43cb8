"""qwen3_8 exports at shapes other than the published one: transformers' Qwen3_5ForCausalLM
loads them to the same logits, and the config's multimodal RoPE split fits the model's rotary
dims (it was always the 27B's [11, 11, 10], 32 frequencies, whatever head_dim was)."""

from __future__ import annotations

import json

import pytest
import torch

from tests.train.test_export_families import QWEN38
from tests.train.util import tiny_spec
from turbo_dllm.families.qwen3_8.config import PRESETS, Qwen38Config, mrope_section_for
from turbo_dllm.registry import get_family
from turbo_dllm.train.entry import train
from turbo_dllm.train.export import export_checkpoint
from turbo_dllm.train.weights import materialize

transformers = pytest.importorskip("transformers")

# One short step: the weights are trained ones (not the init transformers would draw).
ONE_STEP = (
    "training.steps=1",
    "checkpoint.interval=1",
    "data.seq_len=16",
    "training.micro_batch_size=1",
)


def causal(q, k, v, mask):
    return torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=True, enable_gqa=True
    )


def test_an_export_at_another_head_dim_splits_its_own_rotary_dims(tmp_path):
    """head_dim 64 x partial_rotary_factor 0.25: 16 rotary dims, 8 frequencies, split [3, 3, 2]
    as transformers' interleaved layout reads them (the export said [11, 11, 10]: 32)."""
    overrides = (
        "model.config_overrides.head_dim=64",
        "model.config_overrides.num_key_value_heads=1",
    )
    train(tiny_spec(*ONE_STEP, *overrides, base=QWEN38), tmp_path / "run")
    out = export_checkpoint(tmp_path / "run/checkpoints", tmp_path / "hf")
    rope = json.loads((out / "config.json").read_text())["rope_parameters"]
    assert rope["mrope_section"] == [3, 3, 2] and rope["mrope_interleaved"] is True

    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(hf).__name__ == "Qwen3_5ForCausalLM"
    assert sum(hf.config.rope_parameters["mrope_section"]) == hf.model.rotary_emb.inv_freq.numel()
    family = get_family("qwen3_8")
    config = family.resolve_config(path=str(out), from_config=None)
    assert config.head_dim == 64 and config.num_key_value_heads == 1
    model = family.runtime().build_model(config, causal)
    model = materialize(model, torch.device("cpu"), seed=0, weights_from=str(out)).eval()
    ids = torch.randint(0, 512, (1, 24))
    with torch.no_grad():
        torch.testing.assert_close(
            model(ids, torch.arange(24)), hf(input_ids=ids).logits, atol=2e-5, rtol=1e-4
        )


@pytest.mark.parametrize(
    ("rotary_dim", "section"), [(64, (11, 11, 10)), (8, (2, 1, 1)), (128, (22, 21, 21))]
)
def test_the_split_covers_every_frequency_once(rotary_dim, section):
    assert mrope_section_for(rotary_dim) == section
    frequencies = rotary_dim // 2
    height = set(range(1, 3 * section[1], 3)) & set(range(frequencies))  # transformers' slices
    width = set(range(2, 3 * section[2], 3)) & set(range(frequencies))
    assert (len(height), len(width)) == section[1:]
    assert frequencies - len(height) - len(width) == section[0]


def test_a_source_s_fitting_split_is_kept_and_a_misfit_rederived():
    published = Qwen38Config.from_hf_dict(PRESETS["qwen3.8-27b"])
    assert published.to_hf_dict()["rope_parameters"]["mrope_section"] == [11, 11, 10]
    own = {**PRESETS["qwen3.8-27b"], "rope_parameters": {
        **PRESETS["qwen3.8-27b"]["rope_parameters"], "mrope_section": [12, 10, 10]}}  # fmt: skip
    assert Qwen38Config.from_hf_dict(own).to_hf_dict()["rope_parameters"]["mrope_section"] == [
        12, 10, 10]  # fmt: skip
    smaller = Qwen38Config.from_hf_dict({**PRESETS["qwen3.8-27b"], "head_dim": 128})
    assert smaller.to_hf_dict()["rope_parameters"]["mrope_section"] == [6, 5, 5]
