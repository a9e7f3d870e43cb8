"""A model folder saved by transformers, read as `model.path`: what starts training from it and
what refuses it before the first step."""

from __future__ import annotations

import json

import pytest
import torch

from turbo_dllm.errors import DllmError
from turbo_dllm.registry import get_family
from turbo_dllm.train.weights import materialize

transformers = pytest.importorskip("transformers")


def hf_folder(folder, **extra):
    """A tiny random Qwen3ForCausalLM saved to `folder` (tied head unless told)."""
    config = transformers.Qwen3Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        **{"tie_word_embeddings": True, **extra},
    )
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(config)
    model.save_pretrained(str(folder))
    return model


def ours(folder, **overrides):
    family = get_family("qwen3")
    config = family.resolve_config(path=str(folder), from_config=None, overrides=overrides)
    model = family.runtime().build_model(config, None)
    return materialize(model, torch.device("cpu"), seed=0, weights_from=str(folder))


def test_an_untied_config_over_a_tied_folder_names_the_head_and_the_flag(tmp_path):
    """A tied model's folder whose config.json says tie_word_embeddings: false (edited, or
    written by hand): it said "1 weights missing ... does config.json match the weights
    (model_type, layers, tie_word_embeddings)?"; transformers loads it with a random head."""
    hf = hf_folder(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
    with pytest.raises(DllmError) as refused:
        ours(tmp_path)
    assert "holds no lm_head.weight (the output head)" in refused.value.message
    assert "tie_word_embeddings: false" in refused.value.message
    assert "model.config_overrides: {tie_word_embeddings: true}" in refused.value.hint
    # the hint's override loads the folder's weights, the head being the embedding
    model = ours(tmp_path, tie_word_embeddings=True)
    embedding = hf.model.embed_tokens.weight
    torch.testing.assert_close(model.model.embed_tokens.weight, embedding, rtol=0, atol=0)
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_a_folder_lacking_a_layer_s_tensor_keeps_the_general_message(tmp_path):
    from safetensors.torch import load_file, save_file

    hf_folder(tmp_path, tie_word_embeddings=False)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    del tensors["model.layers.0.mlp.up_proj.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(DllmError, match="does config.json match the weights"):
        ours(tmp_path)


def _doctor_model_check(cli, tmp_path, folder, vocab_size):
    """`dllm doctor --json`'s model check of a RunSpec training `folder` (model.path, no
    from_config, no overrides, synthetic data of `vocab_size` ids)."""
    from tests.train.util import write_config

    spec = write_config(
        tmp_path / "t.yaml",
        f"model.path={folder}",
        "model.from_config=null",
        "model.config_overrides={}",
        f"data.synthetic.vocab_size={vocab_size}",
    )
    result = cli("doctor", "--config", spec, "--json")
    (check,) = [c for c in json.loads(result.out)["checks"] if c["name"] == "model"]
    return check


@pytest.mark.parametrize("damage", ["shard missing", "torn header"])
def test_doctor_reads_the_weight_files_headers(cli, tmp_path, damage):
    """A sharded folder missing a shard its index names, or a model.safetensors cut short:
    doctor's model check passed them (it looked for the file names only), so `dllm launch`
    wrote a run dir and its worker failed; the check now names the file, as the trainer does."""
    folder = tmp_path / "model"
    if damage == "shard missing":
        hf_folder(folder).save_pretrained(str(folder), max_shard_size="20KB")
        shards = sorted(folder.glob("model-*-of-*.safetensors"))
        assert len(shards) > 1
        shards[1].unlink()
        words = ("lists 1 shard file(s) that", "copy or download every shard the index names")
    else:
        hf_folder(folder)
        (folder / "model.safetensors").write_bytes(b"\x10\x00")
        words = ("model.safetensors' is unreadable as safetensors", "damaged")
    check = _doctor_model_check(cli, tmp_path, folder, 64)
    assert check["status"] == "fail", check
    assert words[0] in check["detail"] and words[1] in check["fix"], check


@pytest.mark.parametrize("change", ["untied", "vocab_size"])
def test_doctor_refuses_a_config_json_that_does_not_match_the_weights(cli, tmp_path, change):
    """The trainer's refusals of the folder's tensors (the untied head above; a vocab_size the
    embedding does not have) were met only once `dllm launch` had written a run dir: doctor's
    model check now checks the tensors' names and shapes from the headers."""
    folder = tmp_path / "model"
    hf_folder(folder)
    config = json.loads((folder / "config.json").read_text())
    edit = {"tie_word_embeddings": False} if change == "untied" else {"vocab_size": 48}
    (folder / "config.json").write_text(json.dumps({**config, **edit}))
    check = _doctor_model_check(cli, tmp_path, folder, 48)
    assert check["status"] == "fail", check
    if change == "untied":
        assert "holds no lm_head.weight" in check["detail"], check
    else:
        assert (
            "has shape (64, 32) in model.safetensors, the model expects (48, 32)" in check["detail"]
        ), check
    # the folder as saved passes
    (folder / "config.json").write_text(json.dumps(config))
    check = _doctor_model_check(cli, tmp_path, folder, 48)
    assert check["status"] == "pass", check


def test_doctor_reads_a_dflash_target_s_weight_files(cli, tmp_path):
    """A drafter's frozen target (model.dflash.target) without weights: doctor said ready, and
    `dllm launch` wrote a run dir whose worker failed ("no safetensors weights in ...")."""
    from tests.train.util import write_config

    target = tmp_path / "target"
    hf_folder(target)
    spec = write_config(
        tmp_path / "t.yaml",
        "model.family=dflash",
        "model.from_config=target",
        "model.config_overrides={}",
        f"model.dflash={{target: {target}, num_layers: 1, block_size: 4, mask_token_id: 63}}",
        "objective.name=dflash_distillation",
        "objective.block_size=4",
        "objective.max_anchors=8",
        "data.synthetic.vocab_size=64",
    )

    def model_check() -> dict:
        result = cli("doctor", "--config", spec, "--json")
        (check,) = [c for c in json.loads(result.out)["checks"] if c["name"] == "model"]
        return check

    assert model_check()["status"] == "pass", model_check()
    (target / "model.safetensors").unlink()
    check = model_check()
    assert check["status"] == "fail", check
    assert check["detail"] == f"model.dflash.target: no safetensors weights in '{target}'"
    assert "model.safetensors.index.json" in check["fix"]


def test_a_shape_mismatch_names_the_config_keys_the_folder_left_out(tmp_path):
    """A config.json without head_dim takes transformers' default for qwen3 (128), which is not
    this model's 16: the weights then "do not match config.json" and nothing said why. The hint
    names the key left out and the value taken; an absent tie_word_embeddings is said as absent,
    not as "says false"."""
    hf_folder(tmp_path, tie_word_embeddings=False)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["head_dim"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(DllmError) as refused:
        ours(tmp_path)
    assert "the model expects" in refused.value.message
    assert "it leaves out head_dim" in refused.value.hint
    assert "head_dim 128" in refused.value.hint

    hf_folder(tmp_path)  # tied: no lm_head in the folder
    config = json.loads((tmp_path / "config.json").read_text())
    del config["tie_word_embeddings"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(DllmError) as refused:
        ours(tmp_path)
    assert "leaves out tie_word_embeddings" in refused.value.message
