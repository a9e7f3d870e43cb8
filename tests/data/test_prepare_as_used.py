"""What a user preparing real data ran into: each test failed before its fix."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.data.conftest import CORPUS
from tests.data.helpers import documents, prepare_config, write_config, write_jsonl
from turbo_dllm.data.artifact import verify

BOS, EOS = 256, 257


# --- prepend_bos never makes two bos in a row -----------------------------------------------


@pytest.mark.parametrize("supervision", ["full", "provided"])
def test_prepend_bos_keeps_the_bos_a_document_already_starts_with(tmp_path, supervision):
    """Ids from a tokenizer that adds bos itself (Llama's), with packing.prepend_bos: true,
    were packed as bos bos ...; now the document's own bos is the one, unsupervised."""
    rows = [
        {"input_ids": [BOS, 104, 105], "loss_mask": [1, 1, 1]},  # starts with bos
        {"input_ids": [106, 107], "loss_mask": [1, 1]},  # does not: gets one
        {"input_ids": [104, BOS, 105], "loss_mask": [1, 1, 1]},  # one inside: it stays
        {"input_ids": [BOS], "loss_mask": [1]},  # nothing but a bos
    ]
    write_jsonl(tmp_path / "data.jsonl", rows)
    records = {"kind": "tokens"}
    if supervision == "provided":
        records["loss_mask_field"] = "loss_mask"
    config = write_config(
        tmp_path,
        records=records,
        supervision=supervision,
        packing={"seq_len": 16, "block_size": 4, "prepend_bos": True},
        on_error="skip",
    )
    result = prepare_config(config)
    docs = documents(result.path)
    expected = [
        ([BOS, 104, 105, EOS], [0, 1, 1, 1]),
        ([BOS, 106, 107, EOS], [0, 1, 1, 1]),
        ([BOS, 104, BOS, 105, EOS], [0, 1, 1, 1, 1]),
    ]
    if supervision == "full":
        expected.append(([BOS, EOS], [0, 1]))
    else:  # its one supervised token was the bos, which is never scored
        assert result.manifest.stats.skipped == {"no_supervised_tokens": 1}
    assert [(t.tolist(), m.astype(int).tolist()) for t, m in docs] == expected
    verify(result.path)  # supervision full: every token but the one bos of each document


def test_prepend_bos_with_a_chat_template_that_writes_bos(tmp_path):
    """A Llama/Mistral-style template starts with {{ bos_token }}: with prepend_bos: true
    every conversation began <s><s>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<s>", "</s>", "<pad>", "<mask>", "[INST]", "[/INST]"]
    tok.train_from_iterator(
        CORPUS,
        trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        mask_token="<mask>",
    )
    wrapped.chat_template = (
        "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}"
        "[INST] {{ m['content'] }} [/INST]{% else %}{% generation %}{{ m['content'] }}"
        "{{ eos_token }}{% endgeneration %}{% endif %}{% endfor %}"
    )
    wrapped.save_pretrained(str(tmp_path / "tok"))
    chat = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "world"}]
    (tmp_path / "chats.jsonl").write_text(json.dumps({"messages": chat}) + "\n")
    for supervision in ("assistant_only", "full"):
        config = write_config(
            tmp_path,
            source={"kind": "jsonl", "paths": ["chats.jsonl"]},
            records={"kind": "chat"},
            tokenizer={"kind": "huggingface", "path": "tok"},
            supervision=supervision,
            packing={"seq_len": 32, "block_size": 4, "prepend_bos": True},
            output={"path": "out", "overwrite": True},
        )
        result = prepare_config(config)
        ((tokens, mask),) = documents(result.path)
        bos = wrapped.bos_token_id
        assert tokens[0] == bos and tokens[1] != bos, supervision
        assert int((tokens == bos).sum()) == 1
        assert not mask[0]
        assert (
            tokens.tolist()[1:]
            == wrapped.apply_chat_template(chat, tokenize=True, return_dict=True)["input_ids"][1:]
        )
        verify(result.path)


# --- a misnamed column of a Hugging Face dataset --------------------------------------------


@pytest.mark.parametrize("streaming", [False, True])
def test_a_dataset_with_one_of_two_fields_lists_all_its_columns(tmp_path, streaming):
    """As for Parquet: prompt_field is a column, completion_field is not. Only the columns
    found were kept, so the error said 'keys: question' and hid the column meant."""
    import datasets

    from turbo_dllm.errors import DllmError

    rows = [{"question": "q", "answer": "a", "id": 1}]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "qa"))
    config = write_config(
        tmp_path,
        source={"kind": "huggingface", "path": "qa", "streaming": streaming},
        records={
            "kind": "prompt_completion",
            "prompt_field": "question",
            "completion_field": "answr",
        },
    )
    with pytest.raises(DllmError) as caught:
        prepare_config(config)
    assert "missing field 'answr'" in str(caught.value)
    assert "keys: answer, id, question" in str(caught.value)


# --- a mask token that ordinary text encodes to ---------------------------------------------


def test_a_mask_token_that_text_encodes_to_is_named_as_the_fix(tmp_path, hf_tokenizer):
    """tokenizer.mask_token naming an ordinary token: every record that holds it stopped the
    job with 'fix that record', although the record was fine and the mask token was not."""
    from transformers import AutoTokenizer

    from turbo_dllm.errors import DllmError

    text = "The quick brown fox jumps over the lazy dog."
    ordinary = AutoTokenizer.from_pretrained(str(hf_tokenizer)).tokenize(text)[0]
    write_jsonl(tmp_path / "data.jsonl", [{"text": text}])
    config = write_config(
        tmp_path,
        tokenizer={"kind": "huggingface", "path": str(hf_tokenizer), "mask_token": ordinary},
    )
    with pytest.raises(DllmError) as caught:
        prepare_config(config)
    assert "is the mask token" in caught.value.message
    assert "fix that record" not in caught.value.hint
    assert "tokenizer.mask_token" in caught.value.hint
    assert "on_error: skip" in caught.value.hint


# --- token id files narrower than the tokenizer's ids ---------------------------------------


@pytest.fixture(scope="module")
def wide_tokenizer(tmp_path_factory):
    """A word-level tokenizer with 70,000 ordinary ids: more than uint16 holds."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(70_000)}
    vocab.update({"<eos>": 70_000, "<mask>": 70_001, "<unk>": 70_002})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<eos>", mask_token="<mask>", unk_token="<unk>"
    )
    folder = tmp_path_factory.mktemp("wide") / "tokenizer"
    wrapped.save_pretrained(str(folder))
    return folder


@pytest.mark.parametrize("name", ["ids.bin", "ids.npy"])
def test_a_uint16_id_file_for_a_wider_vocabulary_is_refused(tmp_path, wide_tokenizer, name):
    """nanoGPT-style `arr[i:j] = ids` into a uint16 memmap wraps id 65,541 around to 5: the
    file read as valid ids of other tokens, and prepare packed them without a word."""
    from turbo_dllm.errors import DllmError

    ids = np.array([1, 65_541, 69_999, 70_000], dtype=np.int64)
    wrapped = np.zeros(len(ids), np.uint16)
    wrapped[:] = ids  # what a uint16 memmap keeps of them: 1, 5, 4463, 4464
    if name.endswith(".npy"):
        np.save(tmp_path / name, wrapped)
    else:
        wrapped.tofile(tmp_path / name)
    source = {"kind": "token_ids", "paths": [name], "dtype": "uint16"}
    config = write_config(
        tmp_path,
        source=source,
        tokenizer={"kind": "huggingface", "path": str(wide_tokenizer)},
    )
    with pytest.raises(DllmError) as caught:
        prepare_config(config)
    assert "holds ids up to 65,535" in caught.value.message
    assert "69,999" in caught.value.message
    assert "uint32" in caught.value.hint
    assert not (tmp_path / "out").exists()

    # The same ids as uint32 are what the tokenizer made, and prepare reads them.
    np.save(tmp_path / "wide.npy", ids.astype(np.uint32))
    config = write_config(
        tmp_path,
        source={"kind": "token_ids", "paths": ["wide.npy"], "document_separator_id": 70_000},
        tokenizer={"kind": "huggingface", "path": str(wide_tokenizer)},
    )
    ((tokens, _),) = documents(prepare_config(config).path)
    assert tokens.tolist() == [1, 65_541, 69_999, 70_000]

    # The byte-level tokenizer encodes text to ids 0..255 (its specials come from packing):
    # uint8 holds every one.
    np.save(tmp_path / "bytes.npy", np.frombuffer(b"hi", np.uint8))
    config = write_config(
        tmp_path,
        source={"kind": "token_ids", "paths": ["bytes.npy"]},
        output={"path": "bytes", "overwrite": False},
    )
    ((tokens, _),) = documents(prepare_config(config).path)
    assert tokens.tolist() == [ord("h"), ord("i"), EOS]


# --- the summary and the help ---------------------------------------------------------------


def test_the_summary_says_how_many_tokens_truncation_cut(cli, tmp_path):
    """'1 truncated' alone did not say whether a token or most of a book was lost."""
    write_jsonl(tmp_path / "data.jsonl", [{"text": "x" * 100}, {"text": "short"}])
    config = write_config(
        tmp_path, packing={"seq_len": 32, "block_size": 8, "overflow": "truncate"}
    )
    result = cli("data", "prepare", "--config", config)
    assert result.code == 0, result.err
    assert "1 truncated (69 tokens cut)" in result.out  # 100 bytes + eos, 32 kept


@pytest.mark.parametrize("command", ["prepare", "validate", "inspect", "stats"])
def test_every_json_flag_says_what_it_does(cli, command):
    result = cli("data", command, "--help")
    assert result.code == 0
    line = next(line for line in result.out.splitlines() if line.strip().startswith("--json"))
    assert "JSON" in line.replace("--json", ""), line


def test_added_tokens_that_text_holds_count_as_text_ids(tmp_path):
    """An added token that is not special (`<think>`) is produced by text like any word: a
    tokenizer whose added tokens run past uint16 cannot have its ids written as uint16."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from turbo_dllm.errors import DllmError

    vocab = {f"w{i}": i for i in range(65_530)}
    vocab.update({"<eos>": 65_530, "<mask>": 65_531, "<unk>": 65_532})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<eos>", mask_token="<mask>", unk_token="<unk>"
    )
    wrapped.add_tokens([f"<think{i}>" for i in range(8)])  # 65,533 .. 65,540: text's own
    assert wrapped.convert_tokens_to_ids("<think7>") == 65_540
    wrapped.save_pretrained(str(tmp_path / "tok"))
    np.save(tmp_path / "ids.npy", np.array([1, 2, 65_535], np.uint16))
    config = write_config(
        tmp_path,
        source={"kind": "token_ids", "paths": ["ids.npy"]},
        tokenizer={"kind": "huggingface", "path": "tok"},
    )
    with pytest.raises(DllmError, match="encodes text to ids up to 65,540"):
        prepare_config(config)


def test_a_text_file_too_large_for_one_document_names_the_ways_out(tmp_path):
    """enwik8 or a concatenated corpus is one file: under unit: document it is one document,
    over the 32 MiB a record may have; 'fix that record' did not say what to do."""
    from turbo_dllm.errors import DllmError

    with open(tmp_path / "corpus.txt", "wb") as handle:  # sparse: 33 MiB, instantly
        handle.truncate(33 << 20)
    config = write_config(tmp_path, source={"kind": "text", "paths": ["corpus.txt"]})
    with pytest.raises(DllmError) as caught:
        prepare_config(config)
    assert "more than the 32 MiB" in caught.value.message
    assert "source.unit: line" in caught.value.hint
    assert "fix that record" not in caught.value.hint
