"""Tensor parallelism for the Qwen3.8 hybrid, applied from outside the model.

* full-attention layers and every MLP: Megatron style, as the decoder (families/decoder/
  parallelize.py): q_proj (query + gate per head, so heads stay whole), k_proj, v_proj, gate_proj
  and up_proj column-wise, o_proj and down_proj row-wise; q/k norms sharded on the head dim.
* Gated DeltaNet layers: their input projections are split column-wise over the tp ranks and
  gathered (`in_proj_qkv` packs q | k | v along its rows, a layout a contiguous split would cut
  across), so each rank holds 1/tp of their weights and computes 1/tp of their matmuls; the
  convolution, the gated delta rule and the gated norm then run on all heads on every rank (a
  small part of a layer's FLOPs next to its projections and MLP), and out_proj is row-wise over
  its input features, so its partial sums are all-reduced like o_proj's.

Sequence parallelism is refused for this family (Family.axis_reasons): the linear layers'
state capture needs the whole clean stream in one place.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from turbo_dllm.errors import DllmError
from turbo_dllm.families.qwen3_8.config import Qwen38Config, tensor_parallel_problems

if TYPE_CHECKING:
    from torch import nn
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["apply_tensor_parallel", "check_tensor_parallel"]


def check_tensor_parallel(config: Qwen38Config, tp: int) -> None:
    found = tensor_parallel_problems(config, tp)
    if found:
        raise DllmError(
            "tensor parallelism cannot split this model: " + "; ".join(found),
            hint="choose a topology.tp that divides the attention heads, the key/value heads, "
            "the linear-attention key and value heads and intermediate_size",
        )


def apply_tensor_parallel(
    model: nn.Module, tp_mesh: DeviceMesh, *, sequence_parallel: bool = False
) -> None:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    if sequence_parallel:
        raise DllmError(
            "sequence parallelism is not supported for qwen3_8",
            hint="set topology.sp: false (the linear layers need the whole clean stream)",
        )
    check_tensor_parallel(model.config, tp_mesh.size())
    mlp = {
        "mlp.gate_proj": ColwiseParallel(),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(),
    }
    attention = {
        **mlp,
        "self_attn.q_proj": ColwiseParallel(),
        "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(),
        "self_attn.o_proj": RowwiseParallel(),
        "self_attn.q_norm": SequenceParallel(sequence_dim=2, use_local_output=True),
        "self_attn.k_norm": SequenceParallel(sequence_dim=2, use_local_output=True),
    }
    gathered = ColwiseParallel(output_layouts=Replicate())
    linear = {
        **mlp,
        "linear_attn.in_proj_qkv": gathered,
        "linear_attn.in_proj_z": gathered,
        "linear_attn.in_proj_b": gathered,
        "linear_attn.in_proj_a": gathered,
        # Its input is whole on every rank: each cuts its features locally (no communication),
        # the partial sums are all-reduced.
        "linear_attn.out_proj": RowwiseParallel(input_layouts=Replicate()),
    }
    for layer in model.model.layers:
        parallelize_module(
            layer, tp_mesh, linear if layer.kind == "linear_attention" else attention
        )
