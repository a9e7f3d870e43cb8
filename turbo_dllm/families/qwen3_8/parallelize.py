"""Tensor (and sequence) parallelism for the Qwen3.8 hybrid, applied from outside the model.

* full-attention layers and every MLP: Megatron style, as the decoder (families/decoder/
  parallelize.py): q_proj (query + gate per head, so heads stay whole), k_proj, v_proj, gate_proj
  and up_proj column-wise, o_proj and down_proj row-wise; q/k norms sharded on the head dim.
* Gated DeltaNet layers: sharded by head. Rank r of tp runs key heads [r Hk/tp, (r+1) Hk/tp) and
  the value heads they serve, [r Hv/tp, (r+1) Hv/tp) (tp divides both, so the grouping stays
  whole on a rank): in_proj_z / in_proj_b / in_proj_a column-wise (their outputs are head-major,
  so a contiguous split is a split by head); in_proj_qkv column-wise with its output gathered,
  since it packs q | k | v along its rows (a contiguous split would cut across the three), and
  each rank then keeps its heads' channels of each; the depthwise conv on those channels only
  (its weight replicated, each rank reading its channels); dt_bias and A_log sharded by head;
  the gated delta rule and the gated norm on the local heads; out_proj row-wise over its input
  features (the local heads'), its partial sums all-reduced like o_proj's. The replicated conv
  and norm weights get a pending-sum gradient over tp (`model.local_part`).

Sequence parallelism (`sequence_parallel=True`, topology.sp) splits the residual stream between
the blocks along the sequence (Megatron-SP, as the decoder): the norms, residual adds and MLP
pieces run on 1/tp of the tokens, and each token mixer all-gathers its input first, so the
linear layers' recurrence and state capture still see the whole stream (one rank's share of it
under block parallelism) in order; the row-wise output projections reduce-scatter.
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


def _distribute(module: nn.Module, name: str, mesh: DeviceMesh, placement) -> None:
    """Turn `module.name` into a DTensor parameter on `mesh` (meta stays meta)."""
    from torch import nn
    from torch.distributed.tensor import distribute_tensor

    param = getattr(module, name)
    module.register_parameter(name, nn.Parameter(distribute_tensor(param.data, mesh, [placement])))


def _shard_linear_heads(layer: nn.Module, tp_mesh: DeviceMesh) -> None:
    from torch.distributed.tensor import Replicate, Shard

    mixer = layer.linear_attn
    mixer.tp_rank, mixer.tp_size = tp_mesh.get_local_rank(), tp_mesh.size()
    _distribute(mixer, "dt_bias", tp_mesh, Shard(0))
    _distribute(mixer, "A_log", tp_mesh, Shard(0))
    _distribute(mixer.conv1d, "weight", tp_mesh, Replicate())
    _distribute(mixer.norm, "weight", tp_mesh, Replicate())


def apply_tensor_parallel(
    model: nn.Module, tp_mesh: DeviceMesh, *, sequence_parallel: bool = False
) -> None:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    check_tensor_parallel(model.config, tp_mesh.size())
    stream = Shard(1) if sequence_parallel else Replicate()  # the residual stream's layout
    mlp = {
        "mlp.gate_proj": ColwiseParallel(),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(output_layouts=stream),
    }
    if sequence_parallel:
        mlp.update(
            {
                "input_layernorm": SequenceParallel(use_local_output=True),
                "post_attention_layernorm": SequenceParallel(use_local_output=True),
                "mlp.gather_tokens": PrepareModuleInput(
                    input_layouts=(Shard(1),),
                    desired_input_layouts=(Replicate(),),
                    use_local_output=True,
                ),
            }
        )
    attention = {
        **mlp,
        "self_attn.q_proj": ColwiseParallel(),
        "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(),
        "self_attn.o_proj": RowwiseParallel(output_layouts=stream),
        "self_attn.q_norm": SequenceParallel(sequence_dim=2, use_local_output=True),
        "self_attn.k_norm": SequenceParallel(sequence_dim=2, use_local_output=True),
    }
    linear = {
        **mlp,
        # Gathered, left a DTensor: the model cuts its heads and marks the gradient Partial.
        "linear_attn.in_proj_qkv": ColwiseParallel(
            output_layouts=Replicate(), use_local_output=False
        ),
        "linear_attn.in_proj_z": ColwiseParallel(),
        "linear_attn.in_proj_b": ColwiseParallel(),
        "linear_attn.in_proj_a": ColwiseParallel(),
        "linear_attn.out_proj": RowwiseParallel(output_layouts=stream),
    }
    if sequence_parallel:  # each mixer gathers the stream whole (cos/sin and masks pass through)
        attention["self_attn"] = PrepareModuleInput(
            input_layouts=(Shard(1), None, None, None),
            desired_input_layouts=(Replicate(), None, None, None),
            use_local_output=True,
        )
        linear["linear_attn"] = PrepareModuleInput(
            input_layouts=(Shard(1), None),
            desired_input_layouts=(Replicate(), None),
            use_local_output=True,
        )
    for layer in model.model.layers:
        if layer.kind == "linear_attention":
            _shard_linear_heads(layer, tp_mesh)
            parallelize_module(layer, tp_mesh, linear)
        else:
            parallelize_module(layer, tp_mesh, attention)
    if sequence_parallel:  # as the decoder: embeddings cut along the sequence, the body gathered
        from turbo_dllm.families.decoder.parallelize import apply_sequence_parallel_ends

        apply_sequence_parallel_ends(model, tp_mesh)
