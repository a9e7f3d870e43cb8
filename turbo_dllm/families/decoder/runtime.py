"""The decoder families' torch half (`FamilyRuntime`): build, layers, tensor-parallel plan."""

from __future__ import annotations

from typing import TYPE_CHECKING

from turbo_dllm.families.base import on_meta_device
from turbo_dllm.families.decoder.parallelize import apply_tensor_parallel, check_tensor_parallel
from turbo_dllm.train.attention.trim import CLEAN_HALF, LAST_LAYER_QUERIES

if TYPE_CHECKING:
    import torch
    from torch import nn

    from turbo_dllm.families.decoder.config import DecoderConfig
    from turbo_dllm.families.decoder.model import AttentionBackend, DecoderLM

__all__ = [
    "STREAM_TRIMS",
    "apply_tensor_parallel",
    "build_model",
    "check_tensor_parallel",
    "layers",
]

# The work the model skips where nothing reads it (`train.attention.trim`): it attends through
# an opaque mask at explicit positions, and its body runs a `LastLayerQueries` mask.
STREAM_TRIMS = frozenset({CLEAN_HALF, LAST_LAYER_QUERIES})


def build_model(
    config: DecoderConfig, backend: AttentionBackend, dtype: torch.dtype | None = None
) -> DecoderLM:
    """The decoder on the meta device (parameters have shapes, no storage)."""
    from turbo_dllm.families.decoder.model import DecoderLM

    return on_meta_device(lambda: DecoderLM(config, backend), dtype)


def layers(model: nn.Module) -> nn.ModuleList:
    """The repeated blocks that checkpointing, compile, MLP chunks and FSDP2 wrap one by one."""
    return model.model.layers
