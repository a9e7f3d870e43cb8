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
import os
import shutil
from pathlib import Path
from typing import Any

from turbo_dllm.errors import DllmError
from turbo_dllm.fsutil import fsync_dir, make_temp_dir, write_atomic

__all__ = ["MIGRATION_VERSION", "migrate_mask_token"]

MIGRATION_VERSION = 1
# The files that hold a tokenizer's vocabulary (one of them is needed).
_VOCABULARY_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")


def migrate_mask_token(folder: str | Path, mask_token: str = "<|mask|>") -> dict[str, Any]:
    """Add `mask_token` to the tokenizer in `folder` and record it in its config.json.

    Returns the migration record. The tokenizer files and config.json in `folder` are replaced,
    all of them or none (an interrupted run leaves the folder as it was).
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
        raise DllmError(
            f"cannot load the tokenizer in {str(folder)!r}: {error}",
            hint="copy the model's tokenizer files (tokenizer.json, tokenizer_config.json) into "
            "the folder again from its Hugging Face repository",
        ) from None
    original = len(tokenizer)
    if mask_token in tokenizer.get_vocab():
        if tokenizer.mask_token == mask_token:
            # a folder whose tokenizer was migrated and whose config.json was not (a run cut
            # off by an older version, or killed outright): "an ordinary token" misled
            raise DllmError(
                f"the tokenizer in {str(folder)!r} already has {mask_token!r} as its mask token "
                f"(id {tokenizer.mask_token_id}), but config.json records no migration",
                hint="if an earlier `dllm model add-mask-token` was cut off, restore the "
                "model's original tokenizer files (a killed run left them in "
                ".dllm-mask-token-*/old/ in the folder) and run it again",
            )
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
    _write_all_or_nothing(folder, tokenizer, json.dumps(config, indent=2) + "\n")
    return record


def _write_all_or_nothing(folder: Path, tokenizer, config_text: str) -> None:
    """Put the new tokenizer files and config.json into `folder`, all of them or none.

    Written in place, the tokenizer went first and config.json after it: Ctrl-C or a full disk
    in between left a tokenizer holding the mask token and a config without the record, which a
    second run refused ("already has ... as an ordinary token"). Now the new files are written
    into a staging folder inside `folder`, then each replaces its original (moved aside into
    the staging folder) by a rename; on any failure the originals are moved back. A process
    killed outright (SIGKILL) leaves the originals in `.dllm-mask-token-*/old/`.
    """
    staging = make_temp_dir(folder, ".dllm-mask-token-")
    try:
        new, old = staging / "new", staging / "old"
        new.mkdir()
        old.mkdir()
        tokenizer.save_pretrained(str(new))
        write_atomic(new / "config.json", config_text)
        names = sorted(p.name for p in new.iterdir() if p.name != "config.json")
        names.append("config.json")  # last: the record says the migration is complete
        existed = {name: os.path.lexists(folder / name) for name in names}
        try:
            for name in names:
                if existed[name]:
                    os.replace(folder / name, old / name)
                os.replace(new / name, folder / name)
            fsync_dir(folder)
        except BaseException:
            for name in names:
                if os.path.lexists(old / name):
                    os.replace(old / name, folder / name)
                elif not existed[name]:
                    (folder / name).unlink(missing_ok=True)
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


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
