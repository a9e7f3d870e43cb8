"""A model folder's config.json that its `model.family` cannot read is refused by `dllm config
validate` at model.family with what to write in it."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.dflash.helpers import tiny_drafter_config
from tests.helpers import assert_user_error
from turbo_dllm.registry import get_family


def _validate(cli, tmp_path, family: str, folder, *, block_size: int = 8):
    """`dllm config validate` of a spec training the model `folder` under `family` on synthetic
    data (written to tmp_path/train.yaml)."""
    spec = {
        "model": {"family": family, "path": str(folder)},
        "objective": {"name": "block_diffusion", "block_size": block_size},
        "data": {"synthetic": {"num_sequences": 8, "vocab_size": 64}, "seq_len": 64},
    }
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(spec))
    return cli("config", "validate", "--config", tmp_path / "train.yaml")


@pytest.mark.parametrize(
    "family,model_type", [("qwen3", '"qwen3"'), ("qwen3_8", '"qwen3_5" or "qwen3_5_text"')]
)
def test_a_config_json_without_model_type_says_to_add_it(cli, tmp_path, family, model_type):
    """It said "model.path '...' is a None model, which model.family 'qwen3' does not read" and
    "no family of this version reads None models"."""
    folder = tmp_path / "model"
    folder.mkdir()
    preset = dict(get_family(family).presets["tiny"])
    own = preset.pop("model_type")
    (folder / "config.json").write_text(json.dumps(preset))
    result = _validate(cli, tmp_path, family, folder)
    assert_user_error(result, "model.family:", f"'{folder}' names no model_type in its config.json")
    assert f'add "model_type": {model_type} to that config.json' in result.err
    assert "None" not in result.err, result.err
    # the fix, written as the message says, validates
    (folder / "config.json").write_text(json.dumps({**preset, "model_type": own}))
    assert _validate(cli, tmp_path, family, folder).code == 0


def test_a_diffusion_gemma_config_json_without_text_config_says_so(cli, tmp_path):
    """It said "config.json lacks the field 'num_hidden_layers' (a diffusion_gemma config.json
    from Hugging Face has it in text_config)": the whole text_config was missing."""
    folder = tmp_path / "model"
    folder.mkdir()
    preset = dict(get_family("diffusion_gemma").presets["tiny"])
    del preset["text_config"]
    (folder / "config.json").write_text(json.dumps(preset))
    result = _validate(cli, tmp_path, "diffusion_gemma", folder, block_size=16)
    assert_user_error(result, "model.path: config.json has no text_config")
    assert "lacks the field" not in result.err


def test_a_config_json_that_is_not_json_is_refused_at_start_with_its_fix(tmp_path):
    """`dllm train` / `dllm launch` list the data's misfits under their own hint ("change the
    spec, or prepare the data again to match it"); the model folder's unreadable config.json
    was among them without its fix."""
    from tests.families.test_model_tokenizer import huggingface, prepare, save_tokenizer, spec_of
    from turbo_dllm.data.artifact import read_manifest
    from turbo_dllm.data.compat import artifact_problems

    folder = tmp_path / "model"
    folder.mkdir()
    save_tokenizer(folder)
    artifact = prepare(tmp_path / "data", huggingface(folder))
    (folder / "config.json").write_text('{"model_type": "qwen3", ')  # cut short
    spec = spec_of("qwen3", folder, artifact)
    (line,) = [p for p in artifact_problems(read_manifest(artifact), spec) if "config.json" in p]
    assert line.startswith(f"model: cannot read '{folder}/config.json'"), line
    assert "(it is not valid JSON: download the model's config.json again" in line, line


def _drafter_config() -> dict:
    return tiny_drafter_config(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        head_dim=32,
        target_hidden_size=64,
        num_target_layers=2,
        target_layer_ids=(0, 1),
        block_size=8,
        mask_token_id=511,
    ).to_hf_dict()


@pytest.mark.parametrize(
    "family,config,readers",
    [
        ("qwen3_8", lambda: dict(get_family("qwen3").presets["tiny"]), "causal_lm or qwen3"),
        ("qwen3_8", _drafter_config, "dflash"),
        ("qwen3", _drafter_config, "dflash"),
        # a value the qwen3 reader refuses: still a qwen3 folder, still no drafter
        (
            "qwen3_8",
            lambda: {**get_family("qwen3").presets["tiny"], "num_hidden_layers": None},
            "causal_lm or qwen3",
        ),
    ],
)
def test_a_wrong_family_is_told_only_the_families_that_train_that_folder(
    cli, tmp_path, family, config, readers
):
    """A plain qwen3 folder under model.family qwen3_8 was told "set model.family to causal_lm
    or qwen3 or dflash" (a DFlash drafter's config.json says qwen3 too, but dflash does not
    train a plain model), and a drafter's folder "causal_lm or qwen3 or dflash" under qwen3_8
    and nothing under qwen3, whose weight check then failed."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config()))
    result = _validate(cli, tmp_path, family, folder)
    assert_user_error(result, "model.family: ", f"; set model.family to {readers}\n")
