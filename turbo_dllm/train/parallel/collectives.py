"""An all-gather whose wait can be deferred, differentiable, with an overlapped reduce-scatter.

Context-parallel attention gathers every rank's key/value shard, and in the backward pass sends
each rank the sum of all gradients for its shard (a reduce-scatter). To hide that traffic behind
compute, the collective is split into two autograd nodes:

    handle = start_all_gather(local, group)   # launches the all-gather, returns at once
    ...independent compute (local attention)...
    gathered = handle.wait()                   # (world, *local.shape)

Backward runs the nodes in reverse: `wait`'s backward launches the reduce-scatter asynchronously
and `start`'s backward waits on it. The autograd engine runs ready nodes with a higher sequence
number first, so the gradient of the work done between start and wait (created after start) runs
while the reduce-scatter is in flight.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["GatherHandle", "start_all_gather"]

# torch >= 2.12 renamed the tensor collectives; keep both spellings working (GPU hosts run 2.11).
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class _State:
    """What the two halves of one gather share."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group
        self.world = dist.get_world_size(group)
        self.gather_work: Any = None
        self.scatter_work: Any = None
        self.scatter_out: torch.Tensor | None = None
        self.scatter_in: torch.Tensor | None = None


class _Start(torch.autograd.Function):
    @staticmethod
    def forward(ctx, local: torch.Tensor, state: _State) -> torch.Tensor:
        world = state.world
        local = local.contiguous()
        out = local.new_empty((world * local.shape[0], *local.shape[1:]))
        state.gather_work = _all_gather(out, local, group=state.group, async_op=True)
        ctx.state = state
        return out

    @staticmethod
    def backward(ctx, _unused: torch.Tensor):
        state: _State = ctx.state
        state.scatter_work.wait()
        grad = state.scatter_out
        state.scatter_work = state.scatter_out = state.scatter_in = None
        return grad, None


class _Wait(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gathered: torch.Tensor, state: _State) -> torch.Tensor:
        state.gather_work.wait()
        state.gather_work = None
        ctx.state = state
        return gathered.view_as(gathered)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        state: _State = ctx.state
        grad = grad.contiguous()
        state.scatter_in = grad  # keep the source alive until the reduce-scatter finishes
        state.scatter_out = grad.new_empty((grad.shape[0] // state.world, *grad.shape[1:]))
        state.scatter_work = _reduce_scatter(
            state.scatter_out, grad, group=state.group, async_op=True
        )
        return grad, None


class GatherHandle:
    """An all-gather in flight; `wait()` returns the (world, *shape) result exactly once."""

    def __init__(self, started: torch.Tensor, state: _State, shape: torch.Size) -> None:
        self._started: torch.Tensor | None = started
        self._state = state
        self._shape = shape

    def wait(self) -> torch.Tensor:
        if self._started is None:
            raise RuntimeError("GatherHandle.wait() called twice")
        started, self._started = self._started, None
        # The (world, *shape) view is taken outside the custom Functions: autograd forbids
        # views created inside one when their base is written by the collective.
        return _Wait.apply(started, self._state).view(self._state.world, *self._shape)


def start_all_gather(local: torch.Tensor, group: dist.ProcessGroup) -> GatherHandle:
    """Launch an all-gather of `local` over `group`; gradients reduce-scatter back (summed)."""
    state = _State(group)
    return GatherHandle(_Start.apply(local, state), state, local.shape)
