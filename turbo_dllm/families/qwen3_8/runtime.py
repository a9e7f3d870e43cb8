"""The Qwen3.8 family's torch half (`FamilyRuntime`): build, layers, tensor-parallel plan, mask.

`model_mask` is the optional runtime function the trainer calls on each micro-batch's inputs:
the hybrid's linear layers need the stream layout (noisy/clean halves, blocks) beside the
attention mask, so it hands the model a `HybridMask`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from turbo_dllm.errors import DllmError
from turbo_dllm.families.base import on_meta_device
from turbo_dllm.families.qwen3_8.parallelize import apply_tensor_parallel, check_tensor_parallel

if TYPE_CHECKING:
    import torch
    from torch import nn

    from turbo_dllm.families.qwen3_8.config import Qwen38Config
    from turbo_dllm.families.qwen3_8.model import HybridLM, HybridMask

__all__ = [
    "apply_tensor_parallel",
    "build_model",
    "check_tensor_parallel",
    "layers",
    "model_mask",
]


def build_model(
    config: Qwen38Config,
    backend: Any,
    dtype: torch.dtype | None = None,
    *,
    linear_attention: str = "torch",
) -> HybridLM:
    """The hybrid on the meta device; `linear_attention` picks the gated-delta kernel."""
    from turbo_dllm.families.qwen3_8.model import HybridLM

    if linear_attention == "fla":
        from turbo_dllm.families.qwen3_8.gated_delta import check_fla_usable

        check_fla_usable()  # before any step: fla refuses some Triton versions at the backward
    return on_meta_device(lambda: HybridLM(config, backend, kernel=linear_attention), dtype)


def layers(model: nn.Module) -> nn.ModuleList:
    return model.model.layers


def model_mask(inputs: Any) -> HybridMask:
    """The trainer's `ModelInputs` -> what the hybrid's layers read (attention mask + layout)."""
    from turbo_dllm.families.qwen3_8.model import HybridMask
    from turbo_dllm.train.attention.layout import one_document_per_row

    docs = inputs.batch.doc_ids
    if not one_document_per_row(docs):
        raise DllmError(
            "qwen3_8 cannot train on packed documents yet: the linear layers' recurrent state "
            "would run from one document into the next",
            hint="prepare the data without packing (one document per sequence)",
        )
    import torch

    from turbo_dllm.families.qwen3_8.context import StateHandOff
    from turbo_dllm.train.objectives.base import to_device
    from turbo_dllm.train.parallel.cp import CpAttention
    from turbo_dllm.train.parallel.csbp import CsbpAttention

    mask = inputs.mask
    if isinstance(mask, CpAttention):  # context parallelism: the clean state handed rank to rank
        layout = mask.layout
        hand_off = StateHandOff(mask.group, layout.cp, layout.rank)
        return HybridMask(mask, inputs.batch.layout, hand_off=hand_off)
    if isinstance(mask, CsbpAttention):  # block parallelism: this rank's blocks
        layout = mask.layout
        if layout.cp != 1:
            raise DllmError(
                "qwen3_8 runs block parallelism with the clean stream whole on each rank only",
                hint="set topology.cp: 1 with bp, or bp: 1 with cp",
            )
        blocks = to_device(torch.tensor(layout.noisy_blocks), inputs.input_ids.device)
        return HybridMask(mask, inputs.batch.layout, blocks)
    return HybridMask(mask, inputs.batch.layout)
