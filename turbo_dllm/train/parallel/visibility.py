"""The block-diffusion attention rule over arbitrary token sets.

Parallel attention sees queries and keys in shard order (zigzag, owned blocks, gathered shards),
never in natural order, so the mask is computed from per-token metadata rather than from indices:
each token carries its stream (noisy or clean), its block index and its document id.

The rule (docs/architecture.md, "Block-diffusion semantics"): a noisy query in block i sees noisy keys of
block i and clean keys of blocks < i; a clean query in block i sees clean keys of blocks <= i;
clean never sees noisy; nobody sees another document.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["TokenSet", "block_diffusion_visible", "dense_mask", "two_stream_tokens"]


def block_diffusion_visible(
    q_noisy: torch.Tensor,
    q_block: torch.Tensor,
    q_doc: torch.Tensor,
    k_noisy: torch.Tensor,
    k_block: torch.Tensor,
    k_doc: torch.Tensor,
) -> torch.Tensor:
    """Elementwise (broadcasting) visibility; also usable inside a FlexAttention mask_mod."""
    noisy_noisy = q_noisy & k_noisy & (q_block == k_block)
    noisy_clean = q_noisy & ~k_noisy & (k_block < q_block)
    clean_clean = ~q_noisy & ~k_noisy & (k_block <= q_block)
    return (noisy_noisy | noisy_clean | clean_clean) & (q_doc == k_doc)


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


def dense_mask(q: TokenSet, k: TokenSet) -> torch.Tensor:
    """Boolean visibility (B, 1, Sq, Sk) for the dense reference attention."""
    visible = block_diffusion_visible(
        q.noisy[:, None],
        q.block[:, None],
        q.doc[:, :, None],
        k.noisy[None, :],
        k.block[None, :],
        k.doc[:, None, :],
    )
    return visible[:, None]
