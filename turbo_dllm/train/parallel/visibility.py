"""The block-diffusion attention rule over arbitrary token sets.

Parallel attention sees queries and keys in shard order (zigzag, owned blocks, gathered shards),
never in natural order, so the mask is computed from per-token metadata rather than from indices:
each token carries its stream (noisy or clean), its block index and its document id.

The rule is `turbo_dllm.kernels.reference.visible` (docs/architecture.md, "Block-diffusion
semantics"): a noisy query in block i sees noisy keys of block i and clean keys of blocks < i; a
clean query in block i sees clean keys of blocks <= i; clean never sees noisy; nobody sees another
document.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from turbo_dllm.kernels.reference import block_diffusion_visible

__all__ = ["TokenSet", "tokens_mask", "two_stream_tokens"]


@dataclass(frozen=True, eq=False)
class TokenSet:
    """Metadata of a sequence of tokens in some order: noisy flag (S,), block (S,), doc (B, S)."""

    noisy: torch.Tensor
    block: torch.Tensor
    doc: torch.Tensor

    @classmethod
    def from_positions(
        cls,
        positions: torch.Tensor,
        *,
        noisy: bool,
        block_size: int,
        doc_ids: torch.Tensor,
    ) -> TokenSet:
        """Tokens of one stream at `positions`; `doc_ids` (B, L) covers the whole sequence."""
        positions = positions.to(doc_ids.device)
        return cls(
            noisy=torch.full(positions.shape, noisy, dtype=torch.bool, device=doc_ids.device),
            block=torch.div(positions, block_size, rounding_mode="floor"),
            doc=doc_ids.index_select(1, positions),
        )

    @classmethod
    def concat(cls, *parts: TokenSet) -> TokenSet:
        return cls(
            noisy=torch.cat([p.noisy for p in parts]),
            block=torch.cat([p.block for p in parts]),
            doc=torch.cat([p.doc for p in parts], dim=1),
        )

    def __len__(self) -> int:
        return int(self.noisy.numel())


def two_stream_tokens(
    positions: torch.Tensor, *, block_size: int, doc_ids: torch.Tensor
) -> TokenSet:
    """The noisy tokens at `positions` followed by the clean tokens at the same positions.

    With `positions = arange(L)` this is the single-rank 2L sequence [x_t ; x_0].
    """
    return TokenSet.concat(
        TokenSet.from_positions(positions, noisy=True, block_size=block_size, doc_ids=doc_ids),
        TokenSet.from_positions(positions, noisy=False, block_size=block_size, doc_ids=doc_ids),
    )


def tokens_mask(q: TokenSet, k: TokenSet) -> torch.Tensor:
    """Boolean visibility (B, 1, Sq, Sk) of query tokens `q` on key tokens `k`."""
    return block_diffusion_visible(q.noisy, q.block, q.doc, k.noisy, k.block, k.doc)[:, None]
