"""Which tokens of a block-diffusion sequence each rank of a context group holds.

A sequence of L tokens appears twice in training: the noisy stream x_t and the clean stream x_0,
both at positions 0..L-1, cut into n = L / block_size diffusion blocks. Two layouts share a
sequence across the ranks of one context group:

* **CSBP** (`CsbpLayout`): every noisy block is owned whole by one of the `bp` ranks, assigned in
  dual-end pairs (b, n-1-b) so every rank carries about the same clean-prefix cost; the clean
  stream is sharded zigzag over the `cp` ranks of the rank's clean group (rank r holds chunks r
  and 2cp-1-r of 2cp equal chunks). With cp == 1 the clean stream is not sharded: each rank
  recomputes the clean prefix up to the end of its last block. With 1 < cp < bp the bp ranks form
  bp/cp replicas of one cp-way clean shard.
  So with bp > cp a clean token sits on several ranks; an objective that scores clean outputs
  (autoregressive) scores each on one of them only, its *scorer* (`clean_scorers`).
* **CP baseline** (`CpLayout`): both streams sharded zigzag over the cp ranks, like context
  parallelism for a causal LM over the 2L sequence.

Everything here is a pure function of integers; positions come back as LongTensors so the trainer
can `index_select` its batch and the attention can build masks from them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from turbo_dllm.config.topology import (  # torch-free: validation reads them too
    _check_blocks,
    dual_end_block_assignment,
    noisy_prefix_cost,
)

__all__ = [
    "CpLayout",
    "CsbpLayout",
    "blocks_to_positions",
    "clean_scorers",
    "contiguous_block_assignment",
    "dual_end_block_assignment",
    "noisy_prefix_cost",
    "zigzag_chunks",
    "zigzag_positions",
]


def zigzag_chunks(world: int, rank: int) -> tuple[int, int]:
    """The two chunks (of 2*world) rank `rank` holds: r and 2*world-1-r, balancing causal cost."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside a group of {world}")
    return rank, 2 * world - 1 - rank


def zigzag_positions(length: int, world: int, rank: int) -> torch.Tensor:
    """Positions 0..length-1 held by `rank` under a zigzag split into 2*world equal chunks."""
    if length % (2 * world):
        raise ValueError(f"zigzag sharding needs length % (2*{world}) == 0, got length {length}")
    chunk = length // (2 * world)
    first, second = zigzag_chunks(world, rank)
    return torch.cat(
        [
            torch.arange(first * chunk, (first + 1) * chunk),
            torch.arange(second * chunk, (second + 1) * chunk),
        ]
    )


def contiguous_block_assignment(num_blocks: int, ranks: int) -> tuple[tuple[int, ...], ...]:
    """The naive split (rank r takes the r-th run of blocks); kept as the ablation baseline."""
    _check_blocks(num_blocks, ranks)
    per_rank, extra = divmod(num_blocks, ranks)
    owned, start = [], 0
    for rank in range(ranks):
        count = per_rank + (1 if rank < extra else 0)
        owned.append(tuple(range(start, start + count)))
        start += count
    return tuple(owned)


def blocks_to_positions(blocks: tuple[int, ...], block_size: int) -> torch.Tensor:
    """Token positions of `blocks`, in the order given."""
    if not blocks:
        return torch.zeros(0, dtype=torch.long)
    return torch.cat([torch.arange(b * block_size, (b + 1) * block_size) for b in blocks])


def clean_scorers(
    seq_len: int, block_size: int, bp: int, cp: int, owned: tuple[tuple[int, ...], ...]
) -> torch.Tensor:
    """(seq_len,) the context rank that scores each clean token under CSBP (`owned`: the noisy
    blocks of each of the bp ranks), one among the ranks that hold a copy of it.

    cp == 1: the rank that owns the noisy block of the same index (its clean prefix reaches the
    end of its last block, so it holds that clean block; equal block counts, equal scoring).
    cp > 1: the zigzag holder of the token in clean replica b % (bp / cp), b its block: each
    replica scores every (bp/cp)-th block of its shard (cp == bp: the one holder).
    """
    num_blocks = _check_sequence(seq_len, block_size)
    block_of = torch.arange(seq_len) // block_size
    if cp == 1:
        owner = torch.empty(num_blocks, dtype=torch.long)
        for rank, blocks in enumerate(owned):
            owner[list(blocks)] = rank
        return owner[block_of]
    holder = torch.empty(seq_len, dtype=torch.long)
    for clean_rank in range(cp):
        holder[zigzag_positions(seq_len, cp, clean_rank)] = clean_rank
    return (block_of % (bp // cp)) * cp + holder


def _check_sequence(seq_len: int, block_size: int) -> int:
    if block_size < 1 or seq_len % block_size:
        raise ValueError(f"seq_len {seq_len} is not a multiple of block_size {block_size}")
    return seq_len // block_size


@dataclass(frozen=True, eq=False)
class CsbpLayout:
    """One rank's share of a sequence under context-sharded block parallelism.

    `ctx_rank` is the rank inside the context group of `bp` ranks; its clean group is the `cp`
    consecutive ranks containing it (clean rank = ctx_rank % cp), matching the mesh order
    (clean_replica, cp) of `ParallelDims`.
    """

    seq_len: int
    block_size: int
    bp: int
    cp: int
    ctx_rank: int
    noisy_blocks: tuple[int, ...]
    noisy_positions: torch.Tensor
    clean_positions: torch.Tensor
    gathered_clean_positions: torch.Tensor
    # (num_clean,) bool: whether this rank is the scorer (`clean_scorers`) of each clean token
    # it holds; with bp > cp the others hold copies that only serve as keys and values.
    scored_clean: torch.Tensor

    @classmethod
    def build(
        cls,
        seq_len: int,
        block_size: int,
        bp: int,
        cp: int,
        ctx_rank: int,
        assignment: tuple[tuple[int, ...], ...] | None = None,
    ) -> CsbpLayout:
        """`assignment` overrides the dual-end block ownership (ablations and tests)."""
        num_blocks = _check_sequence(seq_len, block_size)
        if cp < 1 or bp < cp or bp % cp:
            raise ValueError(f"CSBP needs bp >= cp and bp % cp == 0 (got bp={bp}, cp={cp})")
        if not 0 <= ctx_rank < bp:
            raise ValueError(f"ctx_rank {ctx_rank} is outside a context group of {bp}")
        owned = assignment or dual_end_block_assignment(num_blocks, bp)
        if len(owned) != bp or sorted(b for blocks in owned for b in blocks) != list(
            range(num_blocks)
        ):
            raise ValueError(f"block assignment must cover blocks 0..{num_blocks - 1} exactly once")
        blocks = owned[ctx_rank]
        if cp == 1:
            end = (max(blocks) + 1) * block_size if blocks else 0
            clean = torch.arange(end)
            gathered = clean
        else:
            clean_rank = ctx_rank % cp
            clean = zigzag_positions(seq_len, cp, clean_rank)
            gathered = torch.cat([zigzag_positions(seq_len, cp, r) for r in range(cp)])
        scorers = clean_scorers(seq_len, block_size, bp, cp, owned)
        return cls(
            seq_len=seq_len,
            block_size=block_size,
            bp=bp,
            cp=cp,
            ctx_rank=ctx_rank,
            noisy_blocks=blocks,
            noisy_positions=blocks_to_positions(blocks, block_size),
            clean_positions=clean,
            gathered_clean_positions=gathered,
            scored_clean=scorers[clean] == ctx_rank,
        )

    @property
    def num_noisy(self) -> int:
        return int(self.noisy_positions.numel())

    @property
    def num_clean(self) -> int:
        return int(self.clean_positions.numel())


@dataclass(frozen=True, eq=False)
class CpLayout:
    """One rank's share of a sequence under the CP baseline: both streams zigzag over cp ranks."""

    seq_len: int
    block_size: int
    cp: int
    rank: int
    positions: torch.Tensor
    gathered_positions: torch.Tensor

    @classmethod
    def build(cls, seq_len: int, block_size: int, cp: int, rank: int) -> CpLayout:
        _check_sequence(seq_len, block_size)
        if seq_len % (2 * cp * block_size):
            raise ValueError(
                f"CP shards each stream into 2*cp chunks of whole blocks: seq_len {seq_len} "
                f"must be a multiple of {2 * cp * block_size}"
            )
        return cls(
            seq_len=seq_len,
            block_size=block_size,
            cp=cp,
            rank=rank,
            positions=zigzag_positions(seq_len, cp, rank),
            gathered_positions=torch.cat([zigzag_positions(seq_len, cp, r) for r in range(cp)]),
        )

    @property
    def noisy_positions(self) -> torch.Tensor:
        return self.positions

    @property
    def clean_positions(self) -> torch.Tensor:
        return self.positions

    @property
    def scored_clean(self) -> torch.Tensor:
        """Every clean token sits on one rank only: it scores all it holds."""
        return torch.ones_like(self.positions, dtype=torch.bool)
