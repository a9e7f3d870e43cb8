"""Tensor parallelism (Megatron style) applied to a plain decoder from outside (torchtitan's way).

Inside every decoder layer the two matmul pairs are split over the `tp` ranks so that each pair
needs one all-reduce in the forward pass and one in the backward pass:

* attention: q_proj, k_proj, v_proj column-wise (each rank computes num_heads / tp query heads and
  num_kv_heads / tp key/value heads, so the GQA ratio is unchanged), o_proj row-wise (its partial
  sums are all-reduced into the replicated residual stream);
* MLP: gate_proj and up_proj column-wise (intermediate_size / tp columns), down_proj row-wise.

The attention code reads head counts from tensor shapes, so the attention backends and the
CSBP / CP objects simply see fewer heads; nothing in them knows about tp. Qwen3's q/k norms act
on head_dim, so every rank applies the whole (replicated) weight to its local heads; each rank's
weight gradient then covers only its heads, so the norms run as DTensors sharded on the head
dimension (`SequenceParallel(sequence_dim=2)`): their gradient comes out as a pending sum over tp
(`Partial`). FSDP2 reduces it with its own gradient reduction; without FSDP (tp alone)
`turbo_dllm.train.distributed.replicate_partial_grads` all-reduces it once before clipping, instead of letting every
optimizer op redistribute it again.

Not sharded (replicated on every tp rank): token embeddings, the RMSNorms, the final norm and the
(tied) LM head. Their cost: each tp rank stores the full embedding/head matrix and recomputes the
head's chunked cross-entropy over all of its tokens, and, without sequence parallelism, the
residual stream is whole on every rank (`sequence_parallel=True`, `topology.sp`, splits it along
the sequence: see `apply_tensor_parallel`). For the dense models trained here the head is a small
part of the FLOPs and FSDP2 still shards these weights over the data-parallel ranks; sharding the
vocabulary would need a vocab-parallel cross-entropy inside the objective's chunked head.

Because every tp rank of a group holds the same residual stream, the same loss and the same full
gradients of the replicated parameters, reductions over ranks (token counts, loss sums, FLOPs)
must count one rank per tp group: the trainer reduces them over the `loss` mesh, which has no
tp dimension.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from turbo_dllm.errors import DllmError
from turbo_dllm.families.decoder.config import DecoderConfig, tensor_parallel_problems

if TYPE_CHECKING:
    from torch import nn
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["apply_tensor_parallel", "check_tensor_parallel"]


def check_tensor_parallel(config: DecoderConfig, tp: int) -> None:
    """Raise a DllmError naming every dimension that `tp` does not divide."""
    found = tensor_parallel_problems(config, tp)
    if found:
        heads, kv = config.num_attention_heads, config.num_key_value_heads
        raise DllmError(
            "tensor parallelism cannot split this model: " + "; ".join(found),
            hint=f"choose a topology.tp that divides the attention heads ({heads}), the "
            f"key/value heads ({kv}) and intermediate_size ({config.intermediate_size}), "
            f"or use fsdp / cp / bp for the remaining GPUs",
        )


def apply_tensor_parallel(
    model: nn.Module, tp_mesh: DeviceMesh, *, sequence_parallel: bool = False
) -> None:
    """Shard every decoder layer's projections over `tp_mesh` (in place, before FSDP2).

    With `sequence_parallel` the residual stream between the attention and MLP blocks is split
    along the sequence over the tp ranks as well (Megatron-SP): the RMSNorms and the residual
    adds run on 1/tp of the tokens, each block all-gathers its input and the row-wise o/down
    projections reduce-scatter their output instead of all-reducing it (the same traffic).
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    check_tensor_parallel(model.config, tp_mesh.size())
    # The residual stream's layout between blocks: whole (TP) or split along the sequence (SP).
    stream = Shard(1) if sequence_parallel else Replicate()
    plan = {
        "self_attn.q_proj": ColwiseParallel(),
        "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(),
        "self_attn.o_proj": RowwiseParallel(output_layouts=stream),
        "mlp.gate_proj": ColwiseParallel(),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(output_layouts=stream),
    }
    if model.config.qk_norm:  # input (B, S, local heads, head_dim): heads are dim 2
        plan["self_attn.q_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
        plan["self_attn.k_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
    if sequence_parallel:
        # Local outputs: the MLP splits its pieces from this rank's own tokens.
        plan["input_layernorm"] = SequenceParallel(use_local_output=True)
        plan["post_attention_layernorm"] = SequenceParallel(use_local_output=True)
        # Attention and MLP see the whole sequence (cos/sin and the mask pass through).
        plan["self_attn"] = PrepareModuleInput(
            input_layouts=(Shard(1), None, None, None),
            desired_input_layouts=(Replicate(), None, None, None),
            use_local_output=True,
        )
        # Gathered per MLP piece (`training.mlp_chunks`): each piece of this rank's tokens is
        # all-gathered, and its output reduce-scattered back, in the residual stream's order.
        plan["mlp.gather_tokens"] = PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True
        )
    for layer in model.model.layers:
        parallelize_module(layer, tp_mesh, plan)
    if sequence_parallel:
        apply_sequence_parallel_ends(model, tp_mesh)


def apply_sequence_parallel_ends(model: nn.Module, tp_mesh: DeviceMesh) -> None:
    """Where sequence parallelism starts and ends for a `model.embed_tokens ... model.norm`
    body: the embeddings stay replicated (tied to the head); their output is cut along the
    sequence without communication, and the final norm's output is gathered whole for the
    objective's head."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        PrepareModuleOutput,
        SequenceParallel,
        parallelize_module,
    )

    parallelize_module(
        model.model,
        tp_mesh,
        {
            "embed_tokens": PrepareModuleOutput(
                output_layouts=Replicate(), desired_output_layouts=Shard(1)
            ),
            "norm": SequenceParallel(),
        },
    )
    parallelize_module(
        model,
        tp_mesh,
        {"model": PrepareModuleOutput(output_layouts=Shard(1), desired_output_layouts=Replicate())},
    )
