"""Does an artifact fit a RunSpec? Shared by `dllm data validate --config` and `dllm doctor`.

The checks: sequence length, block size (documents aligned to the artifact's block size are
aligned to any divisor of it), the model's vocabulary covers every id the artifact may hold, and
the mask token the objective will use is the artifact's and inside the model's vocabulary.
"""

from __future__ import annotations

from turbo_dllm.data.artifact import DataManifest
from turbo_dllm.errors import DllmError

__all__ = ["artifact_problems", "model_vocab_size"]


def model_vocab_size(model) -> tuple[int | None, str]:
    """(vocab size, where it came from) for a RunSpec `model` section; None when unknowable.

    Order: model.config_overrides.vocab_size; then the family's own config reader
    (`turbo_dllm.registry.resolve_model_config`: a local HF folder's config.json, a preset, or a
    config.json path).
    """
    override = model.config_overrides.get("vocab_size")
    if isinstance(override, int) and not isinstance(override, bool):
        return override, "model.config_overrides.vocab_size"
    where = f"model.path {model.path}" if model.path else f"model.from_config {model.from_config}"
    from turbo_dllm.registry import resolve_model_config

    return int(resolve_model_config(model).vocab_size), where


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
