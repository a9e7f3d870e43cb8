"""The decoder families' input rule (`Family.input_rules`), and the tokenizer rule every family
that trains a model folder shares: what `dllm train`, `dllm launch`, `dllm data validate
--config` and `dllm doctor` check in the data artifact beyond the torch-free rules.

- The tokenizer (`model_tokenizer_problems`): data prepared with another tokenizer than the one
  saved in the model folder (`model.path`) would be other text to the model. nemotron_diffusion,
  qwen3_8 and diffusion_gemma run it in their input rules too. (It reads the data artifact's
  manifest, so it lives here, not in `families.base`, which `data` sits above.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from turbo_dllm.errors import DllmError

__all__ = ["input_problems", "model_tokenizer_problems"]


def input_problems(spec: Any) -> list[tuple[str, str]]:
    return model_tokenizer_problems(spec)


def model_tokenizer_problems(spec: Any) -> list[tuple[str, str]]:
    """The input rule of every family that trains a model folder (`model.path`): a data artifact
    must be tokenized with the tokenizer saved in that folder. Another tokenizer's ids, where
    they fit the model's vocabulary, are other text to the model, and it would train on them
    silently. Compared by the vocabulary sha256 the artifact records (`tokenizer.vocab_sha256`)
    against the folder's, where the folder holds a tokenizer (`data.tokenizers.vocabulary_fits`:
    a folder's tokenizer that extends the data's matches too). Synthetic data and a preset
    (`model.from_config`) are not compared. A folder given a mask token by `dllm model
    add-mask-token` (its config.json's `dllm_mask_token`, `dllm_mask_token_id`) also matches
    data prepared with the tokenizer before that migration (the same ids, the mask token given
    as `tokenizer.mask_token_id`)."""
    artifact, folder = spec.data.artifact, spec.model.path
    if artifact is None or folder is None:
        return []
    from turbo_dllm.data.artifact import read_manifest
    from turbo_dllm.data.tokenizers import _vocab_sha256, folder_vocabulary, vocabulary_fits

    try:
        recorded = read_manifest(artifact).tokenizer
    except DllmError:
        return []  # the data checks say what is wrong with the artifact
    pairs = folder_vocabulary(folder)
    if pairs is None:
        return []
    theirs = _vocab_sha256(pairs)
    before_migration = set()
    try:
        config = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        config = None
    if isinstance(config, dict) and config.get("dllm_mask_token") is not None:
        added = (config.get("dllm_mask_token"), config.get("dllm_mask_token_id"))
        if added in pairs:
            before_migration.add(_vocab_sha256([pair for pair in pairs if pair != added]))
    if vocabulary_fits(artifact, recorded.vocab_sha256, pairs, also=before_migration):
        return []
    return [
        (
            "data.artifact",
            f"{artifact!r} was prepared with another tokenizer than the one in the model folder "
            f"{folder!r} (the artifact's: {recorded.kind}, vocabulary sha256 "
            f"{recorded.vocab_sha256[:16]}; the folder's: {len(pairs):,} tokens, vocabulary "
            f"sha256 {theirs[:16]}): the model would read the data's token ids as other text. "
            f"Prepare the data with tokenizer {{kind: huggingface, path: {folder}}}, or point "
            "model.path at a model whose folder holds the tokenizer the data was prepared with",
        )
    ]
