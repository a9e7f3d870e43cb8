"""Context parallelism for the linear layers: the clean stream's state handed from rank to rank.

Under the CP baseline (`CpLayout`) rank r of cp holds chunks r and 2cp-1-r of both streams (2cp
equal chunks of whole blocks). The full-attention layers gather K/V (`CpAttention`); a Gated
DeltaNet layer instead needs, for clean chunk c, the recurrent state and the convolution's input
window left by chunks 0..c-1. The recurrence is sequential, so the chunks run in stream order,
each starting when the rank of chunk c-1 hands its (state, conv tail) over:

    rank 0: c0 -> rank 1: c1 -> ... -> rank cp-1: c(cp-1), c(cp) -> rank cp-2: c(cp+1) -> ... -> rank 0

(2cp-1 dependent hand-offs per linear layer; the projections, MLPs and full attention stay
parallel). Each noisy block restarts from the state captured inside its own clean chunk, which is
on the same rank (the noisy and clean chunks share positions), so noisy blocks need nothing more.

The hand-off is differentiable: the backward runs the chain in reverse, each rank sending the
gradient of the state it received back to its sender (`_Receive`) and receiving the gradient of
the state it sent (`_SendAlong`, attached to the chunk's output). The autograd engine runs a
rank's later chunk before its earlier one (higher sequence numbers first), which is the order the
reverse chain needs. Activation checkpointing would re-run the sends inside the backward, so it
is refused with cp (the family's rules).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from turbo_dllm.train.parallel.layout import zigzag_chunks

__all__ = ["StateHandOff"]


class _Receive(torch.autograd.Function):
    @staticmethod
    def forward(ctx, anchor, src, group, state_shape, state_dtype, tail_shape):
        ctx.src, ctx.group = src, group
        state = anchor.new_empty(state_shape, dtype=state_dtype)
        tail = anchor.new_empty(tail_shape)
        dist.recv(state, src, group=group)
        dist.recv(tail, src, group=group)
        return state, tail

    @staticmethod
    def backward(ctx, grad_state, grad_tail):
        dist.send(grad_state.contiguous(), ctx.src, group=ctx.group)
        dist.send(grad_tail.contiguous(), ctx.src, group=ctx.group)
        return None, None, None, None, None, None


class _SendAlong(torch.autograd.Function):
    @staticmethod
    def forward(ctx, out, state, tail, dst, group):
        ctx.dst, ctx.group = dst, group
        ctx.state_meta = (state.shape, state.dtype)
        ctx.tail_meta = (tail.shape, tail.dtype)
        dist.send(state.detach().contiguous(), dst, group=group)
        dist.send(tail.detach().contiguous(), dst, group=group)
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad_out):
        (state_shape, state_dtype), (tail_shape, tail_dtype) = ctx.state_meta, ctx.tail_meta
        grad_state = grad_out.new_empty(state_shape, dtype=state_dtype)
        grad_tail = grad_out.new_empty(tail_shape, dtype=tail_dtype)
        dist.recv(grad_state, ctx.dst, group=ctx.group)
        dist.recv(grad_tail, ctx.dst, group=ctx.group)
        return grad_out, grad_state, grad_tail, None, None


class StateHandOff:
    """One rank's part of the chain: which clean chunks it runs and whom it hands state to."""

    def __init__(self, group: dist.ProcessGroup | None, cp: int, rank: int) -> None:
        if cp > 1 and (group is None or dist.get_world_size(group) != cp):
            raise ValueError(f"the state hand-off over cp={cp} needs a process group of that size")
        self.group, self.cp, self.rank = group, cp, rank
        self.chunks = zigzag_chunks(cp, rank)  # global chunk ids, in this rank's stream order

    def _owner(self, chunk: int) -> int:
        return chunk if chunk < self.cp else 2 * self.cp - 1 - chunk

    def _global(self, rank: int) -> int:
        return dist.get_global_rank(self.group, rank)

    @torch.compiler.disable
    def receive(self, chunk, kept, anchor, state_shape, state_dtype, tail_shape):
        """(state, conv tail) before `chunk`: None, zeros at the stream's start; `kept` when this
        rank ran the chunk before; else from the rank that did."""
        if chunk == 0:
            return None, anchor.new_zeros(tail_shape)
        src = self._owner(chunk - 1)
        if src == self.rank:
            return kept
        return _Receive.apply(
            anchor, self._global(src), self.group, state_shape, state_dtype, tail_shape
        )

    @torch.compiler.disable
    def send(self, chunk, out, state, tail):
        """Hand the state after `chunk` on; returns (out, what this rank keeps for its next)."""
        if chunk == 2 * self.cp - 1:
            return out, None
        dst = self._owner(chunk + 1)
        if dst == self.rank:
            return out, (state, tail)
        return _SendAlong.apply(out, state, tail, self._global(dst), self.group), None
