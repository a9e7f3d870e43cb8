"""qwen3_8 reads its layer pattern as transformers does: `layer_types`, else the interval.

Published Qwen3.5 / Qwen3.8 config.json files hold both `layer_types` and
`full_attention_interval`. The reader rebuilt the pattern from the interval whenever the config
had one, so a `layer_types` override of such a config was dropped without a word, and a folder
whose two keys disagree trained another model than `Qwen3_5ForCausalLM` loads from it.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

from turbo_dllm.errors import DllmError
from turbo_dllm.families.qwen3_8.runtime import build_model
from turbo_dllm.registry import get_family
from turbo_dllm.train.weights import materialize

FAMILY = get_family("qwen3_8")
L, F = "linear_attention", "full_attention"


def _published(tmp_path, layers=8):
    """A config.json as the published ones spell it: layer_types and the interval, agreeing."""
    hf = copy.deepcopy(FAMILY.presets["qwen3.8-27b"])
    hf.update(num_hidden_layers=layers, layer_types=[L, L, L, F] * (layers // 4))
    hf["full_attention_interval"] = 4
    path = tmp_path / "config.json"
    path.write_text(json.dumps(hf))
    return str(path)


def test_a_layer_types_override_of_a_config_with_an_interval_is_not_dropped(tmp_path):
    config = _published(tmp_path)
    with pytest.raises(DllmError, match="disagree; transformers builds layer_types") as error:
        FAMILY.resolve_config(
            path=None,
            from_config=config,
            overrides={"num_hidden_layers": 4, "layer_types": [L, F, L, F]},
        )
    assert "(L F L F)" in error.value.message and "every 4: L L L F" in error.value.message
    # made to agree, it is the model asked for
    read = FAMILY.resolve_config(
        path=None,
        from_config=config,
        overrides={
            "num_hidden_layers": 4,
            "layer_types": [L, F, L, F],
            "full_attention_interval": 2,
        },
    )
    assert read.layer_types == (L, F, L, F)


def test_agreeing_keys_read_as_before(tmp_path):
    config = _published(tmp_path)
    assert FAMILY.resolve_config(path=None, from_config=config).layer_types == (L, L, L, F) * 2
    fewer = FAMILY.resolve_config(path=None, from_config=config, overrides={"num_hidden_layers": 4})
    assert fewer.layer_types == (L, L, L, F)
    more = FAMILY.resolve_config(path=None, from_config=config, overrides={"num_hidden_layers": 12})
    assert more.layer_types == (L, L, L, F) * 3  # the pattern the interval describes
    tiny = FAMILY.resolve_config(  # the tiny preset is L F L F: interval 2 agrees
        path=None, from_config="tiny", overrides={"full_attention_interval": 2}
    )
    assert tiny.layer_types == (L, F, L, F)
    hf = copy.deepcopy(FAMILY.presets["tiny"])
    del hf["layer_types"]
    hf["full_attention_interval"] = 2  # the interval alone
    assert FAMILY.read_config(hf).layer_types == (L, F, L, F)
    del hf["full_attention_interval"]  # neither: transformers' default, every 4th
    assert FAMILY.read_config(hf).layer_types == (L, L, L, F)


def test_a_folder_whose_interval_disagrees_with_its_layer_types_is_refused(tmp_path):
    """transformers builds layer_types (L F L F here); the reader built every-4th (L L L F)."""
    transformers = pytest.importorskip("transformers")
    from tests.train.test_qwen3_8_model import HF_SHAPE

    shape = {**HF_SHAPE, "num_hidden_layers": 4, "layer_types": [L, F, L, F]}
    torch.manual_seed(0)
    transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(**shape)).save_pretrained(
        tmp_path
    )
    config = json.loads((tmp_path / "config.json").read_text())
    config["full_attention_interval"] = 4
    (tmp_path / "config.json").write_text(json.dumps(config))
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert hf.config.layer_types == [L, F, L, F]  # what transformers builds
    with pytest.raises(DllmError, match="disagree"):
        FAMILY.resolve_config(path=str(tmp_path), from_config=None)
    config["full_attention_interval"] = 2  # agreeing: read and loaded as transformers does
    (tmp_path / "config.json").write_text(json.dumps(config))
    read = FAMILY.resolve_config(path=str(tmp_path), from_config=None)
    assert read.layer_types == (L, F, L, F)
    model = materialize(
        build_model(read, None), torch.device("cpu"), seed=0, weights_from=str(tmp_path)
    )
    assert dict(model.named_parameters()).keys() == dict(hf.named_parameters()).keys()
