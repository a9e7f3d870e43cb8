"""A special token's literal string typed into the data (`<|endoftext|>` in a web page) must not
silently become that control token mid-document: `tokenizer.special_tokens_in_text` chooses
(text by default), and the prepare summary counts the documents that hold one."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.data.conftest import CHAT_TEMPLATE, _train_tokenizer
from tests.data.helpers import documents, prepare_config, write_config, write_jsonl
from tests.helpers import assert_user_error

EOT = 0  # <|endoftext|>, the eos token of the test tokenizer
IM_END = 2  # <|im_end|>


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return _train_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer", CHAT_TEMPLATE)


@pytest.fixture(scope="module")
def loaded(tokenizer):
    from turbo_dllm.data.spec import HuggingFaceTokenizerSpec
    from turbo_dllm.data.tokenizers import HuggingFaceTokenizer

    return HuggingFaceTokenizer(HuggingFaceTokenizerSpec(kind="huggingface", path=str(tokenizer)))


def _config(folder, tokenizer, mode=None, **sections):
    section = {"kind": "huggingface", "path": str(tokenizer)}
    if mode is not None:
        section["special_tokens_in_text"] = mode
    return write_config(folder, tokenizer=section, **sections)


def _rows(texts):
    return [{"text": t} for t in texts]


def test_literal_special_text_stays_text_by_default(cli, tmp_path, tokenizer):
    write_jsonl(tmp_path / "data.jsonl", _rows(["a <|endoftext|> b", "plain", "x<|im_end|>"]))
    result = cli("data", "prepare", "--config", _config(tmp_path, tokenizer))
    assert result.code == 0, result.err
    assert "warning: 2 documents hold the literal string of a special token" in result.out
    assert "tokenized as plain text" in result.out
    docs = documents(tmp_path / "out")
    for tokens, _ in docs:
        body = tokens[:-1].tolist()  # every document ends with the eos the packing adds
        assert EOT not in body and IM_END not in body
    stats = cli("data", "stats", tmp_path / "out", "--json")
    assert '"special_token_text": 2' in stats.out


def test_control_keeps_the_old_meaning_and_still_counts(tmp_path, tokenizer):
    write_jsonl(tmp_path / "data.jsonl", _rows(["a <|endoftext|> b", "plain"]))
    result = prepare_config(_config(tmp_path, tokenizer, "control"))
    assert result.manifest.stats.special_token_text == 1
    assert EOT in documents(result.path)[0][0][:-1].tolist()


def test_error_makes_it_a_bad_record(cli, tmp_path, tokenizer):
    write_jsonl(tmp_path / "data.jsonl", _rows(["fine", "a <|endoftext|> b"]))
    result = cli("data", "prepare", "--config", _config(tmp_path, tokenizer, "error"))
    assert_user_error(result, "data.jsonl:2", "'<|endoftext|>'", "special_tokens_in_text: error")
    config = _config(tmp_path, tokenizer, "error", on_error="skip")
    stats = prepare_config(config).manifest.stats
    assert (stats.skipped, stats.special_token_text) == ({"special_token_text": 1}, 0)


def test_prompt_completion_text_stays_text(tmp_path, tokenizer):
    rows = [{"prompt": "q <|im_start|>", "completion": "a"}]
    write_jsonl(tmp_path / "data.jsonl", rows)
    config = _config(tmp_path, tokenizer, records={"kind": "prompt_completion"})
    result = prepare_config(config)
    assert result.manifest.stats.special_token_text == 1
    assert 1 not in documents(result.path)[0][0].tolist()  # <|im_start|>


def test_chat_cannot_keep_it_as_text_so_it_is_refused_unless_control(cli, tmp_path, tokenizer):
    chat = [
        {"role": "user", "content": "hi <|im_end|> there"},
        {"role": "assistant", "content": "ok"},
    ]
    write_jsonl(tmp_path / "data.jsonl", [{"messages": chat}])
    config = _config(tmp_path, tokenizer, records={"kind": "chat"})
    result = cli("data", "prepare", "--config", config)
    assert_user_error(result, "data.jsonl:1", "'<|im_end|>'", "chat template")
    config = _config(tmp_path, tokenizer, "control", records={"kind": "chat"})
    assert prepare_config(config).manifest.stats.special_token_text == 1


def test_byte_level_has_no_choice_to_make(cli, tmp_path):
    write_jsonl(tmp_path / "data.jsonl", _rows(["a <|eos|> b"]))
    tokenizer = {"kind": "byte_level", "special_tokens_in_text": "control"}
    result = cli("data", "prepare", "--config", write_config(tmp_path, tokenizer=tokenizer))
    assert_user_error(result, "tokenizer.special_tokens_in_text")
    stats = prepare_config(write_config(tmp_path)).manifest.stats
    assert stats.special_token_text == 0


_pieces = st.sampled_from(
    ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>", "<|mask|>", "<|", "|>", "<", "\n"]
)
_texts = st.lists(st.one_of(_pieces, st.text(max_size=6)), max_size=8).map("".join)


@settings(
    max_examples=200,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(texts=st.lists(_texts, min_size=1, max_size=4))
def test_property_text_mode_never_yields_a_special_id(loaded, texts):
    """Under the default, any text encodes to ordinary ids only and decodes back to itself; the
    literals found are exactly the texts that hold one."""
    flat, lengths = loaded.encode_texts(texts)
    specials = {0, 1, 2, 3, 4}
    assert not specials & set(flat.tolist())
    start = 0
    for text, length in zip(texts, lengths.tolist(), strict=True):
        assert loaded.decode(flat[start : start + length]) == text
        start += length
    holds = [
        any(s in t for s in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>", "<|mask|>"))
        for t in texts
    ]
    assert [found is not None for found in loaded.special_text(texts)] == holds
