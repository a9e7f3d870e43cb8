"""A config.json without `head_dim` means what transformers makes of it: its config class's
default where it has one (Qwen3 128, Qwen3.5 and DiffusionGemma 256, Ministral3 128), else
hidden_size / num_attention_heads (Llama, Qwen2). Every family took hidden / heads: a Qwen3
folder without head_dim trained another model (32-wide heads for transformers' 128)."""

from __future__ import annotations

import dataclasses
import inspect
import json

import pytest

from turbo_dllm.families.base import HEAD_DIM_DEFAULTS, KEY_DEFAULTS
from turbo_dllm.registry import get_family

transformers = pytest.importorskip("transformers")

# model_type -> transformers' config class name of the model (the remote-code Nemotron's is
# Ministral3Config, which its config class extends: tests/train/test_export_nemotron.py).
_CLASS_OF = {"nemotron_labs_diffusion": "ministral3"}


def _text_config_class(model_type):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[_CLASS_OF.get(model_type, model_type)]
    return getattr(cls, "sub_configs", {}).get("text_config", cls)


def _declared_default(cls):
    """The default a transformers config class gives head_dim (None: it has none)."""
    fields = {f.name: f for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
    if "head_dim" in fields:
        return fields["head_dim"].default
    parameter = inspect.signature(cls.__init__).parameters.get("head_dim")
    return None if parameter is None else parameter.default


@pytest.mark.parametrize("model_type", sorted(HEAD_DIM_DEFAULTS))
def test_the_table_is_the_installed_transformers(model_type):
    assert HEAD_DIM_DEFAULTS[model_type] == _declared_default(_text_config_class(model_type))


def _transformers_head_dim(model_type, hf):
    """The head size transformers' attention takes for `hf` (its modeling code reads
    `getattr(config, "head_dim", ...)`)."""
    cls = transformers.AutoConfig.for_model(_CLASS_OF.get(model_type, model_type)).__class__
    config = cls(**{k: v for k, v in hf.items() if k != "model_type"})
    text = getattr(config, "text_config", None) or config
    values = text.to_dict()
    head_dim = values.get("head_dim")
    return (
        head_dim if head_dim is not None else values["hidden_size"] // values["num_attention_heads"]
    )


def _without_head_dim(family, model_type):
    hf = json.loads(json.dumps(get_family(family).presets["tiny"]))
    hf["model_type"] = model_type
    text = hf.get("text_config", hf)
    del text["head_dim"]
    text["hidden_size"] = 96  # hidden / heads differs from every default
    return hf, text


@pytest.mark.parametrize(
    "family,model_type",
    [
        ("causal_lm", "llama"),
        ("causal_lm", "qwen2"),
        ("qwen3", "qwen3"),
        ("qwen3_8", "qwen3_5_text"),
        ("diffusion_gemma", "diffusion_gemma"),
        ("nemotron_diffusion", "nemotron_labs_diffusion"),
    ],
)
def test_a_config_without_head_dim_reads_as_transformers_reads_it(family, model_type):
    hf, text = _without_head_dim(family, model_type)
    ours = get_family(family).read_config(json.loads(json.dumps(hf)))
    oracle = hf if model_type != "nemotron_labs_diffusion" else _ministral_view(hf)
    assert ours.head_dim == _transformers_head_dim(model_type, oracle)
    assert ours.head_dim == (HEAD_DIM_DEFAULTS[model_type] or 96 // text["num_attention_heads"])


def _ministral_view(hf):
    own = ("qk_norm", "v_norm", "attn_output_gate", "block_size", "dlm_paradigm", "mask_token_id")
    return {k: v for k, v in hf.items() if k not in own}


def test_a_qwen3_drafter_without_head_dim_takes_qwen3s():
    from turbo_dllm.families.dflash.config import DFlashConfig

    fields = dict(vocab_size=11, hidden_size=96, intermediate_size=16, num_hidden_layers=2)
    fields |= dict(num_attention_heads=2, num_key_value_heads=1, head_dim=4)
    drafter = DFlashConfig(
        **fields,
        target_hidden_size=96,
        num_target_layers=3,
        target_layer_ids=(0, 2),
        block_size=4,
        mask_token_id=10,
    ).to_hf_dict()
    del drafter["head_dim"]
    assert drafter["model_type"] == "qwen3"
    assert DFlashConfig.from_hf_dict(drafter).head_dim == _transformers_head_dim("qwen3", {})


def test_a_null_head_dim_derives_where_transformers_takes_null_and_is_refused_elsewhere():
    from turbo_dllm.errors import DllmError

    llama, _ = _without_head_dim("causal_lm", "llama")
    llama["head_dim"] = None
    assert get_family("causal_lm").read_config(dict(llama)).head_dim == 24
    assert _transformers_head_dim("llama", llama) == 24

    qwen3, _ = _without_head_dim("qwen3", "qwen3")
    qwen3["head_dim"] = None
    from huggingface_hub.errors import StrictDataclassError

    with pytest.raises(StrictDataclassError, match="head_dim"):  # transformers refuses it
        _transformers_head_dim("qwen3", qwen3)
    with pytest.raises(DllmError, match="head_dim is null, which a qwen3 config does not take"):
        get_family("qwen3").read_config(dict(qwen3))


def _field_default(cls, key):
    fields = {f.name: f for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
    if key in fields:
        return fields[key].default
    return inspect.signature(cls.__init__).parameters[key].default


@pytest.mark.parametrize("model_type", sorted(KEY_DEFAULTS))
def test_the_key_defaults_are_the_installed_transformers(model_type):
    cls = _text_config_class(model_type)
    assert {key: _field_default(cls, key) for key in KEY_DEFAULTS[model_type]} == (
        KEY_DEFAULTS[model_type]
    )


# (family, model_type, the text config's heads: a multiple of the
# model_type's num_key_value_heads default)
_MINIMAL = [
    ("causal_lm", "llama", 4),
    ("causal_lm", "qwen2", 32),
    ("qwen3", "qwen3", 32),
    ("qwen3_8", "qwen3_5_text", 8),
    ("diffusion_gemma", "diffusion_gemma", 8),
]
_COMPARED = (
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "linear_conv_kernel_dim",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
)


@pytest.mark.parametrize("family,model_type,heads", _MINIMAL)
def test_a_config_with_only_the_required_keys_reads_as_transformers_reads_it(
    family, model_type, heads
):
    """Each key a config.json may leave out takes transformers' default for that model: a
    Qwen3 without num_key_value_heads has 32 (Qwen3Config's), not num_attention_heads; a
    Qwen3.5 without the linear-attention sizes Qwen3_5TextConfig's (they were required)."""
    sizes = dict(vocab_size=64, hidden_size=128, intermediate_size=96, num_hidden_layers=6)
    sizes["num_attention_heads"] = heads
    if family == "diffusion_gemma":
        sizes |= dict(num_experts=4, top_k_experts=2, moe_intermediate_size=32)
        hf = {"model_type": model_type, "text_config": sizes}
    else:
        hf = {"model_type": model_type, **sizes}
    ours = get_family(family).read_config(json.loads(json.dumps(hf)))
    cls = transformers.AutoConfig.for_model(model_type).__class__
    theirs = cls(**{k: v for k, v in hf.items() if k != "model_type"})
    values = (getattr(theirs, "text_config", None) or theirs).to_dict()
    values.setdefault("head_dim", values["hidden_size"] // heads)  # Qwen2's attention derives it
    compared = [key for key in _COMPARED if hasattr(ours, key)]
    assert {k: getattr(ours, k) for k in compared} == {k: values[k] for k in compared}


def test_an_absent_kv_head_count_that_cannot_group_the_heads_says_where_it_comes_from():
    from turbo_dllm.errors import DllmError

    hf = {"model_type": "qwen3", "vocab_size": 64, "hidden_size": 64, "intermediate_size": 96}
    hf |= {"num_hidden_layers": 2, "num_attention_heads": 4}
    with pytest.raises(DllmError, match="num_key_value_heads is absent, so transformers takes "):
        get_family("qwen3").read_config(hf)
    assert (
        get_family("qwen3").read_config({**hf, "num_key_value_heads": None}).num_key_value_heads
        == 4
    )


def test_nemotron_keeps_its_own_max_position_default_through_the_llama_view():
    """nemotron_diffusion is read through the decoder as a llama config; an absent
    max_position_embeddings took LlamaConfig's 2048 there once KEY_DEFAULTS held it, not the
    family's 4096 (its remote-code config class is no LlamaConfig)."""
    hf = json.loads(json.dumps(get_family("nemotron_diffusion").presets["tiny"]))
    del hf["max_position_embeddings"]
    assert get_family("nemotron_diffusion").read_config(hf).max_position_embeddings == 4096


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3"])
def test_mlp_bias_builds_mlp_biases_only_where_transformers_does(model_type):
    """A qwen2 / qwen3 config.json with mlp_bias: true built MLP biases here, which
    transformers' Qwen2MLP / Qwen3MLP never have (they ignore the key): another model, whose
    folder's weights lack them."""
    import importlib

    sizes = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1)
    sizes |= dict(num_attention_heads=2, num_key_value_heads=1, head_dim=16, mlp_bias=True)
    family = "qwen3" if model_type == "qwen3" else "causal_lm"
    ours = get_family(family).read_config({"model_type": model_type, **sizes})
    config = transformers.AutoConfig.for_model(model_type, **sizes)
    module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    mlp = getattr(module, f"{config.__class__.__name__.removesuffix('Config')}MLP")(config)
    assert ours.mlp_bias == (mlp.gate_proj.bias is not None)


def test_hidden_act_swish_is_silu_as_in_transformers():
    """transformers' ACT2FN["swish"] is SiLU; a config.json saying swish was refused
    ("hidden_act 'swish' is not supported")."""
    import torch
    from transformers.activations import ACT2FN

    assert isinstance(ACT2FN["swish"], torch.nn.SiLU)
    for family in ("qwen3", "qwen3_8"):
        hf = json.loads(json.dumps(get_family(family).presets["tiny"]))
        assert get_family(family).read_config({**hf, "hidden_act": "swish"}).hidden_act == "silu"
