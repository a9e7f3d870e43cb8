"""A config.json value of the wrong JSON type (null, a string, a list, a flag, a fraction
where a count belongs) is refused naming its key and what it must hold, in every family: it
said "config.json has a bad value: int() argument must be ... not 'NoneType'", naming neither,
or read it silently ("4" as 4, 2.5 as 2 layers, true as 1, "false" as tied)."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.dflash.helpers import tiny_drafter_config
from tests.helpers import assert_user_error
from turbo_dllm.registry import get_family


def _validate(cli, tmp_path, family, config, *, block_size=8, overrides=None):
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    model = {"family": family, "path": str(folder)}
    if overrides:
        model["config_overrides"] = overrides
    spec = {
        "model": model,
        "objective": {"name": "block_diffusion", "block_size": block_size},
        "data": {"synthetic": {"num_sequences": 8, "vocab_size": 64}, "seq_len": 64},
    }
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(spec))
    return cli("config", "validate", "--config", tmp_path / "train.yaml")


def _preset(family):
    return json.loads(json.dumps(get_family(family).presets["tiny"]))


@pytest.mark.parametrize(
    "value,says",
    [
        (None, "num_hidden_layers is null; it must be an integer"),
        ("4", 'num_hidden_layers is the string "4"; it must be an integer, written without quotes'),
        ([4], "num_hidden_layers is [4]; it must be an integer"),
        (2.5, "num_hidden_layers is 2.5; it must be an integer"),
        (True, "num_hidden_layers is true; it must be an integer"),
        (-1, "num_hidden_layers must be positive (got -1)"),
    ],
)
def test_a_bad_count_names_its_key_and_what_it_must_hold(cli, tmp_path, value, says):
    result = _validate(cli, tmp_path, "qwen3", {**_preset("qwen3"), "num_hidden_layers": value})
    where = "model.path: " if value == -1 else "model.path: config.json's "
    assert_user_error(result, where + says)
    assert "int()" not in result.err and "NoneType" not in result.err, result.err


def test_every_bad_value_is_listed_and_an_override_fixes_a_null(cli, tmp_path):
    config = {
        **_preset("qwen3"),
        "num_hidden_layers": None,
        "rms_norm_eps": None,
        "tie_word_embeddings": "false",  # bool("false") is True: it read as a tied model
        "eos_token_id": "x",
    }
    result = _validate(cli, tmp_path, "qwen3", config)
    assert_user_error(
        result,
        "num_hidden_layers is null; it must be an integer\n",
        "rms_norm_eps is null; it must be a number (or remove the key for the default)",
        'tie_word_embeddings is the string "false"; it must be true or false',
        'eos_token_id is the string "x"; it must be a token id or a list of them',
    )
    del config["rms_norm_eps"], config["eos_token_id"]
    config["tie_word_embeddings"] = False
    fixed = _validate(cli, tmp_path, "qwen3", config, overrides={"num_hidden_layers": 2})
    assert fixed.code == 0, fixed.err


def test_nested_keys_are_named_with_their_object(cli, tmp_path):
    """qwen3_5 and diffusion_gemma keep the text model in text_config."""
    text = _preset("qwen3_8")
    text.pop("model_type")
    config = {"model_type": "qwen3_5", "text_config": {**text, "num_hidden_layers": None}}
    result = _validate(cli, tmp_path, "qwen3_8", config)
    assert_user_error(result, "config.json's text_config.num_hidden_layers is null")

    gemma = _preset("diffusion_gemma")
    gemma["text_config"]["top_k_experts"] = "2"
    gemma["canvas_length"] = 16.5
    result = _validate(cli, tmp_path, "diffusion_gemma", gemma, block_size=16)
    assert_user_error(
        result,
        'config.json\'s text_config.top_k_experts is the string "2"; it must be an integer',
        "config.json's canvas_length is 16.5; it must be an integer",
    )


def test_nemotron_and_dflash_name_their_own_keys(cli, tmp_path):
    from turbo_dllm.errors import DllmError
    from turbo_dllm.families.dflash.config import DFlashConfig

    result = _validate(
        cli, tmp_path, "nemotron_diffusion", {**_preset("nemotron_diffusion"), "qk_norm": "true"}
    )
    assert_user_error(
        result, 'config.json\'s qk_norm is the string "true"; it must be true or false'
    )

    drafter = _drafter_dict()
    assert DFlashConfig.from_hf_dict(drafter).num_hidden_layers == 2
    drafter["num_hidden_layers"] = None
    drafter["dflash_config"]["mask_token_id"] = "10"
    with pytest.raises(DllmError) as caught:
        DFlashConfig.from_hf_dict(drafter)
    message = caught.value.message
    assert "drafter config.json's num_hidden_layers is null; it must be an integer" in message
    assert 'drafter config.json\'s dflash_config.mask_token_id is the string "10"' in message


def test_a_drafter_config_without_a_mask_token_or_with_bad_layer_ids_names_the_key():
    """It said "drafter config.json has a bad value: int() argument must be ... not
    'NoneType'" (no mask token anywhere) and "invalid literal for int() with base 10: 'a'",
    with the hint "or set it with model.config_overrides", which model.family dflash refuses."""
    from turbo_dllm.errors import DllmError
    from turbo_dllm.families.dflash.config import DFlashConfig

    drafter = _drafter_dict()
    drafter["dflash_config"].pop("mask_token_id")
    drafter.pop("mask_token_id", None)
    with pytest.raises(DllmError, match="drafter config.json lacks the field 'mask_token_id'"):
        DFlashConfig.from_hf_dict(json.loads(json.dumps(drafter)))
    drafter["dflash_config"].update(mask_token_id=10, target_layer_ids=["a"])
    with pytest.raises(DllmError) as caught:
        DFlashConfig.from_hf_dict(drafter)
    assert (
        'dflash_config.target_layer_ids is ["a"]; it must be a list of integers'
        in caught.value.message
    )
    drafter["dflash_config"]["target_layer_ids"] = [0, 2]
    drafter.update(model_type="llama", num_attention_heads=3)  # 8 / 3: no head size
    del drafter["head_dim"]
    with pytest.raises(DllmError, match="not a multiple of num_attention_heads") as caught:
        DFlashConfig.from_hf_dict(drafter)
    assert caught.value.hint == (
        "fix that value in the drafter's config.json (model.family dflash takes no "
        "model.config_overrides)"
    )


def _drafter_dict() -> dict:
    """A tiny DFlash drafter's config.json, as the export writes it."""
    return tiny_drafter_config().to_hf_dict()
