"""The export does not invent a pad token: a model without one exports without one.

`dllm data prepare` pads with the eos token where the tokenizer has no pad token (the
artifact's `special_tokens.pad` is then the eos id). The export filled the model's missing
`pad_token_id` from it, so a source folder with `pad_token_id: null` exported the eos id as
its pad token: transformers builds the embedding with `padding_idx = pad_token_id`, so the
eos row got no gradient when the export was trained further.
"""

from __future__ import annotations

import copy
import json

import torch
import transformers

from tests.data.helpers import prepare_config, write_jsonl
from tests.data.helpers import write_config as write_prepare_config
from tests.train.util import TINY, tiny_spec
from turbo_dllm.families.decoder.config import DecoderConfig
from turbo_dllm.train.entry import train
from turbo_dllm.train.export import export_checkpoint

WORDS = ["the", "fox", "runs", "over", "a", "dog", "and", "sleeps"]
EOS = 0  # <|endoftext|>: the tokenizer's eos, and no pad token


def save_tokenizer_without_pad(folder) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    specials = ["<|endoftext|>", "<|mask|>", "<|unk|>"]
    vocab = {token: i for i, token in enumerate(specials + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<|unk|>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", mask_token="<|mask|>"
    )
    assert tokenizer.pad_token is None
    tokenizer.save_pretrained(str(folder))


def save_source_model(folder) -> None:
    """A tiny Qwen3 folder whose config and generation config name no pad token."""
    config = transformers.Qwen3Config(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
        eos_token_id=EOS, pad_token_id=None, bos_token_id=None,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(config).save_pretrained(str(folder))
    save_tokenizer_without_pad(folder)
    assert json.loads((folder / "config.json").read_text()).get("pad_token_id") is None


def prepare_artifact(tmp_path, tokenizer_folder):
    write_jsonl(tmp_path / "data.jsonl", [{"text": " ".join(WORDS * 4)}] * 20)
    tokenizer = {"kind": "huggingface", "path": str(tokenizer_folder)}
    prepare_config(write_prepare_config(tmp_path, tokenizer=tokenizer))
    artifact = tmp_path / "out"
    specials = json.loads((artifact / "manifest.json").read_text())["special_tokens"]
    assert specials["pad"] == specials["eos"] == EOS  # prepare's stand-in for the missing pad
    return artifact


def assert_generates_without_a_pad_token(out) -> None:
    """transformers' generate pads finished rows with the first eos id by itself."""
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out)).eval()
    assert hf.config.pad_token_id is None and hf.generation_config.pad_token_id is None
    assert hf.model.embed_tokens.padding_idx is None  # the eos row keeps learning
    prompts = torch.tensor([[5, 6, 7], [4, 8, 9]])
    generated = hf.generate(
        prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=4, do_sample=False
    )
    assert generated.shape == (2, 7)


def test_a_model_folder_without_a_pad_token_exports_none(tmp_path):
    save_source_model(tmp_path / "source")
    artifact = prepare_artifact(tmp_path, tmp_path / "source")
    base = copy.deepcopy(TINY)
    base["model"] = {"path": str(tmp_path / "source"), "from_config": None}
    spec = tiny_spec(
        "training.steps=2", "data.synthetic=null", f"data.artifact={artifact}", base=base
    )
    train(spec, tmp_path / "run")
    out = export_checkpoint(tmp_path / "run/checkpoints", tmp_path / "hf")
    config = json.loads((out / "config.json").read_text())
    assert config.get("pad_token_id") is None and config["eos_token_id"] == EOS
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation.get("pad_token_id") is None and generation["eos_token_id"] == EOS
    assert DecoderConfig.from_hf_dict(config).pad_token_id is None  # our loader reads none too
    assert_generates_without_a_pad_token(out)


def test_a_random_init_model_does_not_take_prepare_s_stand_in_pad(tmp_path):
    """The artifact's pad is the eos id: the tokenizer had none, and neither does the model.
    (A tokenizer's own pad token is exported: test_export_generation.)"""
    save_tokenizer_without_pad(tmp_path / "tokenizer")
    artifact = prepare_artifact(tmp_path, tmp_path / "tokenizer")
    spec = tiny_spec("training.steps=2", "data.synthetic=null", f"data.artifact={artifact}")
    train(spec, tmp_path / "run")
    out = export_checkpoint(tmp_path / "run/checkpoints", tmp_path / "hf")
    config = json.loads((out / "config.json").read_text())
    assert config.get("pad_token_id") is None and config["eos_token_id"] == EOS
    generation = json.loads((out / "generation_config.json").read_text())  # written from it
    assert "pad_token_id" not in generation and generation["eos_token_id"] == EOS
    assert_generates_without_a_pad_token(out)
