"""What a user preparing real data ran into: each test failed before its fix."""

from __future__ import annotations

import json

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
