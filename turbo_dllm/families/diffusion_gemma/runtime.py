"""DiffusionGemma's torch half (`FamilyRuntime`): build, layers, attention, tensor parallelism."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from turbo_dllm.errors import DllmError
from turbo_dllm.families.base import on_meta_device

if TYPE_CHECKING:
    import torch
    from torch import nn

    from turbo_dllm.families.diffusion_gemma.config import DiffusionGemmaConfig
    from turbo_dllm.families.diffusion_gemma.model import DiffusionGemmaLM

__all__ = [
    "apply_expert_parallel",
    "apply_tensor_parallel",
    "build_model",
    "build_sequence_plan",
    "check_tensor_parallel",
    "layers",
    "wrap_attention",
]


def build_model(
    config: DiffusionGemmaConfig, backend: Any, dtype: torch.dtype | None = None
) -> DiffusionGemmaLM:
    """The model on the meta device (parameters have shapes, no storage)."""
    from turbo_dllm.families.diffusion_gemma.model import DiffusionGemmaLM

    return on_meta_device(lambda: DiffusionGemmaLM(config, backend), dtype)


def build_sequence_plan(dims: Any, attention: Any, *, spec: Any, config, device, **_: Any):
    """The whole stream per rank; (cp > 1) this rank's zigzag share of it; (bp > 1) its canvas
    blocks and the clean stream (context.py)."""
    from turbo_dllm.families.diffusion_gemma.context import (
        GemmaBlockParallel,
        GemmaContextParallel,
    )
    from turbo_dllm.train.parallel.plan import WholeSequence

    if dims is None or dims.mode == "none":
        return WholeSequence(attention)
    if dims.bp > 1 and dims.cp > 1:  # validation refuses it first (the family's rules)
        raise DllmError(
            "diffusion_gemma does not combine cp and bp; use one of them",
            hint="set topology.bp: 1 (or topology.cp: 1)",
        )
    if dims.bp > 1:
        return GemmaBlockParallel(dims, attention.name, config)
    return GemmaContextParallel(dims, attention.name, config)


def layers(model: nn.Module) -> nn.ModuleList:
    return model.model.decoder.layers


def wrap_attention(attention: Any, config: DiffusionGemmaConfig) -> Any:
    """The trainer's backend with this family's masks (one per layer type, see attention.py)."""
    from turbo_dllm.families.diffusion_gemma.attention import StreamAttention

    return StreamAttention(attention, config)


def apply_expert_parallel(model: nn.Module, ep_mesh: Any, replica_group: Any, divisor: int):
    """Shard every layer's experts over the ep ranks (train/parallel/ep.py)."""
    from turbo_dllm.train.parallel.ep import shard_experts

    for layer in layers(model):
        shard_experts(layer.experts, ep_mesh, replica_group, divisor)


def check_tensor_parallel(config: DiffusionGemmaConfig, tp: int) -> None:
    if tp > 1:
        raise DllmError(
            "diffusion_gemma does not support tensor parallelism in this version",
            hint="set topology.tp: 1; topology.ep splits its experts, topology.cp long sequences",
        )


def apply_tensor_parallel(model: nn.Module, tp_mesh: Any, *, sequence_parallel: bool = False):
    check_tensor_parallel(model.config, 2)
