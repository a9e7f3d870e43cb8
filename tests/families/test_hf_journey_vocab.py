"""A model folder whose embedding is smaller than the prepared data's ids: the refusal's fix says
why. It said "prepare the data with the tokenizer of model.path" also where the data was prepared
with exactly that tokenizer (a folder holding another model's, larger tokenizer) and where the
preparation's `tokenizer.mask_token_id` lay past the embedding (a tokenizer without a mask token):
preparing again as told gave the same refusal."""

from __future__ import annotations

import json

import pytest

from tests.families.test_model_tokenizer import (
    WORDS,
    config_folder,
    huggingface,
    prepare,
    save_tokenizer,
    spec_of,
)
from turbo_dllm.data.artifact import read_manifest
from turbo_dllm.data.compat import artifact_problems


def folder_of(tmp_path, vocab_size: int, mask: bool = True):
    folder = config_folder(tmp_path / "model", "qwen3")
    config = json.loads((folder / "config.json").read_text())
    config["vocab_size"] = vocab_size
    (folder / "config.json").write_text(json.dumps(config))
    save_tokenizer(folder, mask=mask)  # 3 specials (2 without the mask) + 8 words
    return folder


def vocab_problems(folder, artifact) -> list[str]:
    found = artifact_problems(read_manifest(artifact), spec_of("qwen3", folder, artifact))
    return [line for line in found if line.startswith("model: vocabulary of")]


def test_a_folder_tokenizer_larger_than_its_embedding_is_named(tmp_path):
    folder = folder_of(tmp_path, vocab_size=8)
    artifact = prepare(tmp_path / "data", huggingface(folder))  # the folder's own tokenizer
    (line,) = vocab_problems(folder, artifact)
    assert "smaller than the artifact's 11 token ids" in line, line
    assert f"the tokenizer saved in model.path {folder} has ids up to 10" in line, line
    assert "past the 8 rows of its model's embedding" in line and "not this model's" in line
    assert "prepare the data with the tokenizer of model.path" not in line


def test_a_mask_token_id_past_the_embedding_names_the_preparation_s_setting(tmp_path):
    folder = folder_of(tmp_path, vocab_size=10, mask=False)  # 10 tokens, no mask, no spare row
    artifact = prepare(tmp_path / "data", huggingface(folder), mask_token_id=10)
    (line,) = vocab_problems(folder, artifact)
    assert "the artifact's mask token 10 has no row in the model's embedding" in line, line
    assert "tokenizer.mask_token_id below 10" in line and "tokenizer.mask_token" in line
    # the fix: a mask id the embedding has (a spare row here, as the docs' padded vocabulary)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "vocab_size": 16}))
    assert vocab_problems(folder, artifact) == []


@pytest.mark.parametrize("mask_past", [False, True])
def test_data_of_another_tokenizer_still_says_prepare_with_the_folder_s(tmp_path, mask_past):
    """A tokenizer larger than the folder's, or one without a mask token given an id past the
    model's vocabulary: the data is not the folder's tokenizer's, so that is the fix."""
    folder = folder_of(tmp_path, vocab_size=11)
    other = tmp_path / "other"
    if mask_past:
        save_tokenizer(other, words=WORDS[::-1], mask=False)  # 10 tokens, no mask
        artifact = prepare(tmp_path / "data", huggingface(other), mask_token_id=11)
    else:
        save_tokenizer(other, words=[*"abcdefghij", "def", "return"])  # 15 tokens
        artifact = prepare(tmp_path / "data", huggingface(other))
    (line,) = vocab_problems(folder, artifact)
    assert f"prepare the data with the tokenizer of model.path {folder}" in line, line


def test_a_dflash_drafter_is_told_to_use_its_target_s_tokenizer(tmp_path):
    """A drafter's vocabulary is its target's: the fix said "set model.config_overrides.
    vocab_size: N", which config validate refuses for a drafter ("does not apply to a dflash
    drafter")."""
    from tests.train.util import TINY
    from turbo_dllm.config.load import apply_overrides
    from turbo_dllm.config.runspec import RunSpec

    target = folder_of(tmp_path, vocab_size=8)
    other = tmp_path / "other"
    save_tokenizer(other)  # 11 tokens, past the target's 8
    artifact = prepare(tmp_path / "data", huggingface(other))
    document = apply_overrides(
        TINY,
        [
            "model.family=dflash",
            "model.from_config=target",
            "model.config_overrides={}",
            f"model.dflash={{target: {target}, num_layers: 1, block_size: 4, mask_token_id: 2}}",
            "objective.name=dflash_distillation",
            "objective.block_size=4",
            f"data.artifact={artifact}",
            "data.synthetic=null",
            "data.seq_len=64",
        ],
    )
    spec = RunSpec.model_validate(document)
    found = artifact_problems(read_manifest(artifact), spec)
    (line,) = [line for line in found if line.startswith("model: vocabulary of")]
    assert f"prepare the data with the tokenizer of model.dflash.target {target}" in line, line
    assert "config_overrides" not in line
