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


@pytest.mark.parametrize("recipe", ["smoke/cpu-dflash", "smoke/cpu-dflash2"])
def test_cpu_dflash_recipe_trains_under_dllm_launch(cli, world, tmp_path, recipe):
    """`dllm launch` validates the spec it wrote to the run dir (every default spelled out):
    a DFlash drafter's DFlash2 shape fields at their defaults are not fields the user set."""
    (tmp_path / "data").mkdir()
    (tmp_path / "target").symlink_to(world["target"])
    (tmp_path / "data/prepared").symlink_to(world["artifact"])
    config = tmp_path / "train.yaml"
    assert cli("recipe", "copy", recipe, config).code == 0
    run = tmp_path / "run"
    overrides = ("--set", "training.steps=4", "--set", "data.seq_len=64")
    result = cli("launch", "--config", config, "--run-dir", run, *overrides)
    assert result.code == 0, result.err
    assert (run / "checkpoints/step_00000004/checkpoint.json").is_file()


def test_a_dflash_drafter_spec_written_back_with_every_default_validates(world):
    from tests.dflash.helpers import drafter_spec
    from turbo_dllm.config.runspec import RunSpec
    from turbo_dllm.config.validate import check

    spec = drafter_spec(world["target"], world["artifact"])
    again = check(RunSpec.model_validate(spec.model_dump(mode="json")))
    assert again.model.dflash == spec.model.dflash


def test_a_drafter_mask_token_that_is_not_the_artifacts_is_refused_before_training(
    cli, world, tmp_path
):
    """The drafter fills its draft slots with model.dflash.mask_token_id; only the artifact's
    mask token is kept out of the data. The recipe's 259 (the byte-level <|mask|>) on an
    artifact of another tokenizer is a real token of its text, and trained without a word."""
    from tests.helpers import assert_failed_check, assert_user_error

    (tmp_path / "data").mkdir()
    (tmp_path / "target").symlink_to(world["target"])
    (tmp_path / "data/prepared").symlink_to(world["artifact"])
    config = tmp_path / "train.yaml"
    assert cli("recipe", "copy", "smoke/cpu-dflash", config).code == 0
    overrides = ("--set", "data.seq_len=64", "--set", "training.steps=4")
    bad = ("--set", "model.dflash.mask_token_id=258")
    result = cli("train", "--config", config, "--run-dir", tmp_path / "run", *overrides, *bad)
    assert_user_error(
        result, "model.dflash.mask_token_id: 258, but the artifact's mask token is 259"
    )
    assert not (tmp_path / "run").exists()
    text = config.read_text().replace("mask_token_id: 259", "mask_token_id: 258")
    config.write_text(text.replace("seq_len: 128", "seq_len: 64"))
    validate = cli("data", "validate", world["artifact"], "--config", config)
    assert_failed_check(validate, "model.dflash.mask_token_id: 258")


def test_a_drafter_replay_refuses_a_changed_target(cli, world, tmp_path):
    """The frozen target decides what a drafter learns: the manifest hashes its files as
    `target_weights` (it recorded only model.path, none for a fresh drafter), so a replay on a
    target changed in place is refused with a field diff."""
    import shutil

    from tests.helpers import assert_user_error
    from turbo_dllm.jobs import provenance
    from turbo_dllm.jobs.manifest import RunManifest, write_manifest

    (tmp_path / "data").mkdir()
    shutil.copytree(world["target"], tmp_path / "target")
    (tmp_path / "data/prepared").symlink_to(world["artifact"])
    config = tmp_path / "train.yaml"
    assert cli("recipe", "copy", "smoke/cpu-dflash", config).code == 0
    result = cli("launch", "--config", config, "--dry-run", "--json", "--set", "data.seq_len=64")
    assert result.code == 0, result.err
    document = json.loads(result.out)["manifest"]
    manifest = RunManifest.model_validate(document)
    weights = tmp_path / "target/model.safetensors"
    assert manifest.target_weights.files == provenance.weights_ref(world["target"])["files"]
    (tmp_path / "recorded").mkdir()
    path = write_manifest(manifest, tmp_path / "recorded")
    assert cli("launch", "--manifest", path, "--dry-run").code == 0
    recorded = manifest.target_weights.files["model.safetensors"]
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # one weight of the target changed
    weights.write_bytes(bytes(data))
    changed = provenance.weights_ref(str(tmp_path / "target"))["files"]["model.safetensors"]
    assert_user_error(
        cli("launch", "--manifest", path, "--dry-run"),
        f"target_weights.files.model.safetensors: {recorded} -> {changed}",
    )
    # a manifest written before target_weights existed replays as it did
    del document["target_weights"]
    (tmp_path / "older").mkdir()
    older = tmp_path / "older/manifest.json"
    older.write_text(json.dumps(document))
    replay = cli("launch", "--manifest", older, "--dry-run")
    assert replay.code == 0, replay.err
