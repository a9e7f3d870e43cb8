"""Does an artifact fit a RunSpec? Shared by `dllm data validate --config` and `dllm doctor`.

The checks: sequence length, block size (documents aligned to the artifact's block size are
aligned to any divisor of it), the model's vocabulary covers every id the artifact may hold, and
the mask token the objective will use is the artifact's and inside the model's vocabulary.
"""

from __future__ import annotations

import json
from pathlib import Path

from turbo_dllm.data.artifact import DataManifest
from turbo_dllm.errors import DllmError

__all__ = ["FALLBACK_PRESET_VOCAB", "artifact_problems", "model_vocab_size"]

# Used only when the trainer's model package cannot be imported (a data-only install without
# torch): the vocabulary sizes of the model presets in turbo_dllm.train.models.config.PRESETS.
FALLBACK_PRESET_VOCAB = {"tiny": 512, "qwen3-0.6b": 151936, "qwen3-1.7b": 151936}


def model_vocab_size(model) -> tuple[int | None, str]:
    """(vocab size, where it came from) for a RunSpec `model` section; None when unknowable.

    Order: model.config_overrides.vocab_size; then the trainer's own resolution
    (`turbo_dllm.train.models.config.resolve_model_config`: a local HF folder's config.json, a
    preset, or a config.json path); without the trainer installed, config.json files are read
    directly and presets come from FALLBACK_PRESET_VOCAB.
    """
    override = model.config_overrides.get("vocab_size")
    if isinstance(override, int) and not isinstance(override, bool):
        return override, "model.config_overrides.vocab_size"
    where = f"model.path {model.path}" if model.path else f"model.from_config {model.from_config}"
    try:
        from turbo_dllm.train.models.config import resolve_model_config
    except ImportError:
        resolve_model_config = None
    if resolve_model_config is not None:
        config = resolve_model_config(
            path=model.path, from_config=model.from_config, overrides=model.config_overrides
        )
        return int(config.vocab_size), where
    if model.path is not None:
        return _json_vocab(Path(model.path) / "config.json"), where
    if model.from_config in FALLBACK_PRESET_VOCAB:
        return FALLBACK_PRESET_VOCAB[model.from_config], where
    if model.from_config is not None and model.from_config.endswith(".json"):
        return _json_vocab(Path(model.from_config)), where
    return None, where


def _json_vocab(path: Path) -> int | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("vocab_size")
    except (OSError, ValueError):
        raise DllmError(f"cannot read the model config {str(path)!r}") from None
    return value if isinstance(value, int) else None


def artifact_problems(manifest: DataManifest, spec) -> list[str]:
    """Every way the artifact does not fit the RunSpec, as `field: message` lines."""
    found: list[str] = []
    if spec.data.seq_len != manifest.seq_len:
        found.append(
            f"data.seq_len: {spec.data.seq_len}, but the artifact holds sequences of "
            f"{manifest.seq_len} tokens"
        )
    block = spec.objective.block_size
    if manifest.packing.align == "block" and manifest.block_size % block:
        found.append(
            f"objective.block_size: {block}, but the artifact aligned documents to blocks of "
            f"{manifest.block_size} (prepare again with packing.block_size: {block})"
        )
    if manifest.seq_len % block:
        found.append(
            f"objective.block_size: {block} does not divide the artifact's seq_len "
            f"{manifest.seq_len}"
        )
    try:
        vocab, where = model_vocab_size(spec.model)
    except DllmError as error:
        found.append(f"model: {error.message}")
        vocab, where = None, ""
    mask = manifest.special_tokens["mask"]
    if spec.objective.mask_token_id is not None and spec.objective.mask_token_id != mask:
        found.append(
            f"objective.mask_token_id: {spec.objective.mask_token_id}, but the artifact's mask "
            f"token is {mask} (leave mask_token_id unset to use it)"
        )
    if vocab is not None:
        if manifest.vocab_size > vocab:
            found.append(
                f"model: vocabulary of {vocab} ({where}) is smaller than the artifact's "
                f"{manifest.vocab_size} token ids"
            )
        elif mask >= vocab:
            found.append(f"model: the mask token {mask} is outside the vocabulary of {vocab}")
    return found
