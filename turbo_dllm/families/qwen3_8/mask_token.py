"""The mask-token migration: give a Qwen3.8 checkpoint folder the mask token diffusion needs.

Qwen3.5/3.8 tokenizers have no mask token, but the checkpoint's embedding has spare rows past
the tokenizer (vocab_size > len(tokenizer)). The migration adds the token (recipes use
`<|mask|>`) to the tokenizer as a special token, so its id is the old tokenizer length, checks
that id has an embedding row, and records it in config.json: `mask_token_id` (what this family's
config reader and `dllm data prepare` read) and the migration record `dllm_mask_token`,
`dllm_mask_token_id`, `dllm_mask_token_original_vocab_size` (the tokenizer length before),
`dllm_mask_token_migration_version` = 1. The record travels in every checkpoint's model config
and in exported folders. Migrating twice is a no-op; a folder migrated with another token is
refused.

Torch-free (transformers' tokenizer only).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from turbo_dllm.errors import DllmError
from turbo_dllm.fsutil import write_atomic

__all__ = ["MIGRATION_VERSION", "migrate_mask_token"]

MIGRATION_VERSION = 1
# The files that hold a tokenizer's vocabulary (one of them is needed).
_VOCABULARY_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")


def migrate_mask_token(folder: str | Path, mask_token: str = "<|mask|>") -> dict[str, Any]:
    """Add `mask_token` to the tokenizer in `folder` and record it in its config.json.

    Returns the migration record. The tokenizer files and config.json are rewritten in place.
    """
    from transformers import AutoTokenizer

    if not mask_token.strip():  # the tokenizer adds nothing, and the id read "None"
        raise DllmError("the mask token is empty", hint="pass --mask-token a token, e.g. <|mask|>")
    folder = Path(folder)
    config = _read_config(folder)
    done = config.get("dllm_mask_token")
    if done is not None:
        if done != mask_token:
            raise DllmError(
                f"{str(folder)!r} was migrated with the mask token {done!r}, not {mask_token!r}",
                hint=f"use {done!r}",
            )
        return _record(config)
    text = config.get("text_config") if config.get("model_type") == "qwen3_5" else None
    text = text if isinstance(text, dict) else None
    vocab = _vocab_size(text or config, folder)
    if not any((folder / name).is_file() for name in _VOCABULARY_FILES):
        # transformers would build an empty tokenizer of the config's model_type instead, and
        # the token would get id 1 in a tokenizer written over the folder's missing one
        raise DllmError(
            f"{str(folder)!r} has no tokenizer (none of {', '.join(_VOCABULARY_FILES)})",
            hint="copy the tokenizer files of the model into the folder first",
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as error:  # transformers raises many types for a bad folder
        raise DllmError(f"cannot load the tokenizer in {str(folder)!r}: {error}") from None
    original = len(tokenizer)
    if mask_token in tokenizer.get_vocab():
        raise DllmError(
            f"the tokenizer in {str(folder)!r} already has {mask_token!r} as an ordinary token",
            hint="choose a mask token the tokenizer does not have",
        )
    tokenizer.add_special_tokens({"mask_token": mask_token})
    mask_id = tokenizer.convert_tokens_to_ids(mask_token)
    if mask_id != original or mask_id >= vocab:
        raise DllmError(
            f"the mask token would get id {mask_id}, which the checkpoint's embedding "
            f"({vocab} rows) does not cover",
            hint="the tokenizer must be shorter than the model's vocab_size",
        )
    if mask_id == (text or config).get("pad_token_id"):
        # transformers' embedding takes pad_token_id as padding_idx (so does ours): that row
        # gets no gradient through the lookup, and a random init leaves it zero
        raise DllmError(
            f"the mask token would get id {mask_id}, the config's pad_token_id: that embedding "
            "row never learns (padding_idx), so every masked position would read a frozen vector",
            hint="set pad_token_id in config.json to the tokenizer's own pad token (or remove it), "
            "then add the mask token",
        )
    tokenizer.save_pretrained(str(folder))
    record = {
        "mask_token_id": mask_id,
        "dllm_mask_token": mask_token,
        "dllm_mask_token_id": mask_id,
        "dllm_mask_token_original_vocab_size": original,
        "dllm_mask_token_migration_version": MIGRATION_VERSION,
    }
    config.update(record)
    if text is not None:
        text["mask_token_id"] = mask_id
    write_atomic(folder / "config.json", json.dumps(config, indent=2) + "\n")
    return record


def _read_config(folder: Path) -> dict[str, Any]:
    hint = "pass a local Hugging Face model folder (config.json + tokenizer files)"
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise DllmError(f"{str(folder)!r} {what}", hint=hint)
    path = folder / "config.json"
    if not path.is_file():
        raise DllmError(f"{str(folder)!r} has no config.json", hint=hint)
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise DllmError(f"cannot read {str(path)!r}: {error}", hint=hint) from None
    if not isinstance(config, dict):  # a list or a string: .get() raised AttributeError
        raise DllmError(f"{str(path)!r} is not a JSON object", hint=hint)
    return config


def _vocab_size(config: dict[str, Any], folder: Path) -> int:
    """config.json's vocab_size (the embedding's rows): a missing one read as 0 rows ("does not
    cover"), a string or null raised a traceback."""
    vocab = config.get("vocab_size")
    if not isinstance(vocab, int) or isinstance(vocab, bool) or vocab < 1:
        raise DllmError(
            f"{str(folder / 'config.json')!r} has no valid vocab_size (found {vocab!r})",
            hint="the embedding's row count must be there: pass the model's own config.json",
        )
    return vocab


def _record(config: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "mask_token_id",
        "dllm_mask_token",
        "dllm_mask_token_id",
        "dllm_mask_token_original_vocab_size",
        "dllm_mask_token_migration_version",
    )
    return {key: config.get(key) for key in keys}
