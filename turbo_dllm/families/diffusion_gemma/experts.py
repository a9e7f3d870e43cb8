"""DiffusionGemma's routed mixture of experts: the router and the experts as grouped GEMMs.

Tokens are sorted by the expert each of their top-k slots chose, so every expert multiplies one
contiguous run of rows: (tokens * top_k, hidden) rows in, never a (tokens, experts, hidden)
tensor. The grouped multiplication is torch's grouped GEMM (`torch.nn.functional.grouped_mm`,
else `torch._grouped_mm`) where it runs the device and dtype (CUDA sm90+, bf16, 16-byte aligned
rows), else a loop over the experts' runs (exact, any device). `grouped_gemm_kind` makes the choice explicit; `GroupedExperts.gemm`
forces one ("grouped_mm" or "loop") and the trainer/benchmark report it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from turbo_dllm.errors import DllmError

__all__ = [
    "GEMM_KINDS",
    "GroupedExperts",
    "Router",
    "grouped_gemm_kind",
    "grouped_matmul",
    "plain_rms_norm",
]

GEMM_KINDS = ("auto", "grouped_mm", "loop")


def plain_rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm without a scale, in float32 (Gemma's `with_scale=False` norm)."""
    xf = x.float()
    return (xf * torch.pow(xf.pow(2).mean(-1, keepdim=True) + eps, -0.5)).to(x.dtype)


def grouped_gemm_kind(x: torch.Tensor, *weights: torch.Tensor) -> str:
    """'grouped_mm' where torch's grouped GEMM runs these operands, else 'loop'."""
    # (torch 2.13 has a CPU kernel too, but its backward fails on an expert with no rows.)
    available = hasattr(F, "grouped_mm") or hasattr(torch, "_grouped_mm")
    if not (available and x.is_cuda and x.dtype == torch.bfloat16):
        return "loop"
    if torch.cuda.get_device_capability(x.device) < (9, 0):
        return "loop"
    # The kernel wants every row and every weight's inner dims 16-byte aligned.
    dims = [x.shape[-1]] + [d for w in weights for d in w.shape[-2:]]
    return "grouped_mm" if all(d * x.element_size() % 16 == 0 for d in dims) else "loop"


def grouped_matmul(
    x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor, kind: str
) -> torch.Tensor:
    """Rows x[offsets[e-1]:offsets[e]] @ weight[e].T for each expert e.

    x (N, K) sorted by expert; weight (E, M, K) as HF stores it; offsets (E,) int32 cumulative
    row counts. Returns (N, M).
    """
    if kind == "grouped_mm":  # the public name where this torch has it
        grouped = getattr(F, "grouped_mm", None) or torch._grouped_mm
        return grouped(x, weight.transpose(-2, -1), offs=offsets)
    if kind != "loop":
        raise DllmError(f"unknown grouped GEMM kind {kind!r}", hint=f"use one of {GEMM_KINDS}")
    ends = offsets.tolist()
    pieces, start = [], 0
    for expert, end in enumerate(ends):
        if end > start:
            pieces.append(x[start:end] @ weight[expert].t())
        start = end
    if not pieces:
        return x.new_zeros(x.shape[0], weight.shape[1])
    return torch.cat(pieces)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


def _local(param: torch.Tensor) -> torch.Tensor:
    """This rank's experts of an expert-parallel (DTensor) weight, differentiably."""
    from torch.distributed.tensor import DTensor

    return param.to_local() if isinstance(param, DTensor) else param


class Router(nn.Module):
    """norm -> x scale x hidden^-1/2 -> proj -> float32 softmax -> top-k, renormalised,
    x per_expert_scale (HF: DiffusionGemmaTextRouter)."""

    def __init__(self, hidden: int, experts: int, top_k: int, eps: float) -> None:
        super().__init__()
        self.top_k, self.eps = top_k, eps
        self.scalar_root_size = hidden**-0.5
        self.proj = nn.Linear(hidden, experts, bias=False)
        self.scale = nn.Parameter(torch.ones(hidden))
        self.per_expert_scale = nn.Parameter(torch.ones(experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = plain_rms_norm(x, self.eps) * self.scale * self.scalar_root_size
        probs = F.softmax(self.proj(h), dim=-1, dtype=torch.float32)
        weights, index = torch.topk(probs, self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights * self.per_expert_scale[index], index


class GroupedExperts(nn.Module):
    """E gated experts: gate_up_proj (E, 2I, H), down_proj (E, H, I), HF's names and layout.

    `dispatch` (set from outside by expert parallelism) moves the sorted rows to the ranks that
    hold their experts and back; without it every expert is local.
    """

    def __init__(self, experts: int, hidden: int, inner: int, act: Callable) -> None:
        super().__init__()
        self.num_experts = experts
        self.gate_up_proj = nn.Parameter(torch.empty(experts, 2 * inner, hidden))
        self.down_proj = nn.Parameter(torch.empty(experts, hidden, inner))
        self.act = act
        self.gemm = "auto"
        self.dispatch = None  # train/parallel/ep.py: ExpertDispatch under expert parallelism

    def forward(self, x: torch.Tensor, weights: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """x (T, H), weights / index (T, k) -> (T, H): sum_k weights[t, k] * expert_k(x[t])."""
        tokens, top_k = index.shape
        flat = index.reshape(-1)
        order = torch.argsort(flat, stable=True)
        source = order // top_k  # the token of each sorted row
        # Under autocast the GEMMs (and an all-to-all) run in its dtype: the norm before the
        # experts hands float32 when the weights are float32, and grouped_mm wants bf16.
        dtype = _compute_dtype(x)
        rows = x.index_select(0, source).to(dtype)
        # (bincount's output size depends on the data: a graph break, which inside a
        # checkpointed compiled layer leaves the whole layer eager; a scatter keeps its shape.)
        counts = flat.new_zeros(self.num_experts).scatter_add_(0, flat, torch.ones_like(flat))
        if self.dispatch is not None:  # expert parallelism: this rank holds some experts
            gate_up, down = _local(self.gate_up_proj), _local(self.down_proj)
            out = self.dispatch(rows, counts, lambda r, c: self._run(r, c, gate_up, down))
        else:
            out = self._run(rows, counts, self.gate_up_proj, self.down_proj)
        out = out * weights.reshape(-1)[order, None].to(out.dtype)
        return x.new_zeros(tokens, x.shape[-1]).index_add_(0, source, out.to(x.dtype))

    def _run(
        self,
        rows: torch.Tensor,
        counts: torch.Tensor,
        gate_up: torch.Tensor | None = None,
        down: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The experts `gate_up` / `down` hold (all of this module's by default) over sorted rows."""
        gate_up = self.gate_up_proj if gate_up is None else gate_up
        down = self.down_proj if down is None else down
        offsets = torch.cumsum(counts, 0).to(torch.int32)
        if gate_up.dtype != rows.dtype:  # autocast: the weights in the rows' dtype
            gate_up, down = gate_up.to(rows.dtype), down.to(rows.dtype)
        kind = grouped_gemm_kind(rows, gate_up, down) if self.gemm == "auto" else self.gemm
        gate, up = grouped_matmul(rows, gate_up, offsets, kind).chunk(2, dim=-1)
        return grouped_matmul(self.act(gate) * up, down, offsets, kind)
