"""Attention backends for the block-diffusion stream.

A backend has two halves: `prepare(layout, doc_ids, device)` turns the batch's layout into the
mask object its kernel wants (once per micro-batch, shared by every layer), and
`__call__(q, k, v, mask)` attends. q: (B, Hq, Sq, D); k, v: (B, Hkv, Sk, D) with Hq % Hkv == 0.
`prepare(..., queries=range, keys=range)` masks a window of the stream: queries and keys are
the stream rows of those ranges (the whole stream by default), for a model that computes only
the rows its loss reads (`train.parallel.plan.WholeSequence`).

- `reference`: scaled_dot_product_attention with an explicit boolean (B, 1, 2L, 2L) mask.
  Simple and exact; memory grows with (2L)^2, so it is for CPU, tests and short sequences.
- `flex`: FlexAttention with a BlockMask built from the same predicate; compiled, it skips
  fully masked tiles and never materialises the mask. The GPU default. (On CPU, torch can run
  it forward-only, which the tests use to check the BlockMask.)
- `turbo`: our Triton op `block_diffusion_attention` (turbo_dllm.kernels.block_diffusion): the
  mask's tiles classified once per micro-batch into full / partial / empty, full tiles without
  mask arithmetic, empty ones never visited. Its kernels come from the active bundle
  (`kernels: native`, the default) or from the shipped source (`kernels: jit`); CUDA only.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from turbo_dllm.errors import DllmError
from turbo_dllm.train.attention.block_mask import block_mask_from_predicate
from turbo_dllm.train.attention.canvas import CanvasLayout
from turbo_dllm.train.attention.layout import (
    BlockDiffusionLayout,
    allowed,
    dense_mask,
    one_document_per_row,
)

__all__ = [
    "FlexAttention",
    "ReferenceAttention",
    "TurboAttention",
    "build_attention",
    "create_block_mask_for",
    "flex_kernel_options",
]

_compiled_create_block_mask = None


def create_block_mask_for(device: torch.device | str):
    """FlexAttention's `create_block_mask`, compiled on CUDA so it never materialises the S x S
    mask there. torch.compile(create_block_mask) is the supported form (torch >= 2.11 deprecates
    the `_compile=True` flag, which did the same per call)."""
    global _compiled_create_block_mask
    from torch.nn.attention.flex_attention import create_block_mask

    if torch.device(device).type != "cuda":
        return create_block_mask
    if _compiled_create_block_mask is None:
        _compiled_create_block_mask = torch.compile(create_block_mask)
    return _compiled_create_block_mask


def flex_kernel_options(q: torch.Tensor) -> dict[str, int] | None:
    """FlexAttention tile options beyond torch's defaults, or None to keep them.

    Over 256-wide heads (DiffusionGemma's 512-wide full-attention heads) torch's forward
    default is 64 x 32 tiles with K and V in 3 pipeline stages: 2 bytes x (64 + 3 x 2 x 32) x
    512 = 256 KiB of shared memory, more than a Hopper block gets (227 KiB), and compiling
    fails with "No valid triton configs". Keep the tiles and take as many stages as fit."""
    head_dim = q.shape[-1]
    if q.device.type != "cuda" or head_dim <= 256:
        return None
    per_stage = 2 * 32 * head_dim * q.element_size()  # one K and one V tile of 32 rows
    q_tile = 64 * head_dim * q.element_size()
    shared = torch.cuda.get_device_properties(q.device.index or 0).shared_memory_per_block_optin
    stages = (shared - q_tile) // per_stage
    return {"fwd_num_stages": int(max(1, min(3, stages)))}


def _gqa(q: torch.Tensor, k: torch.Tensor) -> bool:
    return q.shape[1] != k.shape[1]


def _window(layout: Any, queries: range | None, keys: range | None) -> tuple[range, range]:
    """The stream rows masked as queries and as keys (None: the whole stream)."""
    whole = range(layout.stream_len)
    queries, keys = queries or whole, keys or whole
    for name, rows in (("queries", queries), ("keys", keys)):
        if rows.step != 1 or not rows or rows.start < 0 or rows.stop > layout.stream_len:
            raise ValueError(f"{name} {rows} is not a window of the {layout.stream_len}-row stream")
    return queries, keys


class ReferenceAttention:
    name = "reference"

    def prepare(
        self,
        layout: BlockDiffusionLayout,
        doc_ids: torch.Tensor | None,
        device: torch.device,
        queries: range | None = None,
        keys: range | None = None,
    ) -> torch.Tensor:
        if isinstance(layout, CanvasLayout):  # one document per row (the family checks)
            mask = layout.dense_mask(device=device)
        else:
            mask = dense_mask(layout, doc_ids, device=device)
        queries, keys = _window(layout, queries, keys)
        if len(queries) == layout.stream_len and len(keys) == layout.stream_len:
            return mask
        return mask[..., queries.start : queries.stop, keys.start : keys.stop]

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any
    ) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=_gqa(q, k))


class FlexAttention:
    """FlexAttention over a BlockMask. `compile=False` runs the unfused (eager) path."""

    name = "flex"

    def __init__(self, compile: bool = True) -> None:
        self.compile = compile
        self._kernel = None
        self._static: dict[tuple, Any] = {}

    def _flex(self):
        if self._kernel is None:
            from torch.nn.attention.flex_attention import flex_attention

            self._kernel = (
                torch.compile(flex_attention, dynamic=False) if self.compile else flex_attention
            )
        return self._kernel

    def prepare(
        self,
        layout: BlockDiffusionLayout,
        doc_ids: torch.Tensor | None,
        device: torch.device,
        queries: range | None = None,
        keys: range | None = None,
    ) -> Any:
        queries, keys = _window(layout, queries, keys)
        q0, k0, Sq, Sk = queries.start, keys.start, len(queries), len(keys)
        if isinstance(layout, CanvasLayout) or one_document_per_row(doc_ids):
            # One document per row: the mask is the same for every batch and step; cache it.
            # (A canvas layout depends on the batch's response start: keep the last few.)
            # Built eagerly (train.attention.block_mask): compiling the builder costs minutes.
            key = (layout, str(device), queries, keys)
            if key not in self._static:
                if len(self._static) >= 16:
                    self._static.clear()

                def mask_mod(b, h, q_idx, kv_idx):
                    if isinstance(layout, CanvasLayout):
                        return layout.allowed(q_idx + q0, kv_idx + k0)
                    return allowed(layout, q_idx + q0, kv_idx + k0)

                self._static[key] = block_mask_from_predicate(mask_mod, Sq, Sk, device)
            return self._static[key]
        # Documents change every batch: the compiled builder, one compile per run's layout.
        create_block_mask = create_block_mask_for(device if self.compile else "cpu")
        docs = doc_ids.to(device=device, dtype=torch.int32)

        def doc_mask_mod(b, h, q_idx, kv_idx):
            q_idx, kv_idx = q_idx + q0, kv_idx + k0
            same_doc = docs[b, layout.token(q_idx)] == docs[b, layout.token(kv_idx)]
            return allowed(layout, q_idx, kv_idx) & same_doc

        return create_block_mask(doc_mask_mod, docs.shape[0], None, Sq, Sk, device=device)

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any
    ) -> torch.Tensor:
        options = dict(
            block_mask=mask, enable_gqa=_gqa(q, k), kernel_options=flex_kernel_options(q)
        )
        if torch.compiler.is_compiling():  # inside a compiled layer: that graph fuses it
            from torch.nn.attention.flex_attention import flex_attention

            return flex_attention(q, k, v, **options)
        return self._flex()(q, k, v, **options)


class TurboAttention:
    """The `block_diffusion_attention` Triton op over the 2L stream; `kernels`: native or jit."""

    name = "turbo"

    def __init__(self, kernels: str = "native") -> None:
        self.kernels = kernels
        self._static: dict[tuple, Any] = {}

    def prepare(
        self,
        layout: BlockDiffusionLayout,
        doc_ids: torch.Tensor | None,
        device: torch.device,
        queries: range | None = None,
        keys: range | None = None,
    ) -> Any:
        from turbo_dllm.kernels.block_diffusion import plan_block_diffusion_attention

        queries, keys = _window(layout, queries, keys)
        one_document = one_document_per_row(doc_ids)
        key = (layout, str(device), queries, keys)
        if one_document and key in self._static:
            return self._static[key]
        idx = torch.arange(layout.stream_len, device=device)
        noisy, block = layout.is_noisy(idx), layout.block(idx)
        if one_document:  # one broadcast row: the plan holds for every batch and step
            docs = torch.zeros(1, layout.stream_len, dtype=torch.int32, device=device)
        else:
            docs = doc_ids.to(device=device, dtype=torch.int32).repeat(1, 2)  # both streams
        q, k = slice(queries.start, queries.stop), slice(keys.start, keys.stop)
        q_docs, k_docs = docs[:, q].contiguous(), docs[:, k].contiguous()
        plan = plan_block_diffusion_attention(
            noisy[q], block[q], q_docs, noisy[k], block[k], k_docs, backend=self.kernels
        )
        if one_document:
            self._static[key] = plan
        return plan

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any
    ) -> torch.Tensor:
        from turbo_dllm.kernels.block_diffusion import block_diffusion_attention

        return block_diffusion_attention(q, k, v, mask)[0]


def build_attention(name: str, device: torch.device, compile: bool = True, kernels: str = "native"):
    """The backend a RunSpec names (`model.attention`), refused where it cannot train.

    `kernels` is the RunSpec's kernels setting: `turbo` runs the bundle's kernels unless it is
    `jit` (the shipped sources, for kernel development)."""
    if name == "reference":
        return ReferenceAttention()
    if name == "turbo":
        if torch.device(device).type != "cuda":
            raise DllmError(
                "model.attention 'turbo' runs Triton kernels on a CUDA GPU",
                hint="set model.attention: reference for CPU runs",
            )
        source = "jit" if kernels == "jit" else "native"
        if source == "native":  # fail now, with the install command, not at the first step
            from turbo_dllm.kernels.loader import load_bundle_op

            load_bundle_op("block_diffusion_attention")
        return TurboAttention(source)
    if name == "flex":
        if torch.device(device).type != "cuda":
            raise DllmError(
                "model.attention 'flex' needs a CUDA GPU to train (torch has no FlexAttention "
                "backward on CPU)",
                hint="set model.attention: reference for CPU runs",
            )
        return FlexAttention(compile=compile)
    raise DllmError(
        f"unknown attention backend {name!r}", hint="use 'reference', 'flex' or 'turbo'"
    )
