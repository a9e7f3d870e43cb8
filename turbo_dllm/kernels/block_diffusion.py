"""The `block_diffusion_attention` op: a plan per step, then one call per layer.

    plan = plan_block_diffusion_attention(q_noisy, q_block, q_doc, k_noisy, k_block, k_doc,
                                          backend="native")
    out, lse = block_diffusion_attention(q, k, v, plan)

Queries and keys are described by per-token metadata (noisy flag and block (S,), document id
(B, S)), so the op serves the whole 2L stream, CSBP's local and prefix parts and the CP
baseline's shard order alike. `reference` is dense torch (the CPU twin and the ground truth);
`native` runs the Triton kernels of the active bundle, `jit` those this turbo-dllm ships. The
plan holds the mask's tile lists (built once per step, outside any compiled region); the
Triton path is a torch custom op (opaque to torch.compile, with its own backward), registered
once per source hash.

Under torch.compile the call must trace without a graph break: a break inside a checkpointed
layer makes dynamo run the whole checkpointed region eagerly (seen on the H200: at 32K with
activation checkpointing every norm, RoPE and residual of every layer ran as separate eager
kernels, 0.8x of flex's step). So the plan registers the op and flattens each head dim's
config and tile lists into plain ints and tensors when it is built (`_Call`), and the call
itself is a dict lookup and the op.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from turbo_dllm.errors import DllmError

__all__ = ["BlockDiffusionPlan", "block_diffusion_attention", "plan_block_diffusion_attention"]

OP = "block_diffusion_attention"
_REGISTERED: dict[str, Any] = {}
# The registered forward ops (one per kernel source): selective activation checkpointing keeps
# their outputs (`train.distributed.keeps_attention`).
FORWARD_OPS: set[torch._ops.OpOverload] = set()


@dataclass(frozen=True)
class _Call:
    """The op and what it takes besides q, k, v and the scale, for one head dim: plain ints
    and tensors, so a compiled layer traces the call without touching the module's
    dataclasses (dynamo breaks the graph on `dataclasses.fields`)."""

    op: Any
    meta: list[torch.Tensor]
    lists: list[torch.Tensor]
    config: list[int]


@dataclass(eq=False)
class BlockDiffusionPlan:
    """What one step's attention needs besides q, k, v: metadata, backend, tile lists."""

    backend: str
    q_meta: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    k_meta: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    config: Any = None  # a KernelConfig forced for every head dim (tests, benchmark sweeps)
    schedule: Any = None  # the Triton module's Schedule (kernel backends)
    module: Any = None
    # head dim -> the op's arguments beyond q, k, v, scale (kernel backends; built with the plan)
    calls: dict[int, _Call] = field(default_factory=dict, repr=False)
    _visible: torch.Tensor | None = field(default=None, repr=False)

    def visible(self) -> torch.Tensor:
        """(B, Sq, Sk) bool for the reference (built on first use)."""
        if self._visible is None:
            from turbo_dllm.kernels.reference import block_diffusion_visible

            self._visible = block_diffusion_visible(*self.q_meta, *self.k_meta)
        return self._visible

    def kernel_config(self, head_dim: int):
        return self.config or self.module.default_config(head_dim)

    def add_call(self, head_dim: int) -> _Call:
        """The op's arguments at `head_dim` under the forced config (eager callers only)."""
        call = _make_call(_custom_op(self.module), self.schedule, self.kernel_config(head_dim))
        self.calls[head_dim] = call
        return call


def _make_call(op, schedule, config) -> _Call:
    """`config`'s tile lists built (once per schedule and tiling) and flattened for the op."""
    schedule.prepare(config)
    lists = [t for part in schedule.lists(config) for t in astuple_shallow(part)]
    return _Call(op, [*schedule.q_meta, *schedule.k_meta], lists, config.to_ints())


def plan_block_diffusion_attention(
    q_noisy: torch.Tensor,
    q_block: torch.Tensor,
    q_doc: torch.Tensor,
    k_noisy: torch.Tensor,
    k_block: torch.Tensor,
    k_doc: torch.Tensor,
    *,
    backend: str = "reference",
    config: Any = None,
) -> BlockDiffusionPlan:
    """The plan for queries/keys with this metadata (on the device of the attention)."""
    if q_doc.shape[0] != k_doc.shape[0]:
        raise ValueError(f"q_doc has {q_doc.shape[0]} rows, k_doc {k_doc.shape[0]}")
    if backend == "reference":
        return BlockDiffusionPlan(backend, (q_noisy, q_block, q_doc), (k_noisy, k_block, k_doc))
    if q_noisy.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise DllmError(
            f"block_diffusion_attention ({backend}) runs Triton kernels on a CUDA GPU, "
            f"not on {q_noisy.device.type}",
            hint="its CPU twin is the reference backend (model.attention: reference)",
        )
    from turbo_dllm.kernels.triton_ops import triton_module

    module = triton_module(OP, backend)
    schedule = module.make_schedule(q_noisy, q_block, q_doc, k_noisy, k_block, k_doc)
    op = _custom_op(module)  # registered here, never while dynamo traces a layer
    calls = {
        head_dim: _make_call(op, schedule, config or default)
        for head_dim, default in module.SM90_CONFIGS.items()
    }
    return BlockDiffusionPlan(
        backend,
        schedule.q_meta,
        schedule.k_meta,
        config=config,
        schedule=schedule,
        module=module,
        calls=calls,
    )


def block_diffusion_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: BlockDiffusionPlan,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse): out like q, lse (B, H, Sq) float32 natural log, -inf where a query sees no
    key (its out is 0). q (B, H, Sq, D), k/v (B, Hkv, Sk, D), H % Hkv == 0. Differentiable in
    q, k, v through out and lse."""
    if plan.backend == "reference":
        from turbo_dllm.kernels import reference

        return reference.block_diffusion_attention(q, k, v, plan.visible(), scale)
    head_dim = q.shape[-1]
    call = plan.calls.get(head_dim)
    if call is None:
        if plan.config is None:
            raise DllmError(
                f"block_diffusion_attention ({plan.backend}) supports head dim 64 or 128, "
                f"not {head_dim}",
                hint="use model.attention: flex for this model",
            )
        call = plan.add_call(head_dim)  # a forced config at another head dim (tests)
    scale = 1.0 / head_dim**0.5 if scale is None else float(scale)
    return call.op(q, k, v, call.meta, call.lists, scale, call.config)


def astuple_shallow(lists) -> tuple[torch.Tensor, ...]:
    """A TileLists' tensors in field order (dataclasses.astuple would copy them)."""
    return tuple(getattr(lists, f.name) for f in fields(lists))


def _custom_op(module):
    """The forward custom op over `module`'s kernels, with its autograd (registered once)."""
    namespace = module.__name__
    if namespace in _REGISTERED:
        return _REGISTERED[namespace]

    per = len(fields(module.TileLists))

    def unpack(meta, lists, ints):
        config = module.KernelConfig.from_ints(ints)
        fwd, dkdv, dq = (module.TileLists(*lists[i * per : (i + 1) * per]) for i in range(3))
        schedule = module.Schedule(
            tuple(meta[:3]),
            tuple(meta[3:]),
            rows={(config.fwd_m, config.fwd_n): fwd, (config.dq_m, config.dq_n): dq},
            cols={(config.dkdv_m, config.dkdv_n): dkdv},
        )
        return schedule, config

    @torch.library.custom_op(f"{namespace}::forward", mutates_args=())
    def forward(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        meta: list[torch.Tensor],
        lists: list[torch.Tensor],
        scale: float,
        config: list[int],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        schedule, cfg = unpack(meta, lists, config)
        return module.forward(q, k, v, schedule, scale, cfg)

    @forward.register_fake
    def _(q, k, v, meta, lists, scale, config):
        lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
        return torch.empty_like(q), lse

    @torch.library.custom_op(f"{namespace}::backward", mutates_args=())
    def backward(
        grad_out: torch.Tensor,
        grad_lse: torch.Tensor | None,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        lse: torch.Tensor,
        meta: list[torch.Tensor],
        lists: list[torch.Tensor],
        scale: float,
        config: list[int],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        schedule, cfg = unpack(meta, lists, config)
        return module.backward(grad_out, grad_lse, q, k, v, out, lse, schedule, scale, cfg)

    @backward.register_fake
    def _(grad_out, grad_lse, q, k, v, out, lse, meta, lists, scale, config):
        # What `backward` allocates: dq like q, dk and dv contiguous.
        return torch.empty_like(q), k.new_empty(k.shape), v.new_empty(v.shape)

    def setup_context(ctx, inputs, output):
        q, k, v, meta, lists, scale, config = inputs
        out, lse = output
        ctx.save_for_backward(q, k, v, out, lse, *meta, *lists)
        ctx.n_meta = len(meta)
        ctx.scale, ctx.config = scale, config

    def grad(ctx, grad_out, grad_lse):
        q, k, v, out, lse, *rest = ctx.saved_tensors
        meta, lists = rest[: ctx.n_meta], rest[ctx.n_meta :]
        if grad_out is None:
            grad_out = torch.zeros_like(out)
        dq, dk, dv = backward(
            grad_out, grad_lse, q, k, v, out, lse, list(meta), list(lists), ctx.scale, ctx.config
        )
        # One None per tensor of the list inputs: autograd wants the inputs' structure back.
        return dq, dk, dv, [None] * len(meta), [None] * len(lists), None, None

    forward.register_autograd(grad, setup_context=setup_context)
    _REGISTERED[namespace] = forward
    FORWARD_OPS.add(forward._opoverload)
    return forward
