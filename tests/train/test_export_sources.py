"""`dllm export` takes the tokenizer and token ids of the data artifact a random-init model was
trained on only while that artifact holds the same data, and records the mask token id."""

from __future__ import annotations

import json

import transformers

from tests.data.helpers import prepare_config, write_jsonl
from tests.data.helpers import write_config as write_prepare_config
from tests.train.test_export_generation import WORDS, save_tokenizer
from tests.train.util import tiny_spec
from turbo_dllm.train.entry import train
from turbo_dllm.train.export import export_checkpoint


def test_an_artifact_prepared_again_since_training_gives_no_tokenizer(tmp_path, capsys):
    """Prepared again at its path with another tokenizer, its tokenizer and special token ids
    were written into the export as the model's, without a word."""
    save_tokenizer(tmp_path / "tokenizer")
    write_jsonl(tmp_path / "data.jsonl", [{"text": " ".join(WORDS * 4)}] * 20)
    tokenizer = {"kind": "huggingface", "path": str(tmp_path / "tokenizer")}
    prepare_config(write_prepare_config(tmp_path, tokenizer=tokenizer))
    artifact = tmp_path / "out"
    trained = json.loads((artifact / "manifest.json").read_text())
    spec = tiny_spec("training.steps=2", "data.synthetic=null", f"data.artifact={artifact}")
    train(spec, tmp_path / "run")
    # The same data again: still the run's artifact.
    out = export_checkpoint(tmp_path / "run/checkpoints", tmp_path / "same")
    assert (out / "tokenizer.json").is_file()
    config = json.loads((out / "config.json").read_text())
    assert config["eos_token_id"] == trained["special_tokens"]["eos"]
    # Prepared again with the byte-level tokenizer: other ids for eos and pad.
    prepare_config(write_prepare_config(tmp_path, output={"path": "out", "overwrite": True}))
    again = json.loads((artifact / "manifest.json").read_text())
    assert again["special_tokens"]["eos"] != trained["special_tokens"]["eos"]
    capsys.readouterr()
    out = export_checkpoint(tmp_path / "run/checkpoints", tmp_path / "hf")
    err = capsys.readouterr().err
    assert f"warning: {artifact} (recorded in the checkpoint) was prepared again" in err
    assert f"trained on {trained['fingerprint'][:16]}" in err
    assert not (out / "tokenizer.json").exists()
    config = json.loads((out / "config.json").read_text())
    assert config.get("eos_token_id") != again["special_tokens"]["eos"]
    assert config.get("pad_token_id") != again["special_tokens"]["pad"]


def test_the_mask_token_the_run_trained_with_is_recorded(tmp_path):
    """A decoder's config has no mask token of its own: an export of a run whose tokenizer
    names none (byte-level data: id 259), or that set objective.mask_token_id, kept no trace of
    the id the model denoises from."""
    write_jsonl(tmp_path / "data.jsonl", [{"text": " ".join(WORDS * 4)}] * 20)
    prepare_config(write_prepare_config(tmp_path))  # byte-level
    artifact = tmp_path / "out"
    specials = json.loads((artifact / "manifest.json").read_text())["special_tokens"]
    spec = tiny_spec("training.steps=2", "data.synthetic=null", f"data.artifact={artifact}")
    train(spec, tmp_path / "run")
    out = export_checkpoint(tmp_path / "run/checkpoints", tmp_path / "hf")
    config = json.loads((out / "config.json").read_text())
    assert (config["mask_token_id"], config["eos_token_id"]) == (specials["mask"], specials["eos"])
    assert "mask_token_id" not in json.loads((out / "generation_config.json").read_text())
    assert transformers.AutoConfig.from_pretrained(str(out)).mask_token_id == specials["mask"]
    train(tiny_spec("training.steps=2", "objective.mask_token_id=300"), tmp_path / "synthetic")
    out = export_checkpoint(tmp_path / "synthetic/checkpoints", tmp_path / "hf-synthetic")
    assert json.loads((out / "config.json").read_text())["mask_token_id"] == 300


def test_a_file_added_to_the_artifact_s_tokenizer_is_not_exported(tmp_path):
    """Export hands on the tokenizer files the artifact's manifest lists (prepare's record of
    the tokenizer trained with): an added_tokens.json put into its tokenizer/ after prepare (which
    transformers would load as part of the tokenizer) is not exported as the model's. Training
    on such an artifact runs (the loader reads the listed files; `dllm data validate` names the
    extra one)."""
    save_tokenizer(tmp_path / "tokenizer")
    write_jsonl(tmp_path / "data.jsonl", [{"text": " ".join(WORDS * 4)}] * 20)
    tokenizer = {"kind": "huggingface", "path": str(tmp_path / "tokenizer")}
    prepare_config(write_prepare_config(tmp_path, tokenizer=tokenizer))
    artifact = tmp_path / "out"
    listed = set(json.loads((artifact / "manifest.json").read_text())["tokenizer_files"])
    (artifact / "tokenizer/added_tokens.json").write_text('{"<extra>": 0}')
    spec = tiny_spec("training.steps=2", "data.synthetic=null", f"data.artifact={artifact}")
    train(spec, tmp_path / "run")
    out = export_checkpoint(tmp_path / "run/checkpoints", tmp_path / "hf")
    assert not (out / "added_tokens.json").exists()
    assert listed and all((out / name).is_file() for name in listed)
