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


SENTENCES = ["the fox runs over a dog", "a dog sleeps and the fox runs", "the dog runs"]


def save_sentencepiece_tokenizer(folder) -> None:
    """A T5-style tokenizer whose vocabulary is only a sentencepiece `spiece.model` (no
    tokenizer.json), trained here on a few sentences."""
    import io

    import sentencepiece as spm  # the test extra's

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(SENTENCES * 20),
        model_writer=model,
        vocab_size=30,
        model_type="unigram",
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        hard_vocab_limit=False,
        minloglevel=2,
    )
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "spiece.model").write_bytes(model.getvalue())
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "T5Tokenizer", "extra_ids": 0})
    )


def assert_same_tokenizer(exported, source) -> None:
    """The export's tokenizer loads (from the export folder alone) and encodes like `source`."""
    theirs = transformers.AutoTokenizer.from_pretrained(str(source), local_files_only=True)
    ours = transformers.AutoTokenizer.from_pretrained(str(exported), local_files_only=True)
    assert len(ours) == len(theirs) > 10
    for text in [*SENTENCES, "a fox sleeps"]:
        assert ours(text).input_ids == theirs(text).input_ids


def test_a_sentencepiece_tokenizer_of_the_model_folder_is_exported(tmp_path):
    """Was: export copied a fixed list of file names without spiece.model: the folder held
    tokenizer_config.json alone, which AutoTokenizer loads as its 4 special tokens."""
    save_source_model(tmp_path / "source")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / "source" / name).unlink()
    save_sentencepiece_tokenizer(tmp_path / "source")
    base = copy.deepcopy(TINY)
    base["model"] = {"path": str(tmp_path / "source"), "from_config": None}
    train(tiny_spec("training.steps=2", base=base), tmp_path / "run")
    out = export_checkpoint(tmp_path / "run/checkpoints", tmp_path / "hf")
    assert (out / "spiece.model").read_bytes() == (tmp_path / "source/spiece.model").read_bytes()
    assert_same_tokenizer(out, tmp_path / "source")


def test_a_sentencepiece_tokenizer_goes_through_the_data_artifact_to_the_export(tmp_path):
    """A random-init model exports the tokenizer the artifact kept: the artifact must keep the
    sentencepiece file too (it kept tokenizer_config.json alone)."""
    save_sentencepiece_tokenizer(tmp_path / "tokenizer")
    write_jsonl(tmp_path / "data.jsonl", [{"text": " ".join(SENTENCES)}] * 20)
    tokenizer = {"kind": "huggingface", "path": str(tmp_path / "tokenizer"), "mask_token_id": 100}
    prepare_config(write_prepare_config(tmp_path, tokenizer=tokenizer))
    artifact = tmp_path / "out"
    assert (artifact / "tokenizer/spiece.model").is_file()
    spec = tiny_spec(
        "training.steps=2",
        "data.synthetic=null",
        f"data.artifact={artifact}",
        "objective.mask_token_id=100",
    )
    train(spec, tmp_path / "run")
    out = export_checkpoint(tmp_path / "run/checkpoints", tmp_path / "hf")
    assert_same_tokenizer(out, tmp_path / "tokenizer")


def test_the_tokenizer_files_are_those_its_class_reads(tmp_path):
    """No fixed list of names: the files the tokenizer's class names (PhobertTokenizer's
    bpe.codes), sentencepiece and tiktoken files; not the model's own files."""
    from turbo_dllm.data.tokenizers import tokenizer_files

    folder = tmp_path / "model"
    folder.mkdir()
    names = ["vocab.txt", "bpe.codes", "qwen.tiktoken", "sentencepiece.bpe.model"]
    for name in [*names, "config.json", "model.safetensors", "notes.txt"]:
        (folder / name).write_text("x\n")
    (folder / "tokenizer_config.json").write_text('{"tokenizer_class": "PhobertTokenizer"}')
    found = {p.name for p in tokenizer_files(folder)}
    assert found == {"tokenizer_config.json", *names}
    save_source_model(tmp_path / "no tokenizer")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / "no tokenizer" / name).unlink()
    assert tokenizer_files(tmp_path / "no tokenizer") == []


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


def test_a_vanished_source_folder_names_what_the_export_takes_instead(tmp_path, capsys):
    """Its warning said the export had 'no tokenizer or generation_config.json from it', and
    the folder then held both: the data artifact's copy of the tokenizer and a
    generation_config.json written from config.json's ids (the source's settings lost)."""
    eos = save_source_model(tmp_path / "source")
    write_jsonl(tmp_path / "data.jsonl", [{"text": " ".join(WORDS * 4)}] * 20)
    tokenizer = {"kind": "huggingface", "path": str(tmp_path / "source")}
    prepare_config(write_prepare_config(tmp_path, tokenizer=tokenizer))
    base = copy.deepcopy(TINY)
    base["model"] = {"path": str(tmp_path / "source"), "from_config": None}
    base["data"] = {"artifact": str(tmp_path / "out"), "seq_len": 64}
    train(tiny_spec("training.steps=2", base=base), tmp_path / "run")
    shutil.rmtree(tmp_path / "source")
    capsys.readouterr()
    out = export_checkpoint(tmp_path / "run/checkpoints", tmp_path / "hf")
    err = capsys.readouterr().err
    assert (
        f"warning: {tmp_path / 'source'} (recorded in the checkpoint) is gone: the export lacks "
        f"its tokenizer and generation_config.json; the tokenizer is the data artifact "
        f"{tmp_path / 'out'}'s copy; generation_config.json is written from config.json's "
        "token ids (move the folder back to that path and export again" in err
    )
    assert (out / "tokenizer.json").is_file()
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == eos


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


def test_the_source_s_chat_templates_named_ones_included_are_exported(tmp_path):
    """transformers saves a tokenizer's default chat template as chat_template.jinja and its
    named ones (`tool_use`, ...) in additional_chat_templates/: the export had the default only,
    and `apply_chat_template(chat_template="tool_use")` on it rendered the string "tool_use"
    (transformers takes a name it does not know for a template) without a word."""
    save_source_model(tmp_path / "source")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "source"))
    tokenizer.chat_template = {
        "default": "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}",
        "tool_use": "TOOLS{% for m in messages %}[{{ m.content }}]{% endfor %}",
    }
    tokenizer.save_pretrained(str(tmp_path / "source"))
    assert (tmp_path / "source/additional_chat_templates/tool_use.jinja").is_file()
    base = copy.deepcopy(TINY)
    base["model"] = {"path": str(tmp_path / "source"), "from_config": None}
    train(tiny_spec("training.steps=2", base=base), tmp_path / "run")
    out = export_checkpoint(tmp_path / "run/checkpoints", tmp_path / "hf")
    exported = transformers.AutoTokenizer.from_pretrained(str(out))
    messages = [{"role": "user", "content": "the fox"}]
    assert exported.apply_chat_template(messages, tokenize=False) == "<user>the fox"
    tools = exported.apply_chat_template(messages, tokenize=False, chat_template="tool_use")
    assert tools == "TOOLS[the fox]"
