"""A model.path folder whose weights cannot be read is a user error naming the file: a damaged
or torn model.safetensors, a torn model.safetensors.index.json and an index naming a shard the
folder lacks were a safetensors / JSON traceback (exit 1) naming no file, or the bare "No such
file or directory" of the missing shard."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import yaml

from tests.helpers import assert_user_error
from tests.train.util import TINY
from turbo_dllm.config.load import apply_overrides
from turbo_dllm.families.decoder.config import DecoderConfig
from turbo_dllm.families.decoder.runtime import build_model
from turbo_dllm.train.weights import (
    UnreadableWeights,
    full_state_dict,
    materialize,
    save_hf,
)

SHAPE = {
    "model_type": "qwen3",
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
}


def _model():
    return build_model(DecoderConfig.from_hf_dict(SHAPE), None)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("weights")
    model = materialize(_model(), torch.device("cpu"), seed=0)
    state = full_state_dict(model)
    save_hf(state, model.config, root / "single")
    save_hf(state, model.config, root / "sharded", max_shard_size=8000)
    assert (root / "sharded/model.safetensors.index.json").is_file()
    return root


def _broken(folders, tmp_path, how: str):
    source = "sharded" if how in ("torn index", "no weight_map", "missing shard") else "single"
    folder = shutil.copytree(folders / source, tmp_path / how.replace(" ", "-"))
    index = folder / "model.safetensors.index.json"
    if how == "damaged":
        (folder / "model.safetensors").write_bytes(b"not safetensors" * 8)
    elif how == "torn":  # the header whole, the data cut short
        data = (folder / "model.safetensors").read_bytes()
        (folder / "model.safetensors").write_bytes(data[:-1000])
    elif how == "torn index":
        index.write_text(index.read_text()[:40])
    elif how == "no weight_map":
        index.write_text(json.dumps({"metadata": {}}))
    elif how == "missing shard":
        sorted(folder.glob("model-*.safetensors"))[1].unlink()
    return folder


CASES = {
    "damaged": ("model.safetensors'", "unreadable as safetensors"),
    "torn": ("model.safetensors'", "unreadable as safetensors"),
    "torn index": ("model.safetensors.index.json'", "not a safetensors shard index"),
    "no weight_map": ("model.safetensors.index.json'", "no 'weight_map'"),
    "missing shard": ("shard file(s) that", "lacks: model-00002-of-"),
}


@pytest.mark.parametrize("how", list(CASES))
def test_loading_names_the_unreadable_file(folders, tmp_path, how):
    folder = _broken(folders, tmp_path, how)
    with pytest.raises(UnreadableWeights) as caught:
        materialize(_model(), torch.device("cpu"), seed=0, weights_from=str(folder))
    for needle in CASES[how]:
        assert needle in caught.value.message, caught.value.message
    assert str(folder) in caught.value.message
    assert caught.value.hint


def test_the_intact_folders_load(folders):
    for name in ("single", "sharded"):
        materialize(_model(), torch.device("cpu"), seed=0, weights_from=str(folders / name))


def test_dllm_train_reports_a_damaged_model_path(cli, folders, tmp_path):
    folder = _broken(folders, tmp_path, "damaged")
    document = apply_overrides(
        TINY,
        [
            f"model.path={folder}",
            "model.from_config=null",
            "model.config_overrides={}",
            "data.synthetic.vocab_size=64",
            "training.steps=1",
            "scheduler.warmup_steps=0",
            "checkpoint.interval=null",
        ],
    )
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump(document))
    result = cli("train", "--config", config, "--run-dir", tmp_path / "run")
    assert_user_error(result, str(folder / "model.safetensors"), "unreadable as safetensors")
