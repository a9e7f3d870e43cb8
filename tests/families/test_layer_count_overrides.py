"""A `model.config_overrides.num_hidden_layers` override means the same in every family: the
model's first N layers. Their weights (a `model.path` folder's later layers are not read),
and the config's per-layer lists cut to those layers (`layer_types`; diffusion_gemma's
`per_layer_config` entries of later layers dropped). A longer model is built where the config
describes its pattern by a rule (qwen3_8's `full_attention_interval`; a config without
`layer_types`: the family's default); otherwise it is refused, naming `layer_types` and where a
longer list goes (a config.json: a RunSpec override takes no list).

diffusion_gemma refused every such override ("layer_types has 3 entries for 2 layers"), while
qwen3_8 kept the first layer_types.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

from tests.train.util import tiny_spec, two_step_run
from turbo_dllm.errors import DllmError
from turbo_dllm.registry import get_family
from turbo_dllm.train.entry import train
from turbo_dllm.train.export import export_checkpoint

transformers = pytest.importorskip("transformers")

L, F = "linear_attention", "full_attention"
S = "sliding_attention"

QWEN38 = two_step_run(
    {
        "family": "qwen3_8",
        "from_config": "tiny",
        "config_overrides": {"hidden_size": 64, "intermediate_size": 96},
    }
)
GEMMA = copy.deepcopy(QWEN38)
GEMMA["model"] = {"family": "diffusion_gemma", "from_config": "tiny"}
BASES = {"qwen3_8": QWEN38, "diffusion_gemma": GEMMA}
PRESET = {"qwen3_8": (L, F, L, F), "diffusion_gemma": (S, S, F)}


def gemma_config(tmp_path, layer_types, per_layer=None) -> str:
    """The tiny DiffusionGemma with another layer pattern (and, given `per_layer`, the full
    layers' shapes in the `per_layer_config` newer transformers write), as a config.json."""
    from turbo_dllm.families.diffusion_gemma.config import PRESETS

    hf = copy.deepcopy(PRESETS["tiny"])
    text = hf["text_config"]
    text.update(num_hidden_layers=len(layer_types), layer_types=list(layer_types))
    if per_layer is not None:
        text.pop("global_head_dim")
        text.pop("num_global_key_value_heads")
        text["per_layer_config"] = per_layer
    path = tmp_path / "gemma.json"
    path.write_text(json.dumps(hf))
    return str(path)


def refused(family: str, *overrides: str) -> DllmError:
    with pytest.raises(DllmError) as error:
        tiny_spec(*overrides, base=BASES[family])
    return error.value


@pytest.mark.parametrize("family", ["qwen3_8", "diffusion_gemma"])
def test_fewer_layers_keep_the_first_layer_types_trains_and_exports(tmp_path, family):
    base = copy.deepcopy(BASES[family])
    if family == "diffusion_gemma":  # S F S F: its first two end on a full layer
        base["model"]["from_config"] = gemma_config(tmp_path, (S, F, S, F))
        layers, kinds = 2, (S, F)
    else:  # the tiny preset's L F L F
        layers, kinds = 3, (L, F, L)
    spec = tiny_spec(f"model.config_overrides.num_hidden_layers={layers}", base=base)
    read = get_family(family).resolve_config(
        path=None, from_config=spec.model.from_config, overrides=spec.model.config_overrides
    )
    assert (read.num_hidden_layers, read.layer_types) == (layers, kinds)
    train(spec, tmp_path / "run")
    out = export_checkpoint(tmp_path / "run/checkpoints", tmp_path / "hf")
    config = json.loads((out / "config.json").read_text())
    written = config.get("text_config", config)
    assert (written["num_hidden_layers"], written["layer_types"]) == (layers, list(kinds))
    loaded = transformers.AutoConfig.from_pretrained(str(out))
    text = getattr(loaded, "text_config", loaded)
    assert (text.num_hidden_layers, tuple(text.layer_types)) == (layers, kinds)


def test_a_diffusion_gemma_whose_last_layer_is_sliding_is_refused(tmp_path):
    """transformers' DiffusionGemma makes its last layer full attention whatever layer_types
    says: a model trained with a sliding last layer (the tiny preset cut to 2 layers: S S, or
    a config.json listing one) exported a folder transformers builds as another model (the
    last layer's attention shapes differ: its weights do not load)."""
    error = refused("diffusion_gemma", "model.config_overrides.num_hidden_layers=2")
    assert "model.config_overrides:" in error.message
    assert "last layer" in error.message and "full_attention" in error.message
    base = copy.deepcopy(GEMMA)
    base["model"]["from_config"] = gemma_config(tmp_path, (S, F, S))
    with pytest.raises(DllmError, match="last layer"):
        tiny_spec(base=base)


@pytest.mark.parametrize("family", ["qwen3_8", "diffusion_gemma"])
def test_more_layers_than_the_pattern_lists_are_refused_naming_layer_types(family):
    error = refused(family, "model.config_overrides.num_hidden_layers=6")
    listed = len(PRESET[family])
    assert "model.config_overrides:" in error.message
    assert f"layer_types has {listed} entries for 6 layers" in error.message
    assert "one layer_types entry per layer in a config.json (model.from_config)" in (error.message)


def test_a_longer_qwen3_8_model_follows_its_interval():
    spec = tiny_spec(
        "model.config_overrides.num_hidden_layers=6",
        "model.config_overrides.full_attention_interval=2",
        base=QWEN38,
    )
    read = get_family("qwen3_8").resolve_config(
        path=None, from_config="tiny", overrides=spec.model.config_overrides
    )
    assert read.layer_types == (L, F) * 3


def test_diffusion_gemma_per_layer_entries_of_cut_layers_go_with_them(tmp_path):
    family = get_family("diffusion_gemma")
    entry = {"head_dim": 32, "num_key_value_heads": 1}
    path = gemma_config(tmp_path, (S, F, S, F), per_layer={"1": entry, "3": entry})
    assert family.resolve_config(path=None, from_config=path).global_head_dim == 32
    fewer = family.resolve_config(path=None, from_config=path, overrides={"num_hidden_layers": 2})
    assert (fewer.num_hidden_layers, fewer.layer_types, fewer.global_head_dim) == (2, (S, F), 32)


def _saved(family: str, folder) -> None:
    """A random transformers model of `family`'s shape with 3 layers (diffusion_gemma: 4, so
    that its first 2 end on a full layer), saved to `folder`."""
    torch.manual_seed(0)
    if family == "qwen3":
        config = transformers.Qwen3Config(
            vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        )  # fmt: skip
        transformers.Qwen3ForCausalLM(config).save_pretrained(str(folder))
    elif family == "qwen3_8":
        from tests.train.test_qwen3_8_model import HF_SHAPE

        shape = {**HF_SHAPE, "num_hidden_layers": 3, "layer_types": [L, F, L]}
        transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(**shape)).save_pretrained(
            str(folder)
        )
    else:
        from tests.families.dg_util import hf_model, tiny_hf_dict

        hf_model(folder, tiny_hf_dict(num_hidden_layers=4, layer_types=[S, F, S, F]))


@pytest.mark.parametrize("family", ["qwen3", "qwen3_8", "diffusion_gemma"])
def test_a_model_folder_s_first_layers_are_the_ones_loaded(tmp_path, family):
    """The same N in every family: the folder's first N layers, weights and kinds together."""
    from safetensors import safe_open

    from turbo_dllm.train.weights import full_state_dict, materialize

    _saved(family, tmp_path)
    registered = get_family(family)
    config = registered.resolve_config(
        path=str(tmp_path), from_config=None, overrides={"num_hidden_layers": 2}
    )
    assert config.num_hidden_layers == 2
    model = materialize(
        registered.runtime().build_model(config, None),
        torch.device("cpu"),
        seed=0,
        weights_from=str(tmp_path),
    )
    ours = full_state_dict(model)
    if hasattr(model, "hf_export_state"):
        ours = model.hf_export_state(ours)
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as stored:
        names = list(stored.keys())
        layer_one = [n for n in names if ".layers.1." in n]
        assert layer_one and all(n in ours for n in layer_one)
        for name in layer_one:
            assert torch.equal(ours[name], stored.get_tensor(name)), name
        assert not any(".layers.2." in n for n in ours)


def test_more_layers_than_the_folder_holds_names_the_override(tmp_path):
    """A decoder folder of 2 layers with num_hidden_layers: 4 (validation cannot see the
    weights): loading said '18 weights missing ...' with the hint 'does config.json match the
    weights', which it does; the override asked for layers the folder has none of."""
    from turbo_dllm.families.decoder.runtime import build_model
    from turbo_dllm.train.weights import full_state_dict, materialize, save_hf

    family = get_family("causal_lm")
    two = family.resolve_config(path=None, from_config="tiny", overrides={"num_hidden_layers": 2})
    model = materialize(build_model(two, None), torch.device("cpu"), seed=0)
    save_hf(full_state_dict(model), two, tmp_path / "two")
    four = family.resolve_config(
        path=str(tmp_path / "two"), from_config=None, overrides={"num_hidden_layers": 4}
    )
    with pytest.raises(DllmError) as caught:
        materialize(
            build_model(four, None), torch.device("cpu"), seed=0, weights_from=str(tmp_path / "two")
        )
    assert "the model has 4 layers (num_hidden_layers)" in caught.value.message, caught.value
    message = caught.value.message
    assert "holds weights for 2: model.layers.2.* to model.layers.3.* are missing" in message
    assert "num_hidden_layers to 2 or fewer" in caught.value.hint
    # a folder that lacks a tensor inside its own layers is another mismatch, named as before
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(tmp_path / "two/model.safetensors"))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(tmp_path / "two/model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(DllmError, match="1 weights missing .*model.layers.1.mlp.up_proj"):
        materialize(
            build_model(two, None), torch.device("cpu"), seed=0, weights_from=str(tmp_path / "two")
        )
