"""Tensor (and sequence) parallelism for Nemotron: the decoder's plan, plus its variants.

The decoder's Megatron plan (families/decoder/parallelize.py) covers q/k/v/o, the q/k norms, the
MLP and sequence parallelism. Nemotron adds: the v norm, sharded on the head dim like the q/k
norms, and the output gate's g_proj, column-wise (each rank gates its own heads).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from turbo_dllm.families.decoder import parallelize as decoder

if TYPE_CHECKING:
    from torch import nn
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["apply_tensor_parallel", "check_tensor_parallel"]

check_tensor_parallel = decoder.check_tensor_parallel


def apply_tensor_parallel(
    model: nn.Module, tp_mesh: DeviceMesh, *, sequence_parallel: bool = False
) -> None:
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    config = model.config
    extra = {}
    if config.v_norm:
        extra["self_attn.v_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
    if config.attn_output_gate:
        extra["self_attn.g_proj"] = ColwiseParallel()
    if extra:  # before the decoder's plan: its SP input hooks then wrap the whole attention
        for layer in model.model.layers:
            parallelize_module(layer, tp_mesh, extra)
    decoder.apply_tensor_parallel(model, tp_mesh, sequence_parallel=sequence_parallel)
