"""A drafter's data must be tokenized with its target's tokenizer: the target reads the data's
token ids, so data of another tokenizer (of ids the target's vocabulary covers) would train the
drafter on hidden states of other text, silently. Refused where the target folder has a
tokenizer to compare with; a target folder without one (a turbo-dllm export of a byte-level
run) is not checked."""

from __future__ import annotations

import shutil

import pytest
import yaml

from tests.dflash.helpers import drafter_spec
from turbo_dllm.errors import DllmError
from turbo_dllm.jobs.launcher import check_inputs
from turbo_dllm.registry import get_family

WORDS = ["def", "return", "import", "class", "if", "else", "for", "in"]


def _with_tokenizer(target, folder, words=WORDS):
    """A copy of `target` with a small word-level Hugging Face tokenizer saved beside it."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    shutil.copytree(target, folder)
    specials = ["<|endoftext|>", "<|pad|>", "<|mask|>"]
    vocab = {token: i for i, token in enumerate(specials + list(words))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<|pad|>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|pad|>", mask_token="<|mask|>"
    ).save_pretrained(str(folder))
    return folder


def _artifact(tokenizer, folder):
    from turbo_dllm.data.prepare import prepare
    from turbo_dllm.data.spec import load_prepare_spec

    folder.mkdir()
    (folder / "text.txt").write_text("def f():\n    return 1\n" * 200)
    config = {
        "source": {"kind": "text", "paths": [str(folder / "text.txt")]},
        "tokenizer": {"kind": "huggingface", "path": str(tokenizer)},
        "packing": {"seq_len": 64, "block_size": 4},
        "output": {"path": str(folder / "artifact")},
        "workers": 1,
    }
    (folder / "prepare.yaml").write_text(yaml.safe_dump(config))
    prepare(load_prepare_spec(folder / "prepare.yaml", []), progress=False)
    return folder / "artifact"


def test_data_of_another_tokenizer_than_the_targets_is_refused(world, tmp_path):
    target = _with_tokenizer(world["target"], tmp_path / "target")
    spec = drafter_spec(target, world["artifact"])  # byte-level data, a word-level target
    problems = get_family("dflash").input_problems(spec)
    assert [path for path, _ in problems] == ["data.artifact"], problems
    assert "tokenizer" in problems[0][1] and str(target) in problems[0][1]
    assert f"than the one in the target {str(target)!r} (vocabulary" in problems[0][1]
    with pytest.raises(DllmError, match="another tokenizer"):
        check_inputs(spec, "train.yaml")
    # data prepared with the target's own tokenizer passes
    artifact = _artifact(target, tmp_path / "data")
    spec = drafter_spec(target, artifact, "model.dflash.mask_token_id=2")
    assert get_family("dflash").input_problems(spec) == []
    check_inputs(spec, "train.yaml")


def test_a_target_without_a_tokenizer_is_not_compared(world):
    spec = drafter_spec(world["target"], world["artifact"])
    assert get_family("dflash").input_problems(spec) == []


def test_a_target_whose_tokenizer_extends_the_data_s_passes(world, tmp_path):
    """A target whose tokenizer holds every (token, id) of the data's and more (chat tokens added
    after it) reads the data's ids as the same text: not refused; one moved token is."""
    base = _with_tokenizer(world["target"], tmp_path / "base")
    artifact = _artifact(base, tmp_path / "data")
    extended = _with_tokenizer(world["target"], tmp_path / "extended", WORDS + ["<|im_start|>"])
    spec = drafter_spec(extended, artifact, "model.dflash.mask_token_id=2")
    assert get_family("dflash").input_problems(spec) == []
    moved = _with_tokenizer(world["target"], tmp_path / "moved", WORDS[1:] + WORDS[:1])
    spec = drafter_spec(moved, artifact, "model.dflash.mask_token_id=2")
    assert [path for path, _ in get_family("dflash").input_problems(spec)] == ["data.artifact"]
