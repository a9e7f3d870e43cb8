"""An exported folder is ready for `generate`: tokenizer, generation config, special token ids."""

from __future__ import annotations

import copy
import json
import shutil

import pytest
import torch
import transformers

from tests.data.helpers import prepare_config, write_jsonl
from tests.data.helpers import write_config as write_prepare_config
from tests.train.util import TINY, tiny_spec
from turbo_dllm.train.entry import train
from turbo_dllm.train.export import export_checkpoint

WORDS = ["the", "fox", "runs", "over", "a", "dog", "and", "sleeps"]
PROMPT = torch.tensor([[5, 6, 7]])


def save_tokenizer(folder) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    specials = ["<|endoftext|>", "<|pad|>", "<|mask|>"]
    vocab = {token: i for i, token in enumerate(specials + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<|pad|>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|pad|>", mask_token="<|mask|>"
    ).save_pretrained(str(folder))


def save_source_model(folder) -> int:
    """A tiny Qwen3 folder whose eos is the token it greedily emits after PROMPT."""
    config = transformers.Qwen3Config(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        eos = int(model(input_ids=PROMPT).logits[0, -1].argmax())
    model.config.eos_token_id = model.generation_config.eos_token_id = eos
    model.config.bos_token_id = model.generation_config.bos_token_id = 1
    model.save_pretrained(str(folder))
    save_tokenizer(folder)
    return eos


def test_export_then_generate_stops_at_the_source_models_eos(tmp_path):
    eos = save_source_model(tmp_path / "source")
    base = copy.deepcopy(TINY)
    base["model"] = {"path": str(tmp_path / "source"), "from_config": None}
    # A vanishing learning rate: the trained model still emits `eos` after PROMPT.
    train(tiny_spec("training.steps=2", "optimizer.lr=1e-9", base=base), tmp_path / "run")
    out = export_checkpoint(tmp_path / "run/checkpoints", tmp_path / "hf")
    assert {"generation_config.json", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in out.iterdir()
    }
    config = json.loads((out / "config.json").read_text())
    assert (config["eos_token_id"], config["bos_token_id"]) == (eos, 1)
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == eos
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out)).eval()
    generated = hf.generate(PROMPT, max_new_tokens=12, do_sample=False)
    assert generated[0].tolist() == [5, 6, 7, eos]  # stopped at eos, not after 12 tokens
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    assert tokenizer.decode([vocab_id := tokenizer.convert_tokens_to_ids("fox")]) == "fox"
    assert vocab_id == 4


def test_a_random_init_model_takes_the_data_artifacts_tokenizer(tmp_path):
    save_tokenizer(tmp_path / "tokenizer")
    write_jsonl(tmp_path / "data.jsonl", [{"text": " ".join(WORDS * 4)}] * 20)
    tokenizer = {"kind": "huggingface", "path": str(tmp_path / "tokenizer")}
    prepare_config(write_prepare_config(tmp_path, tokenizer=tokenizer))
    artifact = tmp_path / "out"
    specials = json.loads((artifact / "manifest.json").read_text())["special_tokens"]
    spec = tiny_spec("training.steps=2", "data.synthetic=null", f"data.artifact={artifact}")
    train(spec, tmp_path / "run")
    out = export_checkpoint(tmp_path / "run/checkpoints", tmp_path / "hf")
    assert (out / "tokenizer.json").read_bytes() == (
        artifact / "tokenizer/tokenizer.json"
    ).read_bytes()
    config = json.loads((out / "config.json").read_text())
    assert config["eos_token_id"] == specials["eos"] and config["pad_token_id"] == specials["pad"]
    assert (
        json.loads((out / "generation_config.json").read_text())["eos_token_id"] == specials["eos"]
    )


def test_a_vanished_source_folder_is_said_not_silent(tmp_path, capsys):
    save_source_model(tmp_path / "source")
    base = copy.deepcopy(TINY)
    base["model"] = {"path": str(tmp_path / "source"), "from_config": None}
    train(tiny_spec("training.steps=2", base=base), tmp_path / "run")
    shutil.rmtree(tmp_path / "source")
    capsys.readouterr()
    out = export_checkpoint(tmp_path / "run/checkpoints", tmp_path / "hf")
    assert f"warning: {tmp_path / 'source'} (recorded in the checkpoint) is gone" in (
        capsys.readouterr().err
    )
    assert not (out / "tokenizer.json").exists()


def test_an_interrupted_export_leaves_no_partial_folder(tmp_path, monkeypatch):
    """Ctrl-C (or any error) while the folder is written used to leave `.hf.partial`, a hidden
    copy of the weights, beside --out."""
    from turbo_dllm.train import export

    train(tiny_spec("training.steps=2"), tmp_path / "run")

    def interrupted(meta, folder):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch, pytest.raises(KeyboardInterrupt):
        patch.setattr(export, "_copy_generation_files", interrupted)
        export_checkpoint(tmp_path / "run/checkpoints", tmp_path / "hf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    assert (
        export_checkpoint(tmp_path / "run/checkpoints", tmp_path / "hf") / "config.json"
    ).is_file()
