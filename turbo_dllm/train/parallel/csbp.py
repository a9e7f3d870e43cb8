"""Context-sharded block parallelism (CSBP): the attention of one rank.

Each rank owns whole noisy blocks (dual-end pairs) and a zigzag shard of the clean stream; its
local sequence is [owned noisy tokens ; clean shard] (see `CsbpLayout`). Per layer:

1. launch the all-gather of the packed clean K+V shards of the clean group (async);
2. meanwhile, attend the noisy queries over the noisy keys of their own block: the keys are local,
   since a block is never split, so noisy K/V never leave the rank;
3. wait, then one attention of all local queries (noisy and clean) over the gathered clean keys:
   noisy block i sees clean blocks < i, clean block i sees clean blocks <= i;
4. merge the two noisy partials by their log-sum-exp (`merge_attention_partials`).

Backward needs no extra code: autograd runs the attention backward and the gather's backward
reduce-scatters the clean dK/dV to their owners, overlapped with the local-block backward (see
`collectives`). With cp == 1 nothing is communicated: each rank holds the clean prefix it needs.

The object is built once per step (masks depend on the layout and the document ids only) and
called by every layer with that layer's q, k, v.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.distributed as dist

from turbo_dllm.train.parallel.collectives import start_all_gather
from turbo_dllm.train.parallel.layout import CsbpLayout
from turbo_dllm.train.parallel.partial_attention import AttentionName, build_partial_attention
from turbo_dllm.train.parallel.visibility import TokenSet

__all__ = ["CsbpAttention", "MergeFn", "kernel_merge", "pack_kv", "unpack_kv"]

MergeFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]
]


def kernel_merge(backend: str = "reference") -> MergeFn:
    """The `merge_attention_partials` kernel op with its backend fixed."""
    from turbo_dllm.kernels import merge_attention_partials

    return functools.partial(merge_attention_partials, backend=backend)


def pack_kv(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """k, v (B, Hkv, S, D) -> one contiguous (S, 2, B, Hkv, D) buffer, sequence-major.

    Sequence-major shards gathered along dim 0 are already the concatenated sequence, so
    `unpack_kv` hands k and v back as views: no reordering copy of the gathered K/V in the
    forward, and none of its gradient before the reduce-scatter in the backward.
    """
    return torch.stack([k.permute(2, 0, 1, 3), v.permute(2, 0, 1, 3)], dim=1)


def unpack_kv(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(world, S, 2, B, Hkv, D) gathered `pack_kv` shards -> k, v views (B, Hkv, world*S, D).

    The sequence is rank-major (rank 0's S tokens first), the order of the gathered positions.
    """
    packed = packed.flatten(0, 1)
    return packed[:, 0].permute(1, 2, 0, 3), packed[:, 1].permute(1, 2, 0, 3)


class CsbpAttention:
    """Attention over this rank's [noisy blocks ; clean shard] under CSBP.

    `clean_group` is the process group of the rank's clean group (the `cp` mesh axis); it may be
    None only when cp == 1. `merge` defaults to the kernel op with `merge_backend`. `kernels`
    (native or jit) is where the `turbo` backend takes its kernels from. `noisy_queries`: only
    the noisy tokens attend (q holds those rows; keys as ever): a model's last layer, whose
    clean outputs no loss reads (`train.attention.trim`).
    """

    def __init__(
        self,
        layout: CsbpLayout,
        doc_ids: torch.Tensor,
        clean_group: dist.ProcessGroup | None,
        *,
        backend: AttentionName = "reference",
        merge: MergeFn | None = None,
        merge_backend: str = "reference",
        scale: float | None = None,
        kernels: str = "native",
        noisy_queries: bool = False,
    ) -> None:
        if layout.cp > 1:
            if clean_group is None or dist.get_world_size(clean_group) != layout.cp:
                raise ValueError(f"CSBP with cp={layout.cp} needs a clean group of that size")
        self.layout = layout
        self.clean_group = clean_group
        self.num_noisy = layout.num_noisy
        self.num_clean = layout.num_clean
        self.noisy_queries = noisy_queries
        block_size = layout.block_size
        noisy = TokenSet.from_positions(
            layout.noisy_positions, noisy=True, block_size=block_size, doc_ids=doc_ids
        )
        clean = TokenSet.from_positions(
            layout.clean_positions, noisy=False, block_size=block_size, doc_ids=doc_ids
        )
        gathered = TokenSet.from_positions(
            layout.gathered_clean_positions, noisy=False, block_size=block_size, doc_ids=doc_ids
        )
        self._own_block = build_partial_attention(noisy, noisy, backend, scale, kernels)
        queries = noisy if noisy_queries else TokenSet.concat(noisy, clean)
        self._clean_prefix = build_partial_attention(queries, gathered, backend, scale, kernels)
        self._merge = merge or kernel_merge(merge_backend)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q (B, H, Ln+Lc, D) (Ln: `noisy_queries`), k/v (B, Hkv, Ln+Lc, D), local order ->
        out like q."""
        ln, lc = self.num_noisy, self.num_clean
        rows = ln if self.noisy_queries else ln + lc
        if q.shape[2] != rows or k.shape[2] != ln + lc:
            raise ValueError(
                f"CSBP rank expects {ln} noisy + {lc} clean tokens"
                f"{' (noisy queries only)' if self.noisy_queries else ''}, got q "
                f"{tuple(q.shape)}, k {tuple(k.shape)}"
            )
        k_noisy, k_clean = k.split([ln, lc], dim=2)
        v_noisy, v_clean = v.split([ln, lc], dim=2)
        handle = None
        if self.layout.cp > 1:
            handle = start_all_gather(pack_kv(k_clean, v_clean), self.clean_group)
        out_own, lse_own = self._own_block(q[:, :, :ln], k_noisy, v_noisy)
        if handle is not None:
            k_all, v_all = unpack_kv(handle.wait())
        else:
            k_all, v_all = k_clean, v_clean
        out_prefix, lse_prefix = self._clean_prefix(q, k_all, v_all)
        # The merge op takes float32 log-sum-exps (a no-op but in float64 tests).
        out_noisy, _ = self._merge(
            out_own, lse_own.float(), out_prefix[:, :, :ln], lse_prefix[:, :, :ln].float()
        )
        if self.noisy_queries:
            return out_noisy.to(out_prefix.dtype)
        # Concatenated in (B, S, H, D) memory order, the order the layer's output projection
        # reads: its transpose + reshape is then a view, not a second copy of the output kept
        # alive until the backward.
        parts = [out_noisy.to(out_prefix.dtype), out_prefix[:, :, ln:]]
        return torch.cat([part.transpose(1, 2) for part in parts], dim=1).transpose(1, 2)
