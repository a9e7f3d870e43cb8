"""Expert parallelism: the experts of every MoE layer sharded over the ep ranks, tokens moved to
them and back with all-to-all (torch.distributed, no external dispatch library).

The ep group is `ep` neighbouring ranks, data- or context-parallel (`ParallelDims`: mesh "ep";
the ranks holding the same experts in the other groups form "ep_replica"). Rank r of a group holds
experts [r E/ep, (r+1) E/ep) of each layer, as DTensors sharded on dim 0 over the ep mesh (so
checkpoints store whole expert tensors and load at any ep). Each rank routes its own tokens; the
rows sorted by expert are sent to the owners (`ExpertDispatch`), multiplied there, and sent back
in the same order, every step differentiable (autograd all-to-all).

FSDP2 shards the rest of the model and leaves the experts alone (`ignored_params`); their
gradients are reduced here (`reduce_expert_grads`): summed over ep_replica and divided by the
ranks FSDP averages over, which is what FSDP does for every other parameter.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

__all__ = [
    "EP_GRAD_DIVISOR",
    "ExpertDispatch",
    "expert_parameters",
    "reduce_expert_grads",
    "shard_experts",
]

EP_GRAD_DIVISOR = "_dllm_ep_grad"  # on expert modules: (replica group, divisor)


def _all_to_all(rows: torch.Tensor, out_splits: list[int], in_splits: list[int], group):
    from torch.distributed._functional_collectives import (
        all_to_all_single_autograd,
        wait_tensor,
    )

    return wait_tensor(all_to_all_single_autograd(rows.contiguous(), out_splits, in_splits, group))


class ExpertDispatch:
    """Send rows sorted by (global) expert to the ranks owning the experts, run, send back."""

    def __init__(self, group, ep: int, num_experts: int) -> None:
        self.group, self.ep = group, ep
        self.local = num_experts // ep

    def __call__(
        self,
        rows: torch.Tensor,
        counts: torch.Tensor,
        run: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        import torch.distributed as dist

        ep, local = self.ep, self.local
        send = counts.view(ep, local)  # rows for owner d's experts, per expert
        recv = torch.empty_like(send)  # rows from source s for my experts, per expert
        dist.all_to_all_single(recv, send.contiguous(), group=self.group)
        send_splits = send.sum(1).tolist()
        recv_splits = recv.sum(1).tolist()
        received = _all_to_all(rows, recv_splits, send_splits, self.group)
        # Received rows come by source, then expert: regroup them by expert for the GEMMs.
        order = _by_expert(recv.cpu()).to(rows.device)
        out = run(received.index_select(0, order), recv.sum(0))
        back = torch.empty_like(out).index_copy(0, order, out)
        return _all_to_all(back, send_splits, recv_splits, self.group)


def _by_expert(recv: torch.Tensor) -> torch.Tensor:
    """Row permutation from (source, expert) order to (expert, source) order."""
    sources, experts = recv.shape
    starts = torch.cumsum(recv.reshape(-1), 0) - recv.reshape(-1)
    starts = starts.view(sources, experts)
    pieces = [
        torch.arange(int(starts[s, e]), int(starts[s, e] + recv[s, e]))
        for e in range(experts)
        for s in range(sources)
    ]
    return torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.long)


def shard_experts(experts: nn.Module, ep_mesh, replica_group, divisor: int) -> None:
    """Make `experts`' weights DTensors sharded on dim 0 over `ep_mesh` and dispatch its rows."""
    from torch.distributed.tensor import Shard, distribute_tensor

    for name in ("gate_up_proj", "down_proj"):
        param = getattr(experts, name)
        sharded = nn.Parameter(
            distribute_tensor(param.data, ep_mesh, [Shard(0)]), requires_grad=param.requires_grad
        )
        setattr(experts, name, sharded)
    # On the module, not the parameters: `to_empty` replaces the parameter objects.
    setattr(experts, EP_GRAD_DIVISOR, (replica_group, divisor))
    experts.dispatch = ExpertDispatch(ep_mesh.get_group(), ep_mesh.size(), experts.num_experts)


def expert_parameters(model: nn.Module) -> set[nn.Parameter]:
    """The expert-parallel parameters (those FSDP2 must leave alone)."""
    return {
        p
        for module in model.modules()
        if hasattr(module, EP_GRAD_DIVISOR)
        for p in module.parameters(recurse=False)
    }


def reduce_expert_grads(model: nn.Module) -> None:
    """Sum expert gradients over their replica group and divide as FSDP does (see above)."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    for module in model.modules():
        spec = getattr(module, EP_GRAD_DIVISOR, None)
        if spec is None:
            continue
        group, divisor = spec
        for param in module.parameters(recurse=False):
            if param.grad is None:
                continue
            grad = param.grad.to_local() if isinstance(param.grad, DTensor) else param.grad
            if group is not None:
                dist.all_reduce(grad, group=group)
            grad.div_(divisor)
