"""The drafter recipes: smoke/cpu-dflash trains from a local target and artifact; the H200
recipe validates against a Qwen3-8B-shaped config.json."""

from __future__ import annotations

import json

import pytest

from turbo_dllm.config.load import load_runspec
from turbo_dllm.config.recipe_catalog import find_recipe
from turbo_dllm.registry import resolve_model_config


@pytest.mark.parametrize("recipe", ["smoke/cpu-dflash", "smoke/cpu-dflash2"])
def test_cpu_dflash_recipe_trains_from_its_target_and_artifact(cli, world, tmp_path, recipe):
    (tmp_path / "data").mkdir()
    (tmp_path / "target").symlink_to(world["target"])
    (tmp_path / "data/prepared").symlink_to(world["artifact"])
    config = tmp_path / "train.yaml"
    assert cli("recipe", "copy", recipe, config).code == 0
    result = cli(
        "train",
        "--config",
        config,
        "--run-dir",
        tmp_path / "run",
        "--set",
        "training.steps=3",
        "--set",
        "data.seq_len=64",
    )
    assert result.code == 0, result.err
    assert (tmp_path / "run/checkpoints/step_00000003/checkpoint.json").is_file()


def _qwen3_8b(tmp_path):
    target = tmp_path / "models/Qwen3-8B"
    target.mkdir(parents=True)
    qwen3_8b = {
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "vocab_size": 151936,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 40960,
        "tie_word_embeddings": False,
    }
    (target / "config.json").write_text(json.dumps(qwen3_8b))


def test_h200_dflash_recipe_validates_against_a_qwen3_8b_shape(tmp_path):
    _qwen3_8b(tmp_path)
    config = tmp_path / "train.yaml"
    config.write_text(find_recipe("h200/dflash-qwen3-8b").text)
    spec = load_runspec(config, ["data.synthetic={vocab_size: 151936}", "data.artifact=null"])
    drafter = resolve_model_config(spec.model)
    assert drafter.num_hidden_layers == 5 and drafter.feature_size == 5 * 4096
    assert drafter.block_size == 16 and drafter.num_params() < 1.2e9


def test_2xh200_dflash2_cp_recipe_validates_against_a_qwen3_8b_shape(tmp_path):
    _qwen3_8b(tmp_path)
    config = tmp_path / "train.yaml"
    config.write_text(find_recipe("2xh200/dflash2-qwen3-8b-cp2").text)
    spec = load_runspec(config, ["data.synthetic={vocab_size: 151936}", "data.artifact=null"])
    drafter = resolve_model_config(spec.model)
    assert drafter.is_dflash2 and spec.topology.cp == 2 and spec.topology.world_size == 2
    assert drafter.block_size == 8 and drafter.num_params() < 1.5e9
