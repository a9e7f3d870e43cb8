"""The parallel layout of a run: its degrees, the rules they obey, and where every rank sits.

One torch-free value for every layer (docs/architecture.md, "The parallel layout"): validation
checks its rules, the job compiler embeds it in the plan with the rank -> coordinates map, the
workers read it back from the plan, and `turbo_dllm.train.parallel.dims.ParallelDims` only turns
it into device meshes.

Ranks are laid out as dp_replicate x dp_shard x clean_replica x cp x tp (`MESH_DIMS`, outermost
first), so the chattiest groups (tp, then cp) hold neighbouring ranks, on one host where
possible. The `context` group of max(cp, bp) ranks shares one sequence; it is (clean_replica, cp):

* CP baseline (cp > 1, bp == 1): clean_replica = 1; both streams are zigzag-sharded over cp.
* CSBP (bp > 1): noisy blocks are spread over all bp ranks of the context group; the clean stream
  is zigzag-sharded over the cp ranks of each clean group and replicated over bp / cp such groups
  (cp == 1: every rank recomputes its clean prefix, no attention traffic; cp == bp: fully sharded).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

from turbo_dllm.errors import DllmError

__all__ = [
    "MESH_DIMS",
    "ContextMode",
    "ParallelLayout",
    "context_stream_lengths",
    "dual_end_block_assignment",
    "noisy_prefix_cost",
    "world_size_fixes",
]

ContextMode = Literal["none", "cp", "csbp"]
MESH_DIMS: tuple[str, ...] = ("dp_replicate", "dp_shard", "clean_replica", "cp", "tp")
WORLD_RULE = "dp*fsdp*max(cp,bp)*tp"


@dataclass(frozen=True)
class ParallelLayout:
    """Degrees of every parallel axis (the RunSpec's topology names: dp, fsdp, cp, bp, tp)."""

    dp: int = 1  # replicated data parallel (dp_replicate)
    fsdp: int = 1  # sharded data parallel (dp_shard)
    cp: int = 1
    bp: int = 1
    tp: int = 1
    sp: bool = False
    ep: int = 1

    @classmethod
    def from_topology(cls, topology: Any) -> ParallelLayout:
        return cls(**{f.name: getattr(topology, f.name) for f in dataclasses.fields(cls)})

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ParallelLayout:
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    # --- derived degrees --------------------------------------------------------------------
    @property
    def context(self) -> int:
        """Ranks that share one sequence: cp and bp fuse into one group of max(cp, bp)."""
        return max(self.cp, self.bp)

    @property
    def clean_replica(self) -> int:
        """CSBP: how many clean groups of cp ranks form the context group."""
        return self.context // self.cp

    @property
    def mode(self) -> ContextMode:
        if self.bp > 1:
            return "csbp"
        return "cp" if self.cp > 1 else "none"

    @property
    def dp_size(self) -> int:
        """Distinct batches per step (the data-parallel degree the loader and noise see)."""
        return self.dp * self.fsdp

    @property
    def world_size(self) -> int:
        return self.dp * self.fsdp * self.context * self.tp

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        return (self.dp, self.fsdp, self.clean_replica, self.cp, self.tp)

    def describe(self) -> str:
        """The world-size rule with this layout's numbers, e.g. `dp*fsdp*max(cp,bp)*tp = ...`."""
        return f"{WORLD_RULE} = {self.dp}*{self.fsdp}*{self.context}*{self.tp} = {self.world_size}"

    # --- rules ------------------------------------------------------------------------------
    def problems(self, world_size: int | None = None) -> list[tuple[str, str]]:
        """Every rule the degrees break, as (RunSpec field, message); empty when they fit."""
        found: list[tuple[str, str]] = []
        for name in ("dp", "fsdp", "cp", "bp", "tp", "ep"):
            if getattr(self, name) < 1:
                found.append((f"topology.{name}", f"must be >= 1 (got {getattr(self, name)})"))
        if found:
            return found
        cp, bp = self.cp, self.bp
        if cp > 1 and bp > 1 and (bp < cp or bp % cp):
            below = bp // cp * cp
            multiples = " or ".join(str(n) for n in (below, below + cp) if n >= cp)
            found.append(
                (
                    "topology.bp",
                    f"fused CP+BP needs bp >= cp and bp % cp == 0 (got cp={cp}, bp={bp}): the "
                    f"clean stream is sharded over cp ranks and that shard is replicated over "
                    f"bp/cp groups, so the bp ranks holding noisy blocks must form whole clean "
                    f"groups (with cp = {cp}: bp = {multiples}; or a cp that divides bp)",
                )
            )
        if self.ep > 1:
            # Expert parallelism groups ep neighbouring ranks (no axis of its own): each rank
            # routes the tokens it holds, whole sequences or (cp/bp) its share of one.
            ranks = self.dp_size * self.context
            if ranks % self.ep:
                fsdp = self.fsdp * self.ep // math.gcd(ranks, self.ep)
                fewer = "ep = 1" if ranks == 1 else f"an ep that divides {ranks}"
                found.append(
                    (
                        "topology.ep",
                        f"ep = {self.ep} must divide the data-parallel ranks "
                        f"dp*fsdp*max(cp,bp) = {ranks} (the ep group is a sub-group of them): "
                        f"{fewer}, or more ranks (e.g. topology.fsdp = {fsdp})",
                    )
                )
            if self.tp > 1:
                # At tp: a family without tp refuses it once, and that refusal covers this.
                found.append(
                    ("topology.tp", "ep combines with dp, fsdp, cp and bp: tp = 1, or ep = 1")
                )
        if world_size is not None and world_size != self.world_size:
            found.append(
                (
                    "topology",
                    f"{self.describe()} but the launch has {world_size} processes "
                    f"({self._dp_for(world_size)})",
                )
            )
        return found

    def _dp_for(self, world_size: int) -> str:
        """What makes the topology fit `world_size` processes by its data-parallel axis, said
        with numbers (a hint of `topology.dp=N` left the user to work N out)."""
        rest = self.fsdp * self.context * self.tp
        if world_size % rest == 0:
            return f"topology.dp={world_size // rest} fits {world_size}"
        below = (world_size // rest) * rest
        sizes = " or ".join(str(n) for n in (below, below + rest) if n > 0)
        return (
            f"{world_size} is not a multiple of fsdp*max(cp,bp)*tp = {rest}, so no dp fits it; "
            f"{sizes} processes do"
        )

    def resized(self, axis: Literal["dp", "fsdp"], world_size: int) -> ParallelLayout:
        """The layout an elastic restart at `world_size` runs: `axis` absorbs the change."""
        fixed = self.world_size // getattr(self, axis)
        if world_size % fixed:
            raise DllmError(
                f"elastic restart at world size {world_size}: not a multiple of the fixed "
                f"parallel degrees ({fixed})",
                hint="use a node count whose process count is a multiple of the fixed degrees",
            )
        return dataclasses.replace(self, **{axis: world_size // fixed})

    # --- ranks ------------------------------------------------------------------------------
    def coordinates(self, rank: int) -> dict[str, int]:
        """Where global `rank` sits on every mesh dimension (innermost, tp, varies fastest)."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside a world of {self.world_size}")
        coords: dict[str, int] = {}
        rest = rank
        for name, degree in reversed(list(zip(MESH_DIMS, self.mesh_shape, strict=True))):
            coords[name] = rest % degree
            rest //= degree
        return {name: coords[name] for name in MESH_DIMS}

    def dp_rank(self, rank: int) -> int:
        """Which batch `rank` reads: the ranks of one context group (and tp group) share it."""
        c = self.coordinates(rank)
        return c["dp_replicate"] * self.fsdp + c["dp_shard"]


def world_size_fixes(topo: Any, world: int, nproc: int, nnodes: int) -> list[str]:
    """The `dllm launch` flags that make the product of the RunSpec's topology `topo` and the
    process count (`nnodes` x `nproc` = `world`) agree, each to paste: the dp that fits the
    count, the process count the topology has (--nproc-per-node or --nnodes), and where no dp
    fits the count (not a multiple of fsdp*max(cp,bp)*tp), the nearest per-node counts below and
    above that one does, with that dp. Here, below jobs and doctor, so both use it. The hint
    offered `--nproc-per-node {product // nodes}` even where that was the value given (a 3-node
    launch of a 1-process topology: `--nproc-per-node 1`) or did not divide, and
    `--set topology.dp=N`, a literal N, where no dp fits."""
    rest = topo.fsdp * topo.context_degree * topo.tp
    fixes = [f"--set topology.dp={world // rest}"] if world % rest == 0 else []
    per_node, left = divmod(topo.world_size, nnodes)
    if not left and per_node != nproc:
        fixes.append(f"--nproc-per-node {per_node}")
    elif topo.world_size % nproc == 0 and topo.world_size // nproc != nnodes:
        fixes.append(f"--nnodes {topo.world_size // nproc}")
    if world % rest:
        # The per-node counts p with nnodes * p a multiple of rest are the multiples of `step`;
        # the nearest below and above nproc, by arithmetic (a scan from nproc down to 1 did not
        # return for `--nproc-per-node 1099511627777`).
        step = rest // math.gcd(nnodes, rest)
        below = [p for p in [(nproc - 1) // step * step] if p > 0]
        above = (nproc // step + 1) * step
        for p in [*below, above]:
            dp = nnodes * p // rest
            if dp != topo.dp:  # with dp as it is: the --nproc-per-node above
                fixes.append(f"--nproc-per-node {p} --set topology.dp={dp}")
    return fixes


def _check_blocks(num_blocks: int, ranks: int) -> None:
    if ranks < 1:
        raise ValueError(f"need at least one rank, got {ranks}")
    if num_blocks < 2 * ranks:
        raise ValueError(
            f"{num_blocks} blocks cannot give each of {ranks} ranks a dual-end pair "
            f"(need at least {2 * ranks})"
        )


def dual_end_block_assignment(num_blocks: int, ranks: int) -> tuple[tuple[int, ...], ...]:
    """Blocks owned by each rank, in dual-end pairs (b, n-1-b).

    Every pair costs the same (its blocks see b and n-1-b clean blocks of prefix), so equal pair
    counts mean equal attention work. Rank r takes a contiguous run of pairs; when the pairs do
    not divide evenly the first ranks take one more. An odd middle block goes to the least loaded
    rank (fewest blocks, then smallest prefix cost; the last such rank on a tie).
    """
    _check_blocks(num_blocks, ranks)
    pairs = num_blocks // 2
    per_rank, extra = divmod(pairs, ranks)
    owned: list[list[int]] = []
    start = 0
    for rank in range(ranks):
        count = per_rank + (1 if rank < extra else 0)
        low = list(range(start, start + count))
        owned.append(low + [num_blocks - 1 - b for b in low])
        start += count
    if num_blocks % 2:
        middle = num_blocks // 2
        loads = [(len(blocks), noisy_prefix_cost(blocks), -r) for r, blocks in enumerate(owned)]
        target = -min(loads)[2]
        owned[target].append(middle)
    return tuple(tuple(sorted(blocks)) for blocks in owned)


def noisy_prefix_cost(blocks: tuple[int, ...] | list[int]) -> int:
    """Attention work of noisy blocks in block-pair units: block b sees b clean blocks + itself."""
    return sum(b + 1 for b in blocks)


def context_stream_lengths(seq_len: int, block_size: int, cp: int, bp: int) -> list[int]:
    """How many tokens of the stream [x_t ; x_0] each rank of a context group holds under the
    decoder's plan with both streams (`train.parallel.layout`): 2L whole, 2L/cp under the CP
    baseline, and under CSBP its noisy blocks plus its clean share (cp 1: the prefix up to the
    end of its last block; else L/cp). Sequence parallelism splits each of them over tp.
    Needs the layout rules to hold (whole blocks, 2bp blocks for bp, 2cp chunks for cp).

    In closed form (O(bp), whatever the length), as `dual_end_block_assignment` deals the
    blocks: rank r holds its pairs (b, n-1-b) from b = start_r, so its last block is
    n-1-start_r, and an odd middle block goes to the last rank (one of the fewest pairs)."""
    if bp == 1:
        return [2 * seq_len // cp] * cp
    num_blocks = seq_len // block_size
    per_rank, extra = divmod(num_blocks // 2, bp)
    lengths, start = [], 0
    for rank in range(bp):
        pairs = per_rank + (1 if rank < extra else 0)
        noisy = 2 * pairs + (1 if num_blocks % 2 and rank == bp - 1 else 0)
        clean = (num_blocks - start) * block_size if cp == 1 else seq_len // cp
        lengths.append(noisy * block_size + clean)
        start += pairs
    return lengths
