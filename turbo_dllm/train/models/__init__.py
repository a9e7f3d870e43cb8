"""Decoder models (Llama / Qwen2 / Qwen3) in the Hugging Face layout.

`build_model` makes the module on the meta device (no memory); `materialize` allocates it on a
device and fills it (random init or HF safetensors) after any parallel wrapping was applied.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from turbo_dllm.train.models.config import PRESETS, DecoderConfig, resolve_model_config

if TYPE_CHECKING:
    import torch

    from turbo_dllm.train.models.decoder import AttentionBackend, DecoderLM

__all__ = [
    "PRESETS",
    "DecoderConfig",
    "allocate",
    "build_model",
    "materialize",
    "resolve_model_config",
]


def build_model(
    config: DecoderConfig, backend: AttentionBackend, dtype: torch.dtype | None = None
) -> DecoderLM:
    """The decoder on the meta device (parameters have shapes, no storage)."""
    import torch

    from turbo_dllm.train.models.decoder import DecoderLM

    with torch.device("meta"):
        model = DecoderLM(config, backend)
    if dtype is not None:
        model.to(dtype)
    return model


def allocate(model: DecoderLM, device: torch.device) -> DecoderLM:
    """Give a meta model uninitialised storage on `device` (keeping tied weights tied)."""
    model.to_empty(device=device)
    if (
        model.config.tie_word_embeddings
        and model.lm_head.weight is not model.model.embed_tokens.weight
    ):
        model.lm_head.weight = model.model.embed_tokens.weight  # to_empty() unties plain modules
    return model


def materialize(
    model: DecoderLM,
    device: torch.device,
    *,
    seed: int,
    weights_from: str | None = None,
) -> DecoderLM:
    """Allocate storage on `device` and fill it: HF weights from a folder, else random init."""
    from turbo_dllm.train.models.weights import init_weights, load_hf_weights

    model.to_empty(device=device)
    if (
        model.config.tie_word_embeddings
        and model.lm_head.weight is not model.model.embed_tokens.weight
    ):
        model.lm_head.weight = model.model.embed_tokens.weight  # to_empty() unties plain modules
    if weights_from is not None:
        load_hf_weights(model, model.config, weights_from)
    else:
        init_weights(model, model.config, seed)
    return model
