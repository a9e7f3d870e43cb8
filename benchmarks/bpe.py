"""A byte-level BPE tokenizer (GPT-2 / Qwen pre-tokenizer) trained with Hugging Face `tokenizers`
and saved as a transformers folder, for benchmarks that need real subword tokens from text every
machine has."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path


def train_byte_level_bpe(
    folder: Path,
    vocab_size: int,
    specials: list[str],
    *,
    files: list[Path] | None = None,
    texts: Iterable[str] | None = None,
) -> Path:
    """Train on `files` (read by `tokenizers` itself) or on `texts`; `specials` are end of text,
    pad and mask, in that order (ids 0-2). Returns `folder`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    eos, pad, mask = specials
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    if files is not None:
        tokenizer.train([str(f) for f in files], trainer)
    else:
        tokenizer.train_from_iterator(texts, trainer)
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token=eos, pad_token=pad, mask_token=mask
    ).save_pretrained(str(folder))
    return folder
