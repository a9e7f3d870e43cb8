"""Fixtures for the data tests: a real Hugging Face tokenizer trained here, and small corpora."""

from __future__ import annotations

import pytest

# A Qwen-style chat template whose assistant turns sit in {% generation %} blocks, so
# transformers can return the exact assistant mask.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}<|im_end|>"
    "{% endgeneration %}{% else %}{{ m['content'] }}<|im_end|>{% endif %}\n{% endfor %}"
)
PLAIN_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Block diffusion models denoise whole blocks of tokens at once.",
    "Hello world! This is a small corpus for a small tokenizer.",
    "def add(a, b):\n    return a + b\n",
    "Rain falls, rivers flow, and the sea keeps every drop.",
] * 40


def _train_tokenizer(folder, template: str | None, mask: bool = True):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
    if mask:
        specials.append("<|mask|>")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|pad|>",
        mask_token="<|mask|>" if mask else None,
    )
    if template is not None:
        wrapped.chat_template = template
    wrapped.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="session")
def hf_tokenizer(tmp_path_factory):
    """A BPE tokenizer folder (save_pretrained) with a generation-marked chat template."""
    return _train_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer", CHAT_TEMPLATE)


@pytest.fixture(scope="session")
def hf_tokenizer_plain_template(tmp_path_factory):
    """Same, but its chat template has no {% generation %} markers."""
    return _train_tokenizer(tmp_path_factory.mktemp("tok") / "plain", PLAIN_CHAT_TEMPLATE)


@pytest.fixture(scope="session")
def hf_tokenizer_no_mask(tmp_path_factory):
    return _train_tokenizer(tmp_path_factory.mktemp("tok") / "nomask", None, mask=False)
