"""Processes, and the wrappers applied to a plain model from outside (torchtitan's order).

`init_distributed` reads torchrun's environment (one process without it). The degrees and the
device mesh live in `turbo_dllm.train.parallel.dims.ParallelDims`. The model is wrapped in this
order: tensor parallelism (the family's plan, e.g. `families/decoder/parallelize.py`) -> activation checkpointing ->
compile -> FSDP2 (`fully_shard` per decoder layer, then the root, which owns embeddings, final
norm and the (tied) head) over the mesh's 2-D (replicate, shard) FSDP view: HSDP when both are
> 1, plain FSDP or plain replication otherwise.

With tensor parallelism the parameters live on two meshes: the tp-sharded projections are 2-D
DTensors (dp x tp), the replicated ones (norms, embeddings) 1-D dp DTensors (or plain tensors
when nothing is data-parallel). `clip_grad_norm` computes the norm per mesh and combines them.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from turbo_dllm.errors import DllmError
from turbo_dllm.kernels.block_diffusion import FORWARD_OPS

__all__ = [
    "ALLOC_CONF_VARIABLE",
    "DistEnv",
    "any_rank",
    "any_rank_now",
    "gather_from_ranks",
    "highest_on_any_rank",
    "apply_activation_checkpointing",
    "apply_compile",
    "apply_fsdp",
    "apply_mlp_chunking",
    "clip_grad_norm",
    "clip_in_optimizer",
    "init_distributed",
    "keeps_attention",
    "replicate_partial_grads",
]


ALLOC_CONF_VARIABLE = "PYTORCH_CUDA_ALLOC_CONF"


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


_joined_a_group = False  # whether this process ever joined a process group (see joined_a_group)


def joined_a_group() -> bool:
    """Whether `init_distributed` joined a process group in this process (destroyed or not):
    such a process ends by `turbo_dllm.train.entry.end_process`, without finalization."""
    return _joined_a_group


def init_distributed() -> DistEnv:
    """Join the process group torchrun set up (NCCL on GPU, gloo on CPU); no-op for 1 process."""
    import torch.distributed as dist

    from turbo_dllm.train.entry import world_size_from_env

    # Long-context steps allocate and free multi-GB tensors of changing sizes; growable segments
    # keep the caching allocator from stranding them as fragments (torchtitan's default too).
    # Read when CUDA first allocates, so it must be set before; a user's own setting wins.
    os.environ.setdefault(ALLOC_CONF_VARIABLE, "expandable_segments:True")
    world = world_size_from_env()
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        kwargs = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(backend=backend, **kwargs)
        global _joined_a_group
        _joined_a_group = True
    return DistEnv(rank=rank, world_size=world, local_rank=local_rank, device=device)


def any_rank(flag: bool, env: DistEnv) -> Callable[[], bool]:
    """Whether `flag` is true on any rank (an all-reduce MAX), as a function that reads the
    vote: the same answer on every rank.

    A decision that leads to a collective (checkpoint, stop) must be the same on every rank;
    a rank-local clock is not: with skewed clocks one rank would save and stop while another
    kept stepping, and the next collective would hang (NCCL) or time out (gloo).
    """
    vote = highest_on_any_rank(int(flag), env)
    return lambda: bool(vote())


def highest_on_any_rank(value: int, env: DistEnv) -> Callable[[], int]:
    """The highest of a small non-negative `value` over the ranks (an all-reduce MAX), as a
    function that reads it: `any_rank` with a reason (0 none, 1 one kind, 2 another).

    On CUDA the vote is queued behind the device's work and copied to pinned host memory
    behind an event: reading it waits for the work queued before the vote, not for what the
    caller queued after it (`.item()` would wait for the whole queue).
    """
    if not env.distributed:
        return lambda: value
    import torch.distributed as dist

    vote = torch.full((1,), float(value), device=env.device)
    dist.all_reduce(vote, op=dist.ReduceOp.MAX)
    if vote.device.type != "cuda":
        return lambda: int(vote.item())
    host = torch.empty(vote.shape, dtype=vote.dtype, pin_memory=True)
    host.copy_(vote, non_blocking=True)
    ready = torch.cuda.Event()
    ready.record()

    def read() -> int:
        ready.synchronize()
        return int(host.item())

    return read


def _in_a_group() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def any_rank_now(flag: bool) -> bool:
    """`any_rank` for code that holds no `DistEnv` (the checkpointer), read at once: one
    all-reduce MAX of one number over the default group, on the device its backend reduces on.
    Every rank must call it, as it would a barrier (which it can replace)."""
    if not _in_a_group():
        return flag
    import torch.distributed as dist

    nccl = "nccl" in str(dist.get_backend()) and torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    vote = torch.full((1,), float(flag), device=device)
    dist.all_reduce(vote, op=dist.ReduceOp.MAX)
    return bool(vote.item())


def gather_from_ranks(value: object) -> list:
    """Every rank's `value` (a small picklable object), in rank order, the same list on every
    rank (`all_gather_object`; `[value]` in one process). A collective: for the rare path after
    `any_rank_now` said something happened (what failed where), not for every step."""
    if not _in_a_group():
        return [value]
    import torch.distributed as dist

    found: list = [None] * dist.get_world_size()
    dist.all_gather_object(found, value)
    return found


def apply_activation_checkpointing(
    layers: nn.ModuleList, keep_attention: bool = False, keep_matmuls: bool = False
) -> None:
    """Recompute each layer in backward instead of storing its activations; with
    `keep_attention`, all but the attention kernels' outputs (`keeps_attention`); with
    `keep_matmuls`, all but those and the matmuls' outputs (`keeps_matmul`): only norms,
    activations and other pointwise ops rerun."""
    from functools import partial

    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    options = {}
    if keep_attention or keep_matmuls:
        options["context_fn"] = partial(_selective_contexts, keep_matmuls)
    for index, layer in enumerate(layers):
        layers[index] = checkpoint_wrapper(layer, preserve_rng_state=False, **options)


def keeps_attention(func) -> bool:
    """Whether selective checkpointing keeps this op's outputs: the attention kernels (SDPA's
    fused ones, FlexAttention, the forward of our `block_diffusion_attention` op), the costliest
    ops of a layer to rerun at long context and the ones whose cost grows with it."""
    return func in _torch_attention_ops() or func in FORWARD_OPS


def keeps_matmul(func) -> bool:
    """The GEMMs `keep_matmuls` keeps too: projections, MLP and experts (nn.Linear reaches the
    policy as mm / addmm; grouped experts as _grouped_mm)."""
    return func in _matmul_ops()


@functools.cache
def _torch_attention_ops() -> frozenset:
    aten = torch.ops.aten
    names = (
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
    )
    ops = {getattr(aten, name).default for name in names if hasattr(aten, name)}
    ops.add(torch.ops.higher_order.flex_attention)
    return frozenset(ops)


@functools.cache
def _matmul_ops() -> frozenset:
    aten = torch.ops.aten
    names = ("mm", "addmm", "bmm", "baddbmm", "_grouped_mm", "_scaled_mm")
    return frozenset(getattr(aten, name).default for name in names if hasattr(aten, name))


def _selective_contexts(keep_matmuls: bool):
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    def policy(ctx, func, *args, **kwargs):
        if keeps_attention(func) or (keep_matmuls and keeps_matmul(func)):
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def apply_mlp_chunking(layers: nn.ModuleList, chunks: int) -> None:
    """Run every layer's MLP over `chunks` token pieces, each recomputed alone in the backward.

    A layer without an `mlp` that has a `chunks` attribute is refused: setting one on a module
    that never reads it would leave `training.mlp_chunks` ignored without a word."""
    for index, layer in enumerate(layers):
        mlp = getattr(layer, "mlp", None)
        if not hasattr(mlp, "chunks"):
            raise DllmError(
                f"training.mlp_chunks {chunks}: layer {index} ({type(layer).__name__}) has no "
                "MLP that runs in pieces (a `mlp` module with a `chunks` attribute)",
                hint="set training.mlp_chunks: 1 for this model family",
            )
        mlp.chunks = chunks


def apply_compile(layers: nn.ModuleList) -> None:
    """torch.compile each layer in place (same parameter names, one graph per layer)."""
    for layer in layers:
        layer.compile(fullgraph=False, dynamic=False)


def apply_fsdp(
    model: nn.Module,
    layers: nn.ModuleList,
    mesh,
    *,
    reshard_after_forward: bool = True,
    ignored_params: set | None = None,
) -> None:
    """FSDP2 over the data-parallel mesh: each layer, then the root (embeddings + head).

    `ignored_params` stay as they are (expert-parallel experts: sharded over their own mesh).
    """
    from torch.distributed.fsdp import fully_shard

    for layer in layers:
        fully_shard(
            layer,
            mesh=mesh,
            reshard_after_forward=reshard_after_forward,
            ignored_params=ignored_params,
        )
    # Backward starts with the root's parameters (head, final norm): keep them gathered.
    fully_shard(model, mesh=mesh, reshard_after_forward=False, ignored_params=ignored_params)


def clip_grad_norm(params: list[torch.Tensor], max_norm: float | None) -> torch.Tensor:
    """Clip gradients to a global L2 norm; returns the norm before clipping (a 0-d tensor).

    The norm stays on the device: reading it here would stall the host until the backward has
    finished, leaving the GPU idle while the optimizer step is launched.

    torch's `clip_grad_norm_` stacks the per-parameter norms, which fails when DTensor gradients
    live on different meshes (tensor parallelism: 2-D dp x tp and 1-D dp). Here the norm is
    computed per mesh (a DTensor reduction over that mesh, made whole with `full_tensor`), the
    squares are summed, and `clip_grads_with_norm_` scales every gradient by the same factor.
    A single mesh takes torch's path unchanged.
    """
    from torch.distributed.tensor import DTensor

    limit = max_norm if max_norm is not None else float("inf")
    by_mesh: dict[object, list[torch.Tensor]] = {}
    for param in params:
        if param.grad is not None:
            mesh = param.grad.device_mesh if isinstance(param.grad, DTensor) else None
            by_mesh.setdefault(mesh, []).append(param)
    if len(by_mesh) <= 1:
        norm = torch.nn.utils.clip_grad_norm_(params, limit, foreach=True)
        return norm.full_tensor() if isinstance(norm, DTensor) else norm
    squares = []
    for group in by_mesh.values():
        norm = torch.nn.utils.get_total_norm([p.grad for p in group], 2.0, foreach=True)
        norm = norm.full_tensor() if isinstance(norm, DTensor) else norm
        squares.append(norm.float() ** 2)
    total = torch.stack(squares).sum().sqrt()
    if max_norm is not None:
        for group in by_mesh.values():
            torch.nn.utils.clip_grads_with_norm_(group, limit, total, foreach=True)
    return total


def clip_in_optimizer(
    optimizer: torch.optim.Optimizer, params: list[torch.Tensor], max_norm: float | None
) -> torch.Tensor | None:
    """Clip as `clip_grad_norm` does, with the scaling left to a fused optimizer; returns the
    norm before clipping, or None where this does not apply (then call `clip_grad_norm`).

    A fused torch optimizer divides every gradient by its `grad_scale` tensor as it reads it,
    and writes the result back (the interface `GradScaler` uses), so setting it to 1 / clip
    factor clips inside the optimizer's own pass: the separate in-place scaling (a kernel pass
    reading and writing every gradient, ~2.4 ms a step at 1.7B parameters on an H200) becomes
    one more write there. Plain tensors only: DTensor parameters keep `clip_grad_norm`.
    """
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in params if p.grad is not None]
    fused = bool(optimizer.defaults.get("fused")) and getattr(
        optimizer, "_step_supports_amp_scaling", False
    )
    if max_norm is None or not fused or not grads or any(isinstance(g, DTensor) for g in grads):
        optimizer.grad_scale = None
        return None
    norm = torch.nn.utils.get_total_norm(grads, 2.0, foreach=True)
    # torch's factor is max_norm / (norm + 1e-6), at most 1; the optimizer divides by its inverse
    optimizer.grad_scale = ((norm.float() + 1e-6) / max_norm).clamp(min=1.0)
    return norm


def replicate_partial_grads(params) -> None:
    """All-reduce gradients still pending a sum over tp (`Partial`) into the parameter's layout."""
    from torch.distributed.tensor import DTensor

    for param in params:
        grad = param.grad
        if isinstance(grad, DTensor) and any(p.is_partial() for p in grad.placements):
            param.grad = grad.redistribute(grad.device_mesh, param.placements)
