"""DiffusionGemma's `per_layer_config` read as transformers reads it.

transformers (5.2x) writes the full-attention layers' shapes as `per_layer_config`: each
layer's entry changes the text config's values for that layer, so a full layer listed without
`head_dim` (or not listed) has the text's `head_dim`. The reader took a missing `head_dim` as
0 (refusing a folder transformers loads) and an empty `per_layer_config` as absent (reading the
legacy `global_head_dim` default, 512), and ignored every other key of an entry and a legacy
`global_head_dim` that disagreed with it.
"""

from __future__ import annotations

import copy

import pytest
import torch

from tests.families.dg_util import hf_model, ours, tiny_hf_dict
from turbo_dllm.errors import DllmError
from turbo_dllm.families.diffusion_gemma.config import DiffusionGemmaConfig
from turbo_dllm.train.attention import CanvasLayout

transformers = pytest.importorskip("transformers")
per_layer = pytest.mark.skipif(
    "per_layer_config" not in transformers.DiffusionGemmaTextConfig().to_dict(),
    reason="this transformers reads global_head_dim, not per_layer_config",
)


def _per_layer(entries: dict) -> dict:
    hf = tiny_hf_dict(per_layer_config=entries)
    for key in ("global_head_dim", "num_global_key_value_heads"):
        del hf["text_config"][key]
    return hf


def _clean_logits(hf, ids):
    logits = hf.lm_head(hf.model.encoder(input_ids=ids).last_hidden_state).float()
    cap = hf.final_logit_softcapping
    return torch.tanh(logits / cap) * cap


@per_layer
@pytest.mark.parametrize(
    "entries, full",
    [
        ({"2": {"num_key_value_heads": 1}}, (8, 1)),  # head_dim: the text's (8), was 0
        ({}, (8, 2)),  # nothing listed: the text's shape, was global_head_dim's default 512
        ({"02": {"head_dim": 16}}, (16, 2)),  # kv heads: the text's
    ],
)
def test_full_layers_take_the_text_config_s_shape_where_an_entry_leaves_it(tmp_path, entries, full):
    hf = hf_model(tmp_path, _per_layer(entries))
    attention = hf.model.decoder.layers[2].self_attn
    assert (attention.head_dim, attention.k_proj.out_features // attention.head_dim) == full
    read = DiffusionGemmaConfig.from_hf_dict(_per_layer(entries))
    assert (read.global_head_dim, read.num_global_key_value_heads) == full
    model, backend = ours(tmp_path)  # the folder transformers saved, read and loaded
    layout = CanvasLayout(12, 4, 4)
    torch.manual_seed(1)
    ids = torch.randint(0, 97, (2, 12))
    xt = torch.randint(0, 97, (2, layout.canvas_len))
    mask = backend.prepare(layout, None, torch.device("cpu"))
    with torch.no_grad():
        logits = model(torch.cat([xt, ids], 1), layout.positions(), mask)
        clean = _clean_logits(hf, ids)
    torch.testing.assert_close(logits[:, layout.canvas_len :], clean, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "entries, words",
    [
        ({"0": {"head_dim": 16}}, "sliding-attention layers another head_dim"),
        ({"2": {"head_dim": 16, "intermediate_size": 64}}, "layer 2 its own intermediate_size"),
        ({"1": {"sliding_window": 9}}, "layer 1 its own sliding_window"),
    ],
)
def test_an_entry_the_model_does_not_build_is_refused_not_ignored(entries, words):
    with pytest.raises(DllmError, match=words):
        DiffusionGemmaConfig.from_hf_dict(_per_layer(entries))
    # the same values as text_config's are no change
    same = {"1": {"head_dim": 8, "sliding_window": 5}, "2": {"head_dim": 16}}
    assert DiffusionGemmaConfig.from_hf_dict(_per_layer(same)).global_head_dim == 16


def test_a_legacy_global_head_dim_that_disagrees_with_per_layer_config_is_refused():
    """An override of global_head_dim (written to the config's root) on a folder transformers
    saved with per_layer_config: transformers ignores it, and so did the reader, silently."""
    hf = _per_layer({"2": {"head_dim": 16, "num_key_value_heads": 1}})
    agreeing = copy.deepcopy(hf)
    agreeing["global_head_dim"] = 16
    assert DiffusionGemmaConfig.from_hf_dict(agreeing).global_head_dim == 16
    for key, value in (("global_head_dim", 32), ("num_global_key_value_heads", 2)):
        changed = copy.deepcopy(hf)
        changed[key] = value
        with pytest.raises(DllmError, match=f"{key} = {value} disagrees with per_layer_config"):
            DiffusionGemmaConfig.from_hf_dict(changed)


def test_a_block_size_other_than_the_folder_s_canvas_length_is_refused(tmp_path):
    """transformers' DiffusionGemma generates canvases of `canvas_length` tokens (the folder's,
    kept by the export): a run at another block size exported a model that generates with
    blocks it was not trained on, without a word."""
    from turbo_dllm.config.load import load_model
    from turbo_dllm.config.runspec import RunSpec
    from turbo_dllm.config.validate import problems

    hf_model(tmp_path)  # canvas_length 4

    def found(block_size, **overrides):
        document = {
            "model": {
                "family": "diffusion_gemma",
                "path": str(tmp_path),
                "from_config": None,
                "config_overrides": overrides,
            },
            "objective": {"name": "diffusiongemma_sft", "block_size": block_size},
            "data": {"synthetic": {"num_sequences": 8, "vocab_size": 97}, "seq_len": 32},
        }
        return {p.path: p.message for p in problems(load_model(RunSpec, document, "test"))}

    assert "not the model folder's canvas_length (4)" in found(8)["objective.block_size"]
    assert "{canvas_length: 8}" in found(8)["objective.block_size"]
    assert found(4) == {}
    assert found(8, canvas_length=8) == {}  # trained and exported at 8
