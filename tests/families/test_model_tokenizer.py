"""A model folder's data must be tokenized with the folder's own tokenizer: the model reads the
data's ids, and another tokenizer's ids (where they fit its vocabulary) are other text to it,
so it trained on them silently. Every family that trains a model folder (`model.path`) refuses
such data before any work (its input rule: `dllm train`, `dllm launch`, `dllm data validate
--config`, `dllm doctor`), compared by the vocabulary sha256 the artifact records; a folder
without tokenizer files, synthetic data and a preset are not compared."""

from __future__ import annotations

import copy
import json
import shutil

import pytest
import yaml

from tests.helpers import assert_failed_check, assert_user_error
from tests.train.util import TINY
from turbo_dllm.config.load import apply_overrides
from turbo_dllm.config.runspec import RunSpec
from turbo_dllm.registry import get_family

WORDS = ["def", "return", "import", "class", "if", "else", "for", "in"]
SPECIALS = ["<|endoftext|>", "<|pad|>", "<|mask|>"]
TEXT = " ".join(WORDS) + "\n"
FAMILIES = ["causal_lm", "qwen3", "nemotron_diffusion", "qwen3_8", "diffusion_gemma"]
ANOTHER = "another tokenizer than the one in the model folder"
TINY_DATA = RunSpec.model_validate(TINY).data.synthetic


def save_tokenizer(folder, words=WORDS, mask=True) -> None:
    """A word-level Hugging Face tokenizer saved into `folder` (specials first, then `words`)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = SPECIALS if mask else SPECIALS[:2]
    vocab = {token: i for i, token in enumerate(specials + list(words))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<|pad|>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    named = {"mask_token": "<|mask|>"} if mask else {}
    PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|pad|>", **named
    ).save_pretrained(str(folder))


def prepare(folder, tokenizer, **extra):
    """A small artifact of TEXT prepared with `tokenizer` (a `tokenizer:` section)."""
    from turbo_dllm.data.prepare import prepare as run
    from turbo_dllm.data.spec import load_prepare_spec

    folder.mkdir(parents=True)
    (folder / "text.txt").write_text(TEXT * 200)
    config = {
        "source": {"kind": "text", "paths": [str(folder / "text.txt")]},
        "tokenizer": {**tokenizer, **extra},
        "packing": {"seq_len": 64, "block_size": 8},
        "output": {"path": str(folder / "artifact")},
        "workers": 1,
    }
    (folder / "prepare.yaml").write_text(yaml.safe_dump(config))
    run(load_prepare_spec(folder / "prepare.yaml", []), progress=False)
    return folder / "artifact"


def huggingface(path) -> dict:
    return {"kind": "huggingface", "path": str(path)}


def config_folder(folder, family: str):
    """A model folder of `family`'s tiny preset (config.json only: the input rules read no
    weights)."""
    folder.mkdir(parents=True)
    preset = get_family(family).presets["tiny"]
    (folder / "config.json").write_text(json.dumps(preset))
    return folder


def spec_of(family: str, folder, artifact) -> RunSpec:
    document = copy.deepcopy(TINY)
    document["model"] = {"family": family, "path": str(folder), "from_config": None}
    document["data"] = {"artifact": str(artifact), "seq_len": 64}
    return RunSpec.model_validate(apply_overrides(document, []))


def tokenizer_problems(spec) -> list[tuple[str, str]]:
    found = get_family(spec.model.family).input_problems(spec)
    return [(path, message) for path, message in found if ANOTHER in message]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    """Tokenizer A and an artifact of it; tokenizer B: A's words in another order (the same
    size and special ids: only the vocabulary tells them apart)."""
    root = tmp_path_factory.mktemp("tokenizers")
    save_tokenizer(root / "a")
    save_tokenizer(root / "b", words=WORDS[::-1])
    return {
        "a": root / "a",
        "b": root / "b",
        "artifact_a": prepare(root / "data_a", huggingface(root / "a")),
    }


@pytest.mark.parametrize("family", FAMILIES)
def test_data_of_another_tokenizer_than_the_model_folder_s_is_refused(family, tokenizers, tmp_path):
    folder = config_folder(tmp_path / "model", family)
    save_tokenizer(folder, words=WORDS[::-1])  # the folder's own: tokenizer B
    problems = tokenizer_problems(spec_of(family, folder, tokenizers["artifact_a"]))
    assert [path for path, _ in problems] == ["data.artifact"], problems
    message = problems[0][1]
    assert ANOTHER in message and str(folder) in message, message
    assert f"tokenizer {{kind: huggingface, path: {folder}}}" in message  # the hint
    # the data prepared with the folder's own tokenizer (tokenizer.path = the folder) passes
    own = prepare(tmp_path / "own", huggingface(folder))
    assert tokenizer_problems(spec_of(family, folder, own)) == []


def test_a_folder_without_a_tokenizer_synthetic_data_and_a_preset_are_not_compared(
    tokenizers, tmp_path
):
    folder = config_folder(tmp_path / "export", "qwen3")  # e.g. an export of a byte-level run
    byte_level = prepare(tmp_path / "bytes", {"kind": "byte_level"})
    for artifact in (byte_level, tokenizers["artifact_a"]):
        assert get_family("qwen3").input_problems(spec_of("qwen3", folder, artifact)) == []
    save_tokenizer(folder, words=WORDS[::-1])
    spec = spec_of("qwen3", folder, byte_level)
    assert "byte_level" in tokenizer_problems(spec)[0][1]  # byte-level data is another one too
    synthetic = spec.model_copy(
        update={"data": spec.data.model_copy(update={"artifact": None, "synthetic": TINY_DATA})}
    )
    assert get_family("qwen3").input_problems(synthetic) == []
    preset = spec.model_copy(
        update={"model": spec.model.model_copy(update={"path": None, "from_config": "tiny"})}
    )
    assert get_family("qwen3").input_problems(preset) == []


def test_a_migrated_qwen3_8_folder_matches_data_of_its_tokenizer_before_and_after(
    tokenizers, tmp_path
):
    """`dllm model add-mask-token` adds the mask token to the folder's tokenizer: data prepared
    with the migrated tokenizer matches, and so does data of the tokenizer it was migrated from
    (the same ids, the mask token given as tokenizer.mask_token_id); any other does not."""
    from turbo_dllm.families.qwen3_8.mask_token import migrate_mask_token

    folder = config_folder(tmp_path / "qwen", "qwen3_8")
    save_tokenizer(folder, mask=False)
    shutil.copytree(folder, tmp_path / "before")
    mask = migrate_mask_token(folder)["mask_token_id"]
    after = prepare(tmp_path / "after", huggingface(folder))
    before = prepare(tmp_path / "pre", huggingface(tmp_path / "before"), mask_token_id=mask)
    for artifact in (after, before):
        assert tokenizer_problems(spec_of("qwen3_8", folder, artifact)) == []
    problems = tokenizer_problems(spec_of("qwen3_8", folder, tokenizers["artifact_a"]))
    assert ANOTHER in problems[0][1], problems


def test_cli_train_validate_and_doctor_refuse_data_of_another_tokenizer(cli, tokenizers, tmp_path):
    """`dllm train` refused nothing and trained a Qwen3 folder on tokenizer A's ids, which its
    tokenizer B reads as other words; with data of the folder's own tokenizer it trains."""
    import torch
    import transformers

    folder = tmp_path / "model"
    config = transformers.Qwen3Config(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(config).save_pretrained(str(folder))
    save_tokenizer(folder, words=WORDS[::-1])
    base = copy.deepcopy(TINY)
    base["model"] = {"path": str(folder), "from_config": None}
    base["data"] = {"artifact": str(tokenizers["artifact_a"]), "seq_len": 64}
    base["training"]["steps"] = 2
    train = tmp_path / "train.yaml"
    train.write_text(yaml.safe_dump(base))

    result = cli("train", "--config", train, "--run-dir", tmp_path / "run")
    assert_user_error(result, "data.artifact:", ANOTHER, str(folder))
    assert not (tmp_path / "run").exists()  # before any work
    result = cli("data", "validate", tokenizers["artifact_a"], "--config", train)
    assert_failed_check(result, "data.artifact:", ANOTHER)
    doctor = cli("doctor", "--config", train, "--json")
    check = {c["name"]: c for c in json.loads(doctor.out)["checks"]}["data fit"]
    assert check["status"] == "fail" and ANOTHER in check["detail"], check

    own = prepare(tmp_path / "own", huggingface(folder))
    base["data"]["artifact"] = str(own)
    train.write_text(yaml.safe_dump(base))
    result = cli("data", "validate", own, "--config", train)
    assert result.code == 0, result.err
    result = cli("train", "--config", train, "--run-dir", tmp_path / "run")
    assert result.code == 0, result.err


def test_a_folder_whose_tokenizer_extends_the_data_s_matches(tokenizers, tmp_path):
    """An instruct model's tokenizer with chat tokens added after the base's vocabulary reads
    every id of data prepared with the base's tokenizer as the same token: not refused. One
    token that moved is refused."""
    folder = config_folder(tmp_path / "instruct", "qwen3")
    save_tokenizer(folder, words=WORDS + ["<|im_start|>", "<|im_end|>"])
    assert tokenizer_problems(spec_of("qwen3", folder, tokenizers["artifact_a"])) == []
    moved = config_folder(tmp_path / "moved", "qwen3")
    save_tokenizer(moved, words=WORDS[:-2] + WORDS[-1:] + WORDS[-2:-1] + ["<|im_start|>"])
    assert tokenizer_problems(spec_of("qwen3", moved, tokenizers["artifact_a"]))
