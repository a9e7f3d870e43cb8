"""Context parallelism over the whole 2L sequence: the baseline CSBP is measured against.

Both streams are sharded zigzag over the cp ranks (rank r holds chunks r and 2cp-1-r of each
stream), so every rank does about the same causal work; its local sequence is
[noisy chunks ; clean chunks] at the same positions (see `CpLayout`). Per layer the rank
all-gathers the packed K+V of every rank's local sequence (noisy and clean: 2L tokens in all),
then runs one attention of its queries over all keys with the block-diffusion mask, the way
all-gather context parallelism (Llama 3 style) does it for causal LMs. Backward reduce-scatters
dK/dV to their owners through the gather's autograd node.

Unlike CSBP, the noisy K/V travel too, and nothing is overlapped with the gather.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from turbo_dllm.train.parallel.collectives import start_all_gather
from turbo_dllm.train.parallel.csbp import pack_kv, unpack_kv
from turbo_dllm.train.parallel.layout import CpLayout
from turbo_dllm.train.parallel.partial_attention import AttentionName, build_partial_attention
from turbo_dllm.train.parallel.visibility import TokenSet, two_stream_tokens

__all__ = ["CpAttention"]


class CpAttention:
    """Attention over this rank's [noisy chunks ; clean chunks] under the CP baseline.

    `noisy_queries`: only the noisy chunks attend (q holds those rows; keys as ever): a model's
    last layer, whose clean outputs no loss reads (`train.attention.trim`). `clean_only`: the
    rank holds its clean chunks alone (q, k, v: L/cp rows) and attends over every rank's clean
    chunks: the clean half of the stream under context parallelism, for an objective that
    scores only clean tokens (the autoregressive one), where the noisy half is dead."""

    def __init__(
        self,
        layout: CpLayout,
        doc_ids: torch.Tensor,
        group: dist.ProcessGroup | None,
        *,
        backend: AttentionName = "reference",
        scale: float | None = None,
        kernels: str = "native",
        noisy_queries: bool = False,
        clean_only: bool = False,
    ) -> None:
        if layout.cp > 1 and (group is None or dist.get_world_size(group) != layout.cp):
            raise ValueError(f"CP with cp={layout.cp} needs a process group of that size")
        if noisy_queries and clean_only:
            raise ValueError("noisy_queries and clean_only exclude each other")
        self.layout = layout
        self.group = group
        held = int(layout.positions.numel())
        self.num_local = held if clean_only else 2 * held
        self.num_queries = held if noisy_queries or clean_only else self.num_local
        block_size = layout.block_size

        def tokens(positions: torch.Tensor, queries: bool = False) -> TokenSet:
            """A rank's tokens at `positions` in its local order (as queries: `noisy_queries`
            keeps the noisy chunks, which come first)."""
            if clean_only or (queries and noisy_queries):
                return TokenSet.from_positions(
                    positions, noisy=not clean_only, block_size=block_size, doc_ids=doc_ids
                )
            return two_stream_tokens(positions, block_size=block_size, doc_ids=doc_ids)

        local = tokens(layout.positions, queries=True)
        gathered = TokenSet.concat(*(tokens(p) for p in layout.gathered_positions.chunk(layout.cp)))
        self._attend = build_partial_attention(local, gathered, backend, scale, kernels)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q (B, H, 2*L/cp, D) (half: `noisy_queries`), k/v (B, Hkv, 2*L/cp, D) (all three
        L/cp: `clean_only`), local order -> out like q."""
        if q.shape[2] != self.num_queries or k.shape[2] != self.num_local:
            raise ValueError(
                f"CP rank expects {self.num_queries} queries over {self.num_local} tokens, got q "
                f"{tuple(q.shape)}, k {tuple(k.shape)}"
            )
        if self.layout.cp > 1:
            k_all, v_all = unpack_kv(start_all_gather(pack_kv(k, v), self.group).wait())
        else:
            k_all, v_all = k, v
        out, _ = self._attend(q, k_all, v_all)
        return out
