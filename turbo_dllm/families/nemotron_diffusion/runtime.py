"""Nemotron's torch half (`FamilyRuntime`): build, layers, tensor-parallel plan."""

from __future__ import annotations

from typing import TYPE_CHECKING

from turbo_dllm.families.base import on_meta_device
from turbo_dllm.families.decoder.runtime import STREAM_TRIMS  # the decoder body's trims
from turbo_dllm.families.nemotron_diffusion.parallelize import (
    apply_tensor_parallel,
    check_tensor_parallel,
)

if TYPE_CHECKING:
    import torch
    from torch import nn

    from turbo_dllm.families.decoder.model import AttentionBackend
    from turbo_dllm.families.nemotron_diffusion.config import NemotronConfig
    from turbo_dllm.families.nemotron_diffusion.model import NemotronLM

__all__ = [
    "STREAM_TRIMS",
    "apply_tensor_parallel",
    "build_model",
    "check_tensor_parallel",
    "layers",
]


def build_model(
    config: NemotronConfig, backend: AttentionBackend, dtype: torch.dtype | None = None
) -> NemotronLM:
    from turbo_dllm.families.nemotron_diffusion.model import NemotronLM

    return on_meta_device(lambda: NemotronLM(config, backend), dtype)


def layers(model: nn.Module) -> nn.ModuleList:
    return model.model.layers
