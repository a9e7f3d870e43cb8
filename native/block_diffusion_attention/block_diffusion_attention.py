"""Block-diffusion attention in Triton: tile schedule, forward, backward (dK/dV and dQ kernels).

The op attends queries over keys described by per-token metadata (noisy flag, diffusion block,
document id), so the same kernels serve the whole 2L stream [x_t ; x_0], CSBP's local part
(noisy block with itself) and its prefix part (every query over gathered clean keys), and the CP
baseline's shard order. The rule (docs/training.md): a noisy query in block i sees noisy keys of
block i and clean keys of blocks < i; a clean query in block i sees clean keys of blocks <= i;
clean never sees noisy; nobody sees another document.

Work follows the mask. `tile_schedule` summarises each tile of queries and of keys (which streams
it holds, its block and document ranges) and classifies every (query tile, key tile) pair as
empty, full (every pair allowed) or partial. Per query tile the kernels walk a list of key tiles:
the full ones first, with no mask arithmetic at all, then the partial ones, which evaluate the
predicate from the metadata. Empty tiles are never visited. The backward dK/dV kernel walks the
transposed lists. Classification is conservative (a tile that is not provably full or empty is
partial), and a tile holding positions past the end of the sequence is never full, so full tiles
load without bounds checks.

Numbers: bf16 (or fp16) in, fp32 accumulation, scores scaled by softmax_scale * log2(e) and
exponentiated with exp2. Forward returns out (q's dtype) and lse (fp32, natural log, -inf for a
query that sees no key, whose out is 0), so partial results merge exactly by log-sum-exp. The
backward takes the gradient of lse too (d lse / d s = p): it enters as delta - grad_lse.

This file is the op's Triton source: the bundle ships it under its source hash and imports that
copy; nothing here imports turbo_dllm.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields, replace
from pathlib import Path

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453

EMPTY, PARTIAL, FULL = 0, 1, 2


# --- tile configurations (a small fixed set for sm90; no autotuning at run time) ------------
KERNELS = ("fwd", "dkdv", "dq")


@dataclass(frozen=True)
class KernelConfig:
    """Tiles, warps, pipelining and loads of the three kernels (fwd, dkdv, dq), each with:

    m, n: query and key tile sizes; warps; stages: the kernel's pipeline depth.
    pipe: 0 plain loops (the compiler pipelines the loads that feed dots), 1 `tl.range(...,
      num_stages=stages)` loops, which pipeline the tile-index and metadata loads too.
    ws: warp-specialise the full-tile loop (`tl.range(..., warp_specialize=True)`; pipe 1).
    runs: walk the full tiles as contiguous runs of affine loops (start tile, length) instead
      of one indirectly indexed list (the mask's full tiles are ranges of tiles).
    tma: full-tile loads through the tensor memory accelerator: 0 pointer loads, 1 host-side
      descriptors (4-D boxes), 2 device-side `tl.make_tensor_descriptor` (2-D, per head).
    order: launch order: 0 heads innermost (the heaviest tiles of every head first), 1 head by
      head (each head's tiles heaviest first; the programs running together share K/V in L2);
      the Gluon dK/dV kernel also takes N > 1, chunks of N key tiles each run for every head
      in turn, and reads 0 as "chosen by the grid's depth" (`dkdv_chunk`).
    dkdv_dq: 1: the dK/dV kernel also makes dQ (each tile pair's dS K added with fp32 atomics
      into a zeroed buffer, as FlashAttention-3 does) and the dQ kernel is not launched: five
      matmuls per tile pair instead of seven (the dQ kernel recomputes S and dP).
    dkdv_gluon: 1: dK/dV by the Gluon kernel (`_gluon_dkdv_kernel`: a TMA producer warp, two
      consumer warpgroups, P^T and dS^T to their wgmmas in registers) in place of the `tl` one;
      sm90 only, 64 x 128 tiles on 8 warps, dkdv_stages deep; the other dkdv fields but `m`,
      `n`, `warps`, `stages`, `order`, `dq` and `split` do not apply to it (with `dq`, its tile
      pairs' dS K are added with fp32 atomics, dS^T passed through shared memory).
    dkdv_split: 1 (with dkdv_gluon, without dkdv_dq): each of the Gluon dK/dV kernel's two
      consumer warpgroups its own partition of 64 keys, so they meet at no barrier (one
      partition syncs both before every stage release and they run in lock-step).
    dq_gluon: 1: dQ by the Gluon dQ kernel (`_gluon_dq_kernel`: the same structure, K and V
      tiles streamed, dS handed to dQ's wgmma in registers) in place of the `tl` one; sm90 only,
      128 x 64 tiles on 8 warps, dq_stages deep; of the other dq fields only `m`, `n`, `warps`,
      `stages` and `split` apply.
    dq_split: 1 (with dq_gluon): the Gluon dQ kernel's two consumer warpgroups each its own
      partition of 64 query rows, as `dkdv_split` does for dK/dV.

    Every field is an int (flags 0/1) so the torch op passes the config as a list of ints.
    """

    fwd_m: int = 128
    fwd_n: int = 64
    fwd_warps: int = 8
    fwd_stages: int = 3
    fwd_pipe: int = 0
    fwd_ws: int = 0
    fwd_runs: int = 0
    fwd_tma: int = 0
    fwd_order: int = 0
    dkdv_m: int = 64
    dkdv_n: int = 128
    dkdv_warps: int = 8
    dkdv_stages: int = 2
    dkdv_pipe: int = 0
    dkdv_ws: int = 0
    dkdv_runs: int = 0
    dkdv_tma: int = 0
    dkdv_order: int = 0
    dkdv_dq: int = 0
    dkdv_gluon: int = 0
    dkdv_split: int = 0
    dq_m: int = 128
    dq_n: int = 64
    dq_warps: int = 8
    dq_stages: int = 2
    dq_pipe: int = 0
    dq_ws: int = 0
    dq_runs: int = 0
    dq_tma: int = 0
    dq_order: int = 0
    dq_gluon: int = 0
    dq_split: int = 0

    def part(self, kernel: str) -> dict[str, int]:
        """One kernel's fields without its prefix: {'m': ..., 'n': ..., 'warps': ...}."""
        prefix = kernel + "_"
        return {
            f.name[len(prefix) :]: getattr(self, f.name)
            for f in fields(self)
            if f.name.startswith(prefix)
        }

    def with_part(self, kernel: str, **values: int) -> KernelConfig:
        return replace(self, **{f"{kernel}_{name}": value for name, value in values.items()})

    def to_ints(self) -> list[int]:
        return [int(getattr(self, f.name)) for f in fields(self)]

    @classmethod
    def from_ints(cls, ints) -> KernelConfig:
        return cls(*(int(x) for x in ints))


# The defaults per head dim: sm90_configs.json next to this file (shipped with it, under the
# op's source hash), written from a sweep on the H200 (`benchmarks/attention.py --sweep` writes
# the file; the lead copies it here). Fields it does not name keep the dataclass defaults.
_DEFAULTS_FILE = Path(__file__).with_name("sm90_configs.json")


def _load_defaults() -> dict[int, KernelConfig]:
    table = json.loads(_DEFAULTS_FILE.read_text())["configs"]
    return {int(dim): KernelConfig(**values) for dim, values in table.items()}


SM90_CONFIGS = _load_defaults()


# The loop and load variants (fields of one kernel; the tests apply each to all three at once).
LOOP_VARIANTS = [
    ("tl.range", dict(pipe=1)),
    ("tl.range ws", dict(pipe=1, ws=1)),
    ("runs", dict(runs=1)),
    ("runs tl.range", dict(runs=1, pipe=1)),
    ("head-major", dict(order=1)),
    ("head-major runs tl.range", dict(order=1, runs=1, pipe=1)),
    ("tma host", dict(tma=1)),
    ("tma device", dict(tma=2)),
]


def everywhere(config: KernelConfig, **values: int) -> KernelConfig:
    """`config` with the same fields set in all three kernels."""
    for kernel in KERNELS:
        config = config.with_part(kernel, **values)
    return config


def sweep_variants(head_dim: int) -> dict[str, list[tuple[str, KernelConfig]]]:
    """Per kernel, the variants `benchmarks/attention.py --sweep` times, each a change of that
    kernel's fields on the default (the kernels are timed apart, so the winners combine).

    Why runs x stages: with the indirect list the K/V (Q/dO) address of a tile depends on a
    scalar load in the same iteration, and Triton 3.6's pipeliner then waits for every copy
    at the top of each iteration (no overlap of loads with the matmuls, whatever num_stages).
    Full tiles walked as affine runs pipeline for real from 3 stages on (the TTGIR waits with
    num = 2 or 4 outstanding copy groups); 128 x 128 forward tiles in 3 stages use 224 KB of
    shared memory, just under the H200's 227 KB."""
    base = default_config(head_dim)
    tiles = {  # (name, change) per kernel: tile shapes and warps, indirect list
        "fwd": [
            ("128x128 w8 s2", dict(m=128, n=128, warps=8, stages=2)),
            ("128x64 w8 s3", dict(m=128, n=64, warps=8, stages=3)),
            ("128x64 w4 s3", dict(m=128, n=64, warps=4, stages=3)),
        ],
        "dkdv": [
            ("64x128 w8 s2", dict(m=64, n=128, warps=8, stages=2)),
            ("64x128 w4 s2", dict(m=64, n=128, warps=4, stages=2)),
            ("128x128 w8 s2", dict(m=128, n=128, warps=8, stages=2)),
            # 32 query rows: the only dK/dV tiles that keep within the registers (Triton 3.6,
            # sm90: 64 x 128 spills 152 bytes, 54 stores, 8 spill instructions in its full-tile
            # loop and 52 in its partial-tile one; `ci/triton_sm90_compile.py`),
            # yet 1.08-1.21x slower than 64 x 128 on the H200 at D = 128 (session 13)
            ("32x128 w8 s2", dict(m=32, n=128, warps=8, stages=2)),
            ("32x128 w8 s3", dict(m=32, n=128, warps=8, stages=3)),
        ],
        "dq": [
            ("128x64 w8 s2", dict(m=128, n=64, warps=8, stages=2)),
            ("128x64 w4 s2", dict(m=128, n=64, warps=4, stages=2)),
            ("128x128 w8 s2", dict(m=128, n=128, warps=8, stages=2)),
        ],
    }
    runs = {  # full tiles as runs, deeper pipelines
        "fwd": [
            ("runs 128x128 w8 s3", dict(m=128, n=128, warps=8, stages=3)),
            ("runs 128x64 w8 s3", dict(m=128, n=64, warps=8, stages=3)),
            ("runs 128x64 w8 s4", dict(m=128, n=64, warps=8, stages=4)),
            ("runs 128x64 w4 s3", dict(m=128, n=64, warps=4, stages=3)),
            ("runs 128x64 w4 s4", dict(m=128, n=64, warps=4, stages=4)),
        ],
        "dkdv": [
            ("runs 64x128 w8 s3", dict(m=64, n=128, warps=8, stages=3)),
            ("runs 64x128 w8 s4", dict(m=64, n=128, warps=8, stages=4)),
            ("runs 64x128 w4 s3", dict(m=64, n=128, warps=4, stages=3)),
            ("runs 128x128 w8 s2", dict(m=128, n=128, warps=8, stages=2)),
            ("runs 32x128 w8 s3", dict(m=32, n=128, warps=8, stages=3)),
            ("runs 32x128 w8 s4", dict(m=32, n=128, warps=8, stages=4)),
            ("runs 32x128 w8 s3 tma host", dict(m=32, n=128, warps=8, stages=3, tma=1)),
            ("runs 32x128 w8 s4 tma host", dict(m=32, n=128, warps=8, stages=4, tma=1)),
        ],
        "dq": [
            ("runs 128x64 w8 s3", dict(m=128, n=64, warps=8, stages=3)),
            ("runs 128x64 w8 s4", dict(m=128, n=64, warps=8, stages=4)),
            ("runs 128x64 w4 s3", dict(m=128, n=64, warps=4, stages=3)),
            ("runs 128x128 w8 s3", dict(m=128, n=128, warps=8, stages=3)),
        ],
    }
    # (dQ at 128 x 128 in 3 stages asks 262 KB of shared memory: its deep runs use 128 x 64.)
    deep = {"fwd": dict(m=128, n=64, stages=4), "dkdv": dict(stages=3), "dq": dict(n=64, stages=3)}
    variants: dict[str, list[tuple[str, KernelConfig]]] = {}
    for kernel in KERNELS:
        entries = list(tiles[kernel])
        entries += [(name, change | {"runs": 1}) for name, change in runs[kernel]]
        # The pipelined runs with the other loop and load variants.
        for name, change in (("tl.range", dict(pipe=1)), ("head-major", dict(order=1)),
                             ("tma host", dict(tma=1)), ("tma device", dict(tma=2))):  # fmt: skip
            entries.append((f"runs deep {name}", deep[kernel] | change | {"runs": 1}))
        entries += LOOP_VARIANTS  # on the default tiles
        if head_dim <= 64 and kernel == "fwd":  # D = 64 has room for wider key tiles
            entries.append(("runs 128x128 w4 s4", dict(m=128, n=128, warps=4, stages=4, runs=1)))
        if kernel == "fwd":
            # 64-row tiles on one warpgroup, small enough in shared memory for two programs per
            # SM, which then interleave one's softmax with the other's matmuls (FA3's ping-pong,
            # by the hardware's scheduler): in 3 stages 115 KB and 198 registers, no spill (64 x
            # 128 on 4 warps spills 592 bytes under Triton 3.6). (A lazy rescale of the
            # accumulator, FlashAttention-4's, cost 12-20 % on the H200: docs/benchmarks.md.)
            for stages in (2, 3):
                tile = dict(m=64, n=64, warps=4, stages=stages, runs=1, pipe=1)
                entries.append((f"runs 64x64 w4 s{stages}", tile))
        if kernel in ("dkdv", "dq"):  # the Gluon kernels (their own loops: only the ring depth)
            tile = GLUON_DKDV_TILE if kernel == "dkdv" else GLUON_DQ_TILE
            gluon = dict(m=tile[0], n=tile[1], warps=tile[2], gluon=1)
            entries += [(f"gluon s{stages}", gluon | {"stages": stages}) for stages in (2, 3, 4)]
            entries += [(f"gluon split s{stages}", gluon | dict(stages=stages, split=1))
                        for stages in (2, 3, 4)]  # fmt: skip
            for order in (0, 1, 4, 16) if kernel == "dkdv" else ():  # its launch orders
                name = {0: "chosen", 1: "head-major"}.get(order, f"chunks {order}")
                entries.append(
                    (f"gluon split s3 {name}", gluon | dict(stages=3, split=1, order=order))
                )
        # a `tl` variant runs the `tl` kernel whatever the default's is (Gluon entries set it)
        tl = TL_KERNELS.get(kernel, {})
        variants[kernel] = [
            (name, base.with_part(kernel, **(tl | change))) for name, change in entries
        ]
    return variants


def flag_configs(head_dim: int) -> dict[str, KernelConfig]:
    """Configs that together set every loop and load flag the sweep may pick, on the head dim's
    defaults (on the `tl` kernels where no Gluon one is named): the GPU tests check each against
    the reference, and `ci/triton_sm90_compile.py` compiles them for sm90 on a host without a
    GPU (a pass failure shows there first)."""
    base = tl_default(head_dim)  # the Gluon kernels are named where a config takes them
    return {
        "runs s3 head-major tma host": everywhere(
            base, runs=1, pipe=1, order=1, tma=1, stages=3, n=64
        ).with_part("dkdv", m=64, n=128),
        # on the indirect list, 8 warps: Triton 3.6's warp-specialisation pass fails on runs
        # ("value not sliced") and on 4-warp forward and dQ loops ("expected non-null blocks")
        "tma device tl.range ws": everywhere(base, tma=2, pipe=1, ws=1, runs=0, warps=8),
        "dq fused": base.with_part("dkdv", dq=1),
        "gluon dkdv": base.with_part("dkdv", m=64, n=128, warps=8, gluon=1, dq=0, stages=3),
        "gluon dkdv dq fused": base.with_part("dkdv", m=64, n=128, warps=8, gluon=1, dq=1),
        "gluon dkdv split": base.with_part(
            "dkdv", m=64, n=128, warps=8, gluon=1, dq=0, stages=3, split=1
        ),
        # the Gluon dK/dV's other launch orders (`dkdv_chunk`); chunks of 3 leave a short one
        "gluon dkdv head-major": base.with_part(
            "dkdv", m=64, n=128, warps=8, gluon=1, dq=0, stages=3, split=1, order=1
        ),
        "gluon dkdv chunks 3": base.with_part(
            "dkdv", m=64, n=128, warps=8, gluon=1, dq=0, stages=3, split=1, order=3
        ),
        "gluon backward": base.with_part(
            "dkdv", m=64, n=128, warps=8, gluon=1, dq=0, stages=3
        ).with_part("dq", m=128, n=64, warps=8, gluon=1, stages=3),
        "gluon backward split": base.with_part(
            "dkdv", m=64, n=128, warps=8, gluon=1, dq=0, stages=3, split=1
        ).with_part("dq", m=128, n=64, warps=8, gluon=1, stages=3, split=1),
        "dq fused runs s3": everywhere(base, runs=1, pipe=1, stages=3, n=64).with_part(
            "dkdv", m=64, n=128, dq=1
        ),
    }


def default_config(head_dim: int) -> KernelConfig:
    """The shipped config of `head_dim`; under a Triton without Gluon (before 3.6) the same on
    the `tl` kernels, which give the Gluon ones' numbers (the GPU tests hold them bit for bit)."""
    if head_dim not in SM90_CONFIGS:
        raise ValueError(f"block_diffusion_attention supports head dim 64 or 128, not {head_dim}")
    config = SM90_CONFIGS[head_dim]
    return config if HAS_GLUON else _on_tl(config)


# The fields that pick a Gluon kernel: off, the `tl` kernels run with the config's other fields.
TL_KERNELS = {"dkdv": dict(gluon=0, split=0), "dq": dict(gluon=0, split=0)}


def tl_default(head_dim: int) -> KernelConfig:
    """The default config on the `tl` kernels only (the Gluon kernels' reference in the tests,
    and the base of the `tl` variants the sweep and the tests set)."""
    return _on_tl(default_config(head_dim))


def _on_tl(config: KernelConfig) -> KernelConfig:
    for kernel, values in TL_KERNELS.items():
        config = config.with_part(kernel, **values)
    return config


# --- tile schedule -------------------------------------------------------------------------
def _tile_summary(noisy: torch.Tensor, block: torch.Tensor, doc: torch.Tensor, tile: int):
    """Per tile of `tile` tokens: any noisy, any clean, block min/max, doc min/max, ragged."""
    length = noisy.numel()
    tiles = triton.cdiv(length, tile)
    pad = tiles * tile - length
    valid = torch.ones(length, dtype=torch.bool, device=noisy.device)
    big = torch.iinfo(torch.int32).max
    small = torch.iinfo(torch.int32).min

    def padded(x: torch.Tensor, fill) -> torch.Tensor:
        return torch.nn.functional.pad(x, (0, pad), value=fill)

    valid_t = padded(valid, False).view(tiles, tile)
    noisy_t = padded(noisy.bool(), False).view(tiles, tile)
    block_i = block.to(torch.int32)
    doc_i = doc.to(torch.int32)
    b = doc.shape[0]
    return {
        "any_noisy": noisy_t.any(1),
        "any_clean": (valid_t & ~noisy_t).any(1),
        "block_min": padded(block_i, big).view(tiles, tile).amin(1),
        "block_max": padded(block_i, small).view(tiles, tile).amax(1),
        "doc_min": padded(doc_i, big).view(b, tiles, tile).amin(2),
        "doc_max": padded(doc_i, small).view(b, tiles, tile).amax(2),
        "ragged": ~valid_t.all(1),
    }


def classify_tiles(q_meta, k_meta, block_m: int, block_n: int) -> torch.Tensor:
    """(B, Mt, Nt) int8: EMPTY, PARTIAL or FULL for each (query tile, key tile)."""
    q = _tile_summary(*q_meta, block_m)
    k = _tile_summary(*k_meta, block_n)
    qn, qc = q["any_noisy"][:, None], q["any_clean"][:, None]
    kn, kc = k["any_noisy"][None, :], k["any_clean"][None, :]
    qb_lo, qb_hi = q["block_min"][:, None], q["block_max"][:, None]
    kb_lo, kb_hi = k["block_min"][None, :], k["block_max"][None, :]
    qd_lo, qd_hi = q["doc_min"][:, :, None], q["doc_max"][:, :, None]
    kd_lo, kd_hi = k["doc_min"][:, None, :], k["doc_max"][:, None, :]
    # Some pair may be allowed (necessary conditions only).
    maybe = (
        (
            (qn & kn & (qb_lo <= kb_hi) & (kb_lo <= qb_hi))
            | (qn & kc & (kb_lo < qb_hi))
            | (qc & kc & (kb_lo <= qb_hi))
        )[None]
        & (qd_lo <= kd_hi)
        & (kd_lo <= qd_hi)
    )
    # Every pair is allowed (sufficient conditions only).
    q_noisy_only, q_clean_only = qn & ~qc, qc & ~qn
    k_noisy_only, k_clean_only = kn & ~kc, kc & ~kn
    one_block = (qb_lo == qb_hi) & (kb_lo == kb_hi) & (qb_lo == kb_lo)
    every = (
        (q_noisy_only & k_noisy_only & one_block)
        | (q_noisy_only & k_clean_only & (kb_hi < qb_lo))
        | (q_clean_only & k_clean_only & (kb_hi <= qb_lo))
    )
    every = every & ~q["ragged"][:, None] & ~k["ragged"][None, :]
    one_doc = (qd_lo == qd_hi) & (kd_lo == kd_hi) & (qd_lo == kd_lo)
    full = every[None] & one_doc
    classes = torch.where(maybe, PARTIAL, EMPTY).to(torch.int8)
    return torch.where(full & maybe, FULL, classes).to(torch.int8)


@dataclass(frozen=True)
class TileLists:
    """Per (batch, row tile): the column tiles to visit, full ones first, and how many of each.

    order (B, R): row tiles heaviest first (the launch order); index (B, R, C) int32; count
    (B, R, 3) int32 = (full, partial, runs); runs (B, R, C, 2) int32: the full tiles as
    contiguous runs (first tile, length), `count[..., 2]` of them.
    """

    order: torch.Tensor
    index: torch.Tensor
    count: torch.Tensor
    runs: torch.Tensor


def _full_runs(index: torch.Tensor, full: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The full tiles (the first `full` of each row of `index`, ascending) as runs of
    consecutive tiles: (runs (B, R, C, 2) = (first tile, length), number of runs (B, R))."""
    cols = index.shape[-1]
    j = torch.arange(cols, device=index.device)
    is_full = j < full[..., None]
    step = torch.ones_like(index, dtype=torch.bool)
    step[..., 1:] = index[..., 1:] != index[..., :-1] + 1
    starts = is_full & step
    n_runs = starts.sum(-1, dtype=torch.int32)
    # Positions of the run starts first (stable: ascending), then the rest.
    pos = torch.sort(starts.to(torch.int8), dim=-1, descending=True, stable=True).indices
    nxt = torch.cat([pos[..., 1:], torch.full_like(pos[..., :1], cols)], -1)
    r = j.expand_as(pos)
    nxt = torch.where(r + 1 >= n_runs[..., None], full[..., None].to(nxt.dtype), nxt)
    first = index.gather(-1, pos)
    length = torch.where(r < n_runs[..., None], nxt - pos, 0)
    runs = torch.stack([first, length.to(torch.int32)], -1).to(torch.int32)
    return runs.contiguous(), n_runs


def tile_lists(classes: torch.Tensor) -> TileLists:
    """Lists over the last axis of (B, R, C) classes."""
    full = (classes == FULL).sum(-1, dtype=torch.int32)
    partial = (classes == PARTIAL).sum(-1, dtype=torch.int32)
    # Stable sort on the class, descending: full tiles, then partial, then empty (never read).
    index = torch.sort(classes.to(torch.int32), dim=-1, descending=True, stable=True).indices.to(
        torch.int32
    )
    work = 2 * full + partial  # a full tile is cheaper, but this only orders the launch
    order = torch.sort(work, dim=-1, descending=True, stable=True).indices.to(torch.int32)
    runs, n_runs = _full_runs(index, full)
    count = torch.stack([full, partial, n_runs], -1)
    return TileLists(order.contiguous(), index.contiguous(), count.contiguous(), runs)


@dataclass
class Schedule:
    """The metadata of queries and keys plus the tile lists of every tiling used (cached)."""

    q_meta: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    k_meta: tuple[torch.Tensor, torch.Tensor, torch.Tensor]

    rows: dict[tuple[int, int], TileLists] | None = None
    cols: dict[tuple[int, int], TileLists] | None = None

    def __post_init__(self) -> None:
        self._classes: dict[tuple[int, int], torch.Tensor] = {}
        self._rows: dict[tuple[int, int], TileLists] = dict(self.rows or {})
        self._cols: dict[tuple[int, int], TileLists] = dict(self.cols or {})

    def prepare(self, config: KernelConfig) -> None:
        """Build every list `config` reads now (not inside a traced or timed region)."""
        self.by_query_tile(config.fwd_m, config.fwd_n)
        self.by_key_tile(config.dkdv_m, config.dkdv_n)
        self.by_query_tile(config.dq_m, config.dq_n)

    def lists(self, config: KernelConfig) -> list[TileLists]:
        """The fwd, dkdv and dq lists of `config`."""
        return [
            self.by_query_tile(config.fwd_m, config.fwd_n),
            self.by_key_tile(config.dkdv_m, config.dkdv_n),
            self.by_query_tile(config.dq_m, config.dq_n),
        ]

    def classes(self, block_m: int, block_n: int) -> torch.Tensor:
        key = (block_m, block_n)
        if key not in self._classes:
            self._classes[key] = classify_tiles(self.q_meta, self.k_meta, block_m, block_n)
        return self._classes[key]

    def by_query_tile(self, block_m: int, block_n: int) -> TileLists:
        key = (block_m, block_n)
        if key not in self._rows:
            self._rows[key] = tile_lists(self.classes(block_m, block_n))
        return self._rows[key]

    def by_key_tile(self, block_m: int, block_n: int) -> TileLists:
        key = (block_m, block_n)
        if key not in self._cols:
            self._cols[key] = tile_lists(self.classes(block_m, block_n).transpose(1, 2))
        return self._cols[key]


def make_schedule(q_noisy, q_block, q_doc, k_noisy, k_block, k_doc) -> Schedule:
    """Metadata as the kernels read it: noisy int8 (S,), block int32 (S,), doc int32 (B, S)."""

    def meta(noisy, block, doc):
        return (
            noisy.to(torch.int8).contiguous(),
            block.to(torch.int32).contiguous(),
            doc.to(torch.int32).contiguous(),
        )

    return Schedule(meta(q_noisy, q_block, q_doc), meta(k_noisy, k_block, k_doc))


# --- kernels -------------------------------------------------------------------------------
@triton.jit
def _visible(qn, qb, qd, kn, kb, kd):
    """The block-diffusion predicate on broadcast metadata (query column, key row)."""
    q_noisy = qn != 0
    k_noisy = kn != 0
    noisy_noisy = q_noisy & k_noisy & (qb == kb)
    noisy_clean = q_noisy & (~k_noisy) & (kb < qb)
    clean_clean = (~q_noisy) & (~k_noisy) & (kb <= qb)
    return (noisy_noisy | noisy_clean | clean_clean) & (qd == kd)


@triton.jit
def _program(ORDER, Mt, PER_BATCH, H, HEAD_MAJOR: tl.constexpr):
    """(b, h, tile, list row) of this program. Launch order: axis 0 runs first, so heads
    innermost puts every head's heaviest tile first; head-major runs one head's tiles together."""
    if HEAD_MAJOR:
        pid = tl.program_id(0)
        bh = tl.program_id(1)
    else:
        pid = tl.program_id(1)
        bh = tl.program_id(0)
    b = bh // H
    lb = b * PER_BATCH  # 0: one schedule (one document per row) serves every batch row
    tile = tl.load(ORDER + lb * Mt + pid)
    return bh, b, bh % H, tile, lb * Mt + tile


@triton.jit
def _rows(base, stride, desc, b, h, r0, offs_r, offs_d,
          TMA: tl.constexpr, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr):  # fmt: skip
    """A full tile of ROWS rows from r0 (no bounds checks): pointers or a TMA descriptor."""
    if TMA == 1:  # host descriptor over (B, H, S, D), boxes (1, 1, ROWS, D)
        x = desc.load([b, h, r0, 0]).reshape(ROWS, HEAD_DIM)
    elif TMA == 2:  # device descriptor over this head's (S, D)
        x = desc.load([r0, 0])
    else:
        x = tl.load(base + (r0 + offs_r)[:, None] * stride + offs_d[None, :])
    return x


@triton.jit
def _head_desc(base, rows, stride, desc, TMA: tl.constexpr, ROWS: tl.constexpr,
               HEAD_DIM: tl.constexpr):  # fmt: skip
    """The descriptor `_rows` reads: one per head made here for TMA 2, else `desc` as given."""
    if TMA == 2:
        d = tl.make_tensor_descriptor(base, [rows, HEAD_DIM], [stride, 1], [ROWS, HEAD_DIM])
    else:
        d = desc
    return d


@triton.jit
def _fwd_full_tile(q, m_i, l_i, acc, k_base, v_base, k_desc, v_desc, b, hk, n0, offs_j, offs_d,
                   stride_ks, stride_vs, qk_scale,
                   TMA: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):  # fmt: skip
    """Every pair allowed: no bounds or mask arithmetic; m_new is finite here."""
    k = _rows(k_base, stride_ks, k_desc, b, hk, n0, offs_j, offs_d, TMA, BLOCK_N, HEAD_DIM)
    v = _rows(v_base, stride_vs, v_desc, b, hk, n0, offs_j, offs_d, TMA, BLOCK_N, HEAD_DIM)
    # Raw scores: the row max scales as a vector, the exponent is one multiply-add (log2 units:
    # qk_scale holds log2(e), so exp2 is exact softmax).
    s = tl.dot(q, tl.trans(k))
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    p = tl.math.exp2(s * qk_scale - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc)
    return m_new, l_i, acc


# Head and tile counts are not specialised on (Triton would compile one variant per divisibility
# of each: a tile count of 8 and one of 128 differ), so the kernels a bundle ships compiled
# (bundles/triton_cache.py) are the ones every head count and tile count launches. The sequence
# lengths Sq, Sk are: knowing them multiples of 16 cuts the forward's stack from 176 bytes to 104
# and the `tl` dK/dV's from 152 to 128, and dK/dV from 9.81-9.96 ms to 9.62-9.63 at 2L 16K on
# the H200 (docs/benchmarks.md, session 17). So there are two variants, 16-divisible lengths and
# the rest, and the bundle's warm-up launches both (kernels/selftest.py). Strides stay
# specialised: multiples of 16 at every trainer shape.
_SIZES = ["H", "GROUP", "Mt", "Nt", "PER_BATCH"]


@triton.jit(do_not_specialize=_SIZES)
def _fwd_kernel(
    Q, K, V, OUT, LSE, A_TMA, B_TMA,
    QN, QB, QD, KN, KB, KD,
    ORDER, IDX, COUNT, RUNS,
    qk_scale,
    stride_qb, stride_qh, stride_qs,
    stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs,
    stride_ob, stride_oh, stride_os,
    stride_qdb, stride_kdb,
    H, GROUP, Sq, Sk, Mt, Nt, PER_BATCH,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TMA: tl.constexpr,
    PIPE: tl.constexpr, STAGES: tl.constexpr, WS: tl.constexpr, RUN_LOOPS: tl.constexpr,
    HEAD_MAJOR: tl.constexpr,
):  # fmt: skip
    bh, b, h, m_tile, row = _program(ORDER, Mt, PER_BATCH, H, HEAD_MAJOR)
    hk = h // GROUP
    offs_m = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_j = tl.arange(0, BLOCK_N)
    row_ok = offs_m < Sq
    b64 = b.to(tl.int64)
    q_base = Q + b64 * stride_qb + h.to(tl.int64) * stride_qh
    k_base = K + b64 * stride_kb + hk.to(tl.int64) * stride_kh
    v_base = V + b64 * stride_vb + hk.to(tl.int64) * stride_vh
    k_desc = _head_desc(k_base, Sk, stride_ks, A_TMA, TMA, BLOCK_N, HEAD_DIM)
    v_desc = _head_desc(v_base, Sk, stride_vs, B_TMA, TMA, BLOCK_N, HEAD_DIM)
    q = tl.load(
        q_base + offs_m[:, None] * stride_qs + offs_d[None, :], mask=row_ok[:, None], other=0.0
    )

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    n_full = tl.load(COUNT + row * 3)
    n_partial = tl.load(COUNT + row * 3 + 1)
    idx = IDX + row.to(tl.int64) * Nt

    # Full tiles: no mask arithmetic. As affine runs of tiles, or one indirect list.
    if RUN_LOOPS:
        runs = RUNS + row.to(tl.int64) * Nt * 2
        for r in range(0, tl.load(COUNT + row * 3 + 2)):
            t0 = tl.load(runs + 2 * r) * BLOCK_N
            t1 = t0 + tl.load(runs + 2 * r + 1) * BLOCK_N
            if PIPE:
                for n0 in tl.range(t0, t1, BLOCK_N, num_stages=STAGES, warp_specialize=WS):
                    m_i, l_i, acc = _fwd_full_tile(
                        q, m_i, l_i, acc, k_base, v_base, k_desc, v_desc, b, hk,
                        tl.multiple_of(n0, BLOCK_N), offs_j, offs_d, stride_ks, stride_vs,
                        qk_scale, TMA, BLOCK_N, HEAD_DIM,
                    )  # fmt: skip
            else:
                for n0 in range(t0, t1, BLOCK_N):
                    m_i, l_i, acc = _fwd_full_tile(
                        q, m_i, l_i, acc, k_base, v_base, k_desc, v_desc, b, hk,
                        tl.multiple_of(n0, BLOCK_N), offs_j, offs_d, stride_ks, stride_vs,
                        qk_scale, TMA, BLOCK_N, HEAD_DIM,
                    )  # fmt: skip
    elif PIPE:
        for i in tl.range(0, n_full, num_stages=STAGES, warp_specialize=WS):
            m_i, l_i, acc = _fwd_full_tile(
                q, m_i, l_i, acc, k_base, v_base, k_desc, v_desc, b, hk,
                tl.load(idx + i) * BLOCK_N, offs_j, offs_d, stride_ks, stride_vs,
                qk_scale, TMA, BLOCK_N, HEAD_DIM,
            )  # fmt: skip
    else:
        for i in range(0, n_full):
            m_i, l_i, acc = _fwd_full_tile(
                q, m_i, l_i, acc, k_base, v_base, k_desc, v_desc, b, hk,
                tl.load(idx + i) * BLOCK_N, offs_j, offs_d, stride_ks, stride_vs,
                qk_scale, TMA, BLOCK_N, HEAD_DIM,
            )  # fmt: skip

    # Partial tiles: the predicate from metadata; a row may still see nothing (m_new = -inf).
    qn = tl.load(QN + offs_m, mask=row_ok, other=0)
    qb = tl.load(QB + offs_m, mask=row_ok, other=-1)
    qd = tl.load(QD + b64 * stride_qdb + offs_m, mask=row_ok, other=-1)
    for i in tl.range(n_full, n_full + n_partial, num_stages=STAGES if PIPE else None):
        offs_n = tl.load(idx + i) * BLOCK_N + offs_j
        col_ok = offs_n < Sk
        k = tl.load(
            k_base + offs_n[:, None] * stride_ks + offs_d[None, :], mask=col_ok[:, None], other=0.0
        )
        v = tl.load(
            v_base + offs_n[:, None] * stride_vs + offs_d[None, :], mask=col_ok[:, None], other=0.0
        )
        kn = tl.load(KN + offs_n, mask=col_ok, other=0)
        kb = tl.load(KB + offs_n, mask=col_ok, other=0)
        kd = tl.load(KD + b64 * stride_kdb + offs_n, mask=col_ok, other=-2)
        visible = _visible(
            qn[:, None], qb[:, None], qd[:, None], kn[None, :], kb[None, :], kd[None, :]
        )
        visible = visible & col_ok[None, :] & row_ok[:, None]
        s = tl.where(visible, tl.dot(q, tl.trans(k)), float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s * qk_scale - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new

    seen = l_i > 0.0
    l_safe = tl.where(seen, l_i, 1.0)
    out = acc / l_safe[:, None]
    lse = tl.where(seen, (m_i + tl.math.log2(l_safe)) * 0.6931471805599453, float("-inf"))
    o_base = OUT + b64 * stride_ob + h.to(tl.int64) * stride_oh
    tl.store(
        o_base + offs_m[:, None] * stride_os + offs_d[None, :],
        out.to(OUT.dtype.element_ty),
        mask=row_ok[:, None],
    )
    tl.store(LSE + bh.to(tl.int64) * Sq + offs_m, lse, mask=row_ok)


@triton.jit(do_not_specialize=["H"])
def _bwd_preprocess_kernel(
    OUT, DO, LSE, GLSE, DELTA, LSE2,
    stride_ob, stride_oh, stride_os,
    stride_dob, stride_doh, stride_dos,
    H, Sq,
    HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr, HAS_GLSE: tl.constexpr,
):  # fmt: skip
    """delta = rowsum(dO * O) - grad_lse; lse in log2 units, +inf where a row saw nothing."""
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    offs_m = pid * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, HEAD_DIM)
    ok = offs_m < Sq
    o = tl.load(
        OUT + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_os + offs_d[None, :],
        mask=ok[:, None],
        other=0.0,
    )
    do = tl.load(
        DO + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_dos + offs_d[None, :],
        mask=ok[:, None],
        other=0.0,
    )
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    row = bh.to(tl.int64) * Sq + offs_m
    if HAS_GLSE:
        delta -= tl.load(GLSE + row, mask=ok, other=0.0)
    lse = tl.load(LSE + row, mask=ok, other=float("-inf"))
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
    tl.store(DELTA + row, delta, mask=ok)
    tl.store(LSE2 + row, lse2, mask=ok)


@triton.jit
def _dkdv_full_tile(k, v, dk, dv, q_base, do_base, q_desc, do_desc, b, h, m0, offs_i, offs_d,
                    stride_qs, stride_dos, LSE2, DELTA, stat, qk_scale, dq_base, stride_dqas,
                    TMA: tl.constexpr, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr,
                    DQ: tl.constexpr):  # fmt: skip
    """dK, dV of one full (query tile, key tile): every pair allowed, no bounds checks; with DQ
    this pair's share of dQ too (added atomically)."""
    q = _rows(q_base, stride_qs, q_desc, b, h, m0, offs_i, offs_d, TMA, BLOCK_M, HEAD_DIM)
    do = _rows(do_base, stride_dos, do_desc, b, h, m0, offs_i, offs_d, TMA, BLOCK_M, HEAD_DIM)
    offs_m = m0 + offs_i
    lse2 = tl.load(LSE2 + stat + offs_m)
    delta = tl.load(DELTA + stat + offs_m)
    s_t = tl.dot(k, tl.trans(q)) * qk_scale
    p_t = tl.math.exp2(s_t - lse2[None, :])
    dv = tl.dot(p_t.to(do.dtype), do, dv)
    dp_t = tl.dot(v, tl.trans(do))
    ds_t = (p_t * (dp_t - delta[None, :])).to(q.dtype)
    dk = tl.dot(ds_t, q, dk)
    if DQ:
        dq = tl.dot(tl.trans(ds_t), k)
        tl.atomic_add(dq_base + offs_m[:, None] * stride_dqas + offs_d[None, :], dq, sem="relaxed")
    return dk, dv


@triton.jit(do_not_specialize=[*_SIZES, "HK"])
def _bwd_dkdv_kernel(
    Q, K, V, DO, DK, DV, LSE2, DELTA, A_TMA, B_TMA, DQ_ACC,
    QN, QB, QD, KN, KB, KD,
    ORDER, IDX, COUNT, RUNS,
    qk_scale, sm_scale,
    stride_qb, stride_qh, stride_qs,
    stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs,
    stride_dob, stride_doh, stride_dos,
    stride_dkb, stride_dkh, stride_dks,
    stride_dqab, stride_dqah, stride_dqas,
    stride_qdb, stride_kdb,
    H, HK, GROUP, Sq, Sk, Mt, Nt, PER_BATCH,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TMA: tl.constexpr,
    PIPE: tl.constexpr, STAGES: tl.constexpr, WS: tl.constexpr, RUN_LOOPS: tl.constexpr,
    HEAD_MAJOR: tl.constexpr, DQ: tl.constexpr,
):  # fmt: skip
    """One key tile of one kv head: dK, dV summed over the query tiles and the GQA group (with
    DQ, each pair's dS K added into the fp32 DQ_ACC too)."""
    bhk, b, hk, n_tile, row = _program(ORDER, Nt, PER_BATCH, HK, HEAD_MAJOR)
    offs_n = n_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_i = tl.arange(0, BLOCK_M)
    col_ok = offs_n < Sk
    b64 = b.to(tl.int64)
    k_base = K + b64 * stride_kb + hk.to(tl.int64) * stride_kh
    v_base = V + b64 * stride_vb + hk.to(tl.int64) * stride_vh
    k = tl.load(
        k_base + offs_n[:, None] * stride_ks + offs_d[None, :], mask=col_ok[:, None], other=0.0
    )
    v = tl.load(
        v_base + offs_n[:, None] * stride_vs + offs_d[None, :], mask=col_ok[:, None], other=0.0
    )
    kn = tl.load(KN + offs_n, mask=col_ok, other=0)
    kb = tl.load(KB + offs_n, mask=col_ok, other=0)
    kd = tl.load(KD + b64 * stride_kdb + offs_n, mask=col_ok, other=-2)

    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    n_full = tl.load(COUNT + row * 3)
    n_partial = tl.load(COUNT + row * 3 + 1)
    n_runs = tl.load(COUNT + row * 3 + 2)
    idx = IDX + row.to(tl.int64) * Mt
    runs = RUNS + row.to(tl.int64) * Mt * 2
    for g in range(0, GROUP):
        h = hk * GROUP + g
        q_base = Q + b64 * stride_qb + h.to(tl.int64) * stride_qh
        do_base = DO + b64 * stride_dob + h.to(tl.int64) * stride_doh
        q_desc = _head_desc(q_base, Sq, stride_qs, A_TMA, TMA, BLOCK_M, HEAD_DIM)
        do_desc = _head_desc(do_base, Sq, stride_dos, B_TMA, TMA, BLOCK_M, HEAD_DIM)
        stat = (b64 * H + h) * Sq
        dq_base = DQ_ACC + b64 * stride_dqab + h.to(tl.int64) * stride_dqah
        if RUN_LOOPS:
            for r in range(0, n_runs):
                t0 = tl.load(runs + 2 * r) * BLOCK_M
                t1 = t0 + tl.load(runs + 2 * r + 1) * BLOCK_M
                if PIPE:
                    for m0 in tl.range(t0, t1, BLOCK_M, num_stages=STAGES, warp_specialize=WS):
                        dk, dv = _dkdv_full_tile(
                            k, v, dk, dv, q_base, do_base, q_desc, do_desc, b, h,
                            tl.multiple_of(m0, BLOCK_M), offs_i, offs_d, stride_qs, stride_dos,
                            LSE2, DELTA, stat, qk_scale, dq_base, stride_dqas,
                            TMA, BLOCK_M, HEAD_DIM, DQ,
                        )  # fmt: skip
                else:
                    for m0 in range(t0, t1, BLOCK_M):
                        dk, dv = _dkdv_full_tile(
                            k, v, dk, dv, q_base, do_base, q_desc, do_desc, b, h,
                            tl.multiple_of(m0, BLOCK_M), offs_i, offs_d, stride_qs, stride_dos,
                            LSE2, DELTA, stat, qk_scale, dq_base, stride_dqas,
                            TMA, BLOCK_M, HEAD_DIM, DQ,
                        )  # fmt: skip
        elif PIPE:
            for i in tl.range(0, n_full, num_stages=STAGES, warp_specialize=WS):
                dk, dv = _dkdv_full_tile(
                    k, v, dk, dv, q_base, do_base, q_desc, do_desc, b, h,
                    tl.load(idx + i) * BLOCK_M, offs_i, offs_d, stride_qs, stride_dos,
                    LSE2, DELTA, stat, qk_scale, dq_base, stride_dqas,
                    TMA, BLOCK_M, HEAD_DIM, DQ,
                )  # fmt: skip
        else:
            for i in range(0, n_full):
                dk, dv = _dkdv_full_tile(
                    k, v, dk, dv, q_base, do_base, q_desc, do_desc, b, h,
                    tl.load(idx + i) * BLOCK_M, offs_i, offs_d, stride_qs, stride_dos,
                    LSE2, DELTA, stat, qk_scale, dq_base, stride_dqas,
                    TMA, BLOCK_M, HEAD_DIM, DQ,
                )  # fmt: skip
        for i in tl.range(n_full, n_full + n_partial, num_stages=STAGES if PIPE else None):
            offs_m = tl.load(idx + i) * BLOCK_M + offs_i
            row_ok = offs_m < Sq
            q = tl.load(
                q_base + offs_m[:, None] * stride_qs + offs_d[None, :],
                mask=row_ok[:, None],
                other=0.0,
            )
            do = tl.load(
                do_base + offs_m[:, None] * stride_dos + offs_d[None, :],
                mask=row_ok[:, None],
                other=0.0,
            )
            lse2 = tl.load(LSE2 + stat + offs_m, mask=row_ok, other=float("inf"))
            delta = tl.load(DELTA + stat + offs_m, mask=row_ok, other=0.0)
            qn = tl.load(QN + offs_m, mask=row_ok, other=0)
            qb = tl.load(QB + offs_m, mask=row_ok, other=-1)
            qd = tl.load(QD + b64 * stride_qdb + offs_m, mask=row_ok, other=-1)
            visible = _visible(
                qn[None, :], qb[None, :], qd[None, :], kn[:, None], kb[:, None], kd[:, None]
            )
            visible = visible & col_ok[:, None] & row_ok[None, :]
            s_t = tl.dot(k, tl.trans(q)) * qk_scale
            p_t = tl.where(visible, tl.math.exp2(s_t - lse2[None, :]), 0.0)
            dv = tl.dot(p_t.to(do.dtype), do, dv)
            dp_t = tl.dot(v, tl.trans(do))
            ds_t = (p_t * (dp_t - delta[None, :])).to(q.dtype)
            dk = tl.dot(ds_t, q, dk)
            if DQ:
                dq = tl.dot(tl.trans(ds_t), k)
                tl.atomic_add(
                    dq_base + offs_m[:, None] * stride_dqas + offs_d[None, :],
                    dq,
                    mask=row_ok[:, None],
                    sem="relaxed",
                )

    dk_base = DK + b64 * stride_dkb + hk.to(tl.int64) * stride_dkh
    dv_base = DV + b64 * stride_dkb + hk.to(tl.int64) * stride_dkh
    tl.store(
        dk_base + offs_n[:, None] * stride_dks + offs_d[None, :],
        (dk * sm_scale).to(DK.dtype.element_ty),
        mask=col_ok[:, None],
    )
    tl.store(
        dv_base + offs_n[:, None] * stride_dks + offs_d[None, :],
        dv.to(DV.dtype.element_ty),
        mask=col_ok[:, None],
    )


@triton.jit
def _dq_full_tile(q, do, dq, lse2, delta, k_base, v_base, k_desc, v_desc, b, hk, n0, offs_j,
                  offs_d, stride_ks, stride_vs, qk_scale,
                  TMA: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):  # fmt: skip
    """dQ of one full (query tile, key tile): every pair allowed, no bounds checks."""
    k = _rows(k_base, stride_ks, k_desc, b, hk, n0, offs_j, offs_d, TMA, BLOCK_N, HEAD_DIM)
    v = _rows(v_base, stride_vs, v_desc, b, hk, n0, offs_j, offs_d, TMA, BLOCK_N, HEAD_DIM)
    s = tl.dot(q, tl.trans(k)) * qk_scale
    p = tl.math.exp2(s - lse2[:, None])
    dp = tl.dot(do, tl.trans(v))
    ds = p * (dp - delta[:, None])
    return tl.dot(ds.to(k.dtype), k, dq)


@triton.jit(do_not_specialize=_SIZES)
def _bwd_dq_kernel(
    Q, K, V, DO, DQ, LSE2, DELTA, A_TMA, B_TMA,
    QN, QB, QD, KN, KB, KD,
    ORDER, IDX, COUNT, RUNS,
    qk_scale, sm_scale,
    stride_qb, stride_qh, stride_qs,
    stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs,
    stride_dob, stride_doh, stride_dos,
    stride_dqb, stride_dqh, stride_dqs,
    stride_qdb, stride_kdb,
    H, GROUP, Sq, Sk, Mt, Nt, PER_BATCH,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TMA: tl.constexpr,
    PIPE: tl.constexpr, STAGES: tl.constexpr, WS: tl.constexpr, RUN_LOOPS: tl.constexpr,
    HEAD_MAJOR: tl.constexpr,
):  # fmt: skip
    """One query tile of one head: dQ over its key tiles."""
    bh, b, h, m_tile, row = _program(ORDER, Mt, PER_BATCH, H, HEAD_MAJOR)
    hk = h // GROUP
    offs_m = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_j = tl.arange(0, BLOCK_N)
    row_ok = offs_m < Sq
    b64 = b.to(tl.int64)
    q_base = Q + b64 * stride_qb + h.to(tl.int64) * stride_qh
    do_base = DO + b64 * stride_dob + h.to(tl.int64) * stride_doh
    k_base = K + b64 * stride_kb + hk.to(tl.int64) * stride_kh
    v_base = V + b64 * stride_vb + hk.to(tl.int64) * stride_vh
    k_desc = _head_desc(k_base, Sk, stride_ks, A_TMA, TMA, BLOCK_N, HEAD_DIM)
    v_desc = _head_desc(v_base, Sk, stride_vs, B_TMA, TMA, BLOCK_N, HEAD_DIM)
    q = tl.load(
        q_base + offs_m[:, None] * stride_qs + offs_d[None, :], mask=row_ok[:, None], other=0.0
    )
    do = tl.load(
        do_base + offs_m[:, None] * stride_dos + offs_d[None, :], mask=row_ok[:, None], other=0.0
    )
    stat = bh.to(tl.int64) * Sq
    lse2 = tl.load(LSE2 + stat + offs_m, mask=row_ok, other=float("inf"))
    delta = tl.load(DELTA + stat + offs_m, mask=row_ok, other=0.0)

    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    n_full = tl.load(COUNT + row * 3)
    n_partial = tl.load(COUNT + row * 3 + 1)
    idx = IDX + row.to(tl.int64) * Nt
    if RUN_LOOPS:
        runs = RUNS + row.to(tl.int64) * Nt * 2
        for r in range(0, tl.load(COUNT + row * 3 + 2)):
            t0 = tl.load(runs + 2 * r) * BLOCK_N
            t1 = t0 + tl.load(runs + 2 * r + 1) * BLOCK_N
            if PIPE:
                for n0 in tl.range(t0, t1, BLOCK_N, num_stages=STAGES, warp_specialize=WS):
                    dq = _dq_full_tile(
                        q, do, dq, lse2, delta, k_base, v_base, k_desc, v_desc, b, hk,
                        tl.multiple_of(n0, BLOCK_N), offs_j, offs_d, stride_ks, stride_vs,
                        qk_scale, TMA, BLOCK_N, HEAD_DIM,
                    )  # fmt: skip
            else:
                for n0 in range(t0, t1, BLOCK_N):
                    dq = _dq_full_tile(
                        q, do, dq, lse2, delta, k_base, v_base, k_desc, v_desc, b, hk,
                        tl.multiple_of(n0, BLOCK_N), offs_j, offs_d, stride_ks, stride_vs,
                        qk_scale, TMA, BLOCK_N, HEAD_DIM,
                    )  # fmt: skip
    elif PIPE:
        for i in tl.range(0, n_full, num_stages=STAGES, warp_specialize=WS):
            dq = _dq_full_tile(
                q, do, dq, lse2, delta, k_base, v_base, k_desc, v_desc, b, hk,
                tl.load(idx + i) * BLOCK_N, offs_j, offs_d, stride_ks, stride_vs,
                qk_scale, TMA, BLOCK_N, HEAD_DIM,
            )  # fmt: skip
    else:
        for i in range(0, n_full):
            dq = _dq_full_tile(
                q, do, dq, lse2, delta, k_base, v_base, k_desc, v_desc, b, hk,
                tl.load(idx + i) * BLOCK_N, offs_j, offs_d, stride_ks, stride_vs,
                qk_scale, TMA, BLOCK_N, HEAD_DIM,
            )  # fmt: skip
    qn = tl.load(QN + offs_m, mask=row_ok, other=0)
    qb = tl.load(QB + offs_m, mask=row_ok, other=-1)
    qd = tl.load(QD + b64 * stride_qdb + offs_m, mask=row_ok, other=-1)
    for i in tl.range(n_full, n_full + n_partial, num_stages=STAGES if PIPE else None):
        offs_n = tl.load(idx + i) * BLOCK_N + offs_j
        col_ok = offs_n < Sk
        k = tl.load(
            k_base + offs_n[:, None] * stride_ks + offs_d[None, :], mask=col_ok[:, None], other=0.0
        )
        v = tl.load(
            v_base + offs_n[:, None] * stride_vs + offs_d[None, :], mask=col_ok[:, None], other=0.0
        )
        kn = tl.load(KN + offs_n, mask=col_ok, other=0)
        kb = tl.load(KB + offs_n, mask=col_ok, other=0)
        kd = tl.load(KD + b64 * stride_kdb + offs_n, mask=col_ok, other=-2)
        visible = _visible(
            qn[:, None], qb[:, None], qd[:, None], kn[None, :], kb[None, :], kd[None, :]
        )
        visible = visible & col_ok[None, :] & row_ok[:, None]
        s = tl.dot(q, tl.trans(k)) * qk_scale
        p = tl.where(visible, tl.math.exp2(s - lse2[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq)

    dq_base = DQ + b64 * stride_dqb + h.to(tl.int64) * stride_dqh
    tl.store(
        dq_base + offs_m[:, None] * stride_dqs + offs_d[None, :],
        (dq * sm_scale).to(DQ.dtype.element_ty),
        mask=row_ok[:, None],
    )


# --- dK/dV in Gluon (sm90; config.dkdv_gluon) ----------------------------------------------
# The `tl` dK/dV kernel above stays near 320 useful TFLOP/s on the H200 in every tile, pipeline
# and load Triton's `tl` offers. Gluon (Triton's lower-level language, 3.6+) writes the
# FlashAttention-3 structure by hand: one producer warp streams each key tile's Q and dO tiles
# through a ring of shared-memory stages (TMA, mbarriers); two consumer warpgroups (240
# registers each) keep K and V in shared memory and dK, dV in registers, issue dP^T right
# behind S^T (the tensor cores compute it while the warps exponentiate S^T) and hand P^T and
# dS^T to the dV and dK wgmmas in registers (S^T's accumulator layout is the A operand's). On
# the H200 at 2L 16K: dK, dV bit for bit the `tl` kernel's at 1.12-1.13x its speed
# (docs/benchmarks.md, session 16). No interpreter runs Gluon: off the GPU only its sm90 compile
# is checked (ci/triton_sm90_compile.py).
try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    # Triton 3.9 renamed the TMA load (the old name raises there) and the CTA barrier; 3.6 has
    # only the old names
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    _cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier
    # the kernels are written against Gluon's Hopper API as of 3.6 (earlier ones differ)
    HAS_GLUON = tuple(int(x) for x in triton.__version__.split(".")[:2]) >= (3, 6)
except (ImportError, ValueError):  # a Triton without Gluon: dkdv_gluon is refused at launch
    HAS_GLUON = False

# How the Gluon kernels find a head's rows in a tensor read as a matrix (`_tma_rows`): values
# that follow the layout, not the shape's divisibility, so one compiled kernel serves both
_ROW_LAYOUT = ["rows_qb", "rows_qh", "cols_qh", "rows_kb", "rows_kh", "cols_kh"]
# (query rows, key rows, consumer warps) of the Gluon dK/dV tile: each consumer warpgroup's
# wgmmas take 64 key rows
GLUON_DKDV_TILE = (64, 128, 8)
# (query rows, key rows, consumer warps) of the Gluon dQ tile: each warpgroup's 64 query rows
GLUON_DQ_TILE = (128, 64, 8)

if HAS_GLUON:

    @gluon.jit
    def _gluon_visible(qn, qb, qd, kn, kb, kd):
        """`_visible` in Gluon, on metadata already broadcast against each other (noisy flags as
        booleans)."""
        noisy_noisy = qn & kn & (qb == kb)
        noisy_clean = qn & ~kn & (kb < qb)
        clean_clean = ~qn & ~kn & (kb <= qb)
        return (noisy_noisy | noisy_clean | clean_clean) & (qd == kd)

    @gluon.jit
    def _gluon_dkdv_loads(q_desc, do_desc, lse_desc, delta_desc, q_s, do_s, lse_s, delta_s,
                          ready, empty, IDX, COUNT, row, Mt, hk, GROUP, q_row0, rows_qh, cols_qh,
                          stat0, BM: gl.constexpr, STAGES: gl.constexpr):  # fmt: skip
        """The producer warp: every (head, query tile) of the key tile, full tiles first, in
        the consumers' order, into stage `it % STAGES` once the consumers released it: Q and dO
        (rows as `_tma_rows` lays them out: head h's start at row q_row0 + h * rows_qh, column
        h * cols_qh) and the rows' lse2 and delta (head h's in row stat0 + h of the statistics'
        matrices, `_stat_rows`), so that the consumers' tile loop reads no global memory."""
        n_tiles = gl.load(COUNT + row * 3) + gl.load(COUNT + row * 3 + 1)
        idx = IDX + row.to(gl.int64) * Mt
        it = 0
        nbytes: gl.constexpr = 2 * q_desc.block_type.nbytes + 2 * lse_desc.block_type.nbytes
        for g in range(0, GROUP):
            first = q_row0 + (hk * GROUP + g) * rows_qh
            col = (hk * GROUP + g) * cols_qh
            for j in range(0, n_tiles):
                m0 = gl.load(idx + j) * BM
                s = it % STAGES
                mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
                mbarrier.expect(ready.index(s), nbytes)
                _tma_load(q_desc, [first + m0, col], ready.index(s), q_s.index(s))
                _tma_load(do_desc, [first + m0, col], ready.index(s), do_s.index(s))
                _tma_load(lse_desc, [stat0 + g, m0], ready.index(s), lse_s.index(s))
                _tma_load(delta_desc, [stat0 + g, m0], ready.index(s), delta_s.index(s))
                it += 1

    @gluon.jit
    def _gluon_dkdv_tile(dk, dv, k_s, v_s, q, do, lse_st, delta_st, ds_s, dq_s, DQ_ACC, QN, QB, QD,
                         stat, m0, b, Sq, stride_qdb, kn, kb, kd, krow_ok, qk_scale,
                         BN: gl.constexpr, BM: gl.constexpr, D: gl.constexpr,
                         WARPS: gl.constexpr, MASKED: gl.constexpr,
                         DQ: gl.constexpr):  # fmt: skip
        """One (query tile, key tile) pair: dK and dV of the consumers' BN keys, updated; with
        DQ this pair's dQ = dS K too, added into DQ_ACC (fp32, unscaled) with atomics: dS^T
        goes through shared memory (the A operand of dQ's wgmma is its transpose, over both
        warpgroups' keys), the two warpgroups split dQ's head dim."""
        mma_s: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, BM, 16]
        )
        mma_d: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, D, 16]
        )
        a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_d, k_width=2)
        offs = m0 + gl.arange(0, BM, layout=gl.SliceLayout(0, mma_s))
        zero = gl.zeros([BN, BM], gl.float32, mma_s)  # shape and layout only (use_acc=False)
        s_t = warpgroup_mma(k_s, q.permute((1, 0)), zero, use_acc=False, is_async=True)
        dp_t = warpgroup_mma(v_s, do.permute((1, 0)), zero, use_acc=False, is_async=True)
        # the rows' statistics, from the stage (rows past Sq arrive as zeros: their P^T is
        # masked to 0 below, so dS^T too)
        lse2 = lse_st.reshape([BM]).load(gl.SliceLayout(0, mma_s))
        s_t = warpgroup_mma_wait(1, deps=[s_t])  # groups complete in issue order: S^T, not dP^T
        p_t = gl.exp2(s_t * qk_scale - lse2[None, :])
        if MASKED:
            q_ok = offs < Sq
            qn = gl.load(QN + offs, mask=q_ok, other=0) != 0
            qb = gl.load(QB + offs, mask=q_ok, other=-1)
            qd = gl.load(QD + b * stride_qdb + offs, mask=q_ok, other=-1)
            visible = _gluon_visible(
                qn[None, :], qb[None, :], qd[None, :], kn[:, None], kb[:, None], kd[:, None]
            )
            visible = visible & q_ok[None, :] & krow_ok[:, None]
            p_t = gl.where(visible, p_t, 0.0)
        p_op = gl.convert_layout(p_t.to(q.dtype), a_op)
        dv = warpgroup_mma(p_op, do, dv, is_async=True)
        dp_t, p_op = warpgroup_mma_wait(1, deps=[dp_t, p_op])  # dP^T done; dV may still run
        # delta read only now: with lse2 it would hold 16 more registers through the exponentials
        delta = delta_st.reshape([BM]).load(gl.SliceLayout(0, mma_s))
        ds_t = (p_t * (dp_t - delta[None, :])).to(q.dtype)
        ds_op = gl.convert_layout(ds_t, a_op)
        dk = warpgroup_mma(ds_op, q, dk, is_async=True)
        if DQ:
            ds_s.store(ds_t)  # while dK's and dV's wgmmas run
            # their operands and P^T, dP^T die here: dQ's accumulator takes their registers
            dv, dk, p_op, ds_op = warpgroup_mma_wait(0, deps=[dv, dk, p_op, ds_op])
            fence_async_shared()
            _cta_barrier()  # every key row of dS^T is in shared memory
            # dQ of D = 128 in two halves of 64 columns (one 128-byte swizzle atom each): half
            # the accumulator registers at a time (at once its loop spilled 119 instructions,
            # in halves 44; D = 64 spills nothing at once)
            PARTS: gl.constexpr = D // 64
            mma_q: gl.constexpr = gl.NVMMADistributedLayout(
                version=[3, 0], warps_per_cta=[4, WARPS // 4], instr_shape=[16, 64 // 2, 16]
            )
            zero_q = gl.zeros([BM, 64], gl.float32, mma_q)
            for h in gl.static_range(PARTS):
                part = warpgroup_mma(
                    ds_s.permute((1, 0)), k_s.slice(h * 64, 64, dim=1), zero_q, use_acc=False
                )
                dq_s.slice(h * 64, 64, dim=1).store(part)
            _cta_barrier()  # dQ whole in shared memory; dS^T read by both warpgroups
            # added a slice of rows at a time: a pointer per element of the whole tile would
            # hold 64 registers a thread (they spilled). The layout covers exactly D columns
            # (a wider one would repeat elements across threads: each added twice)
            rows_l: gl.constexpr = gl.BlockedLayout(
                [1, 4], [32 // (D // 4), D // 4], [WARPS, 1], [1, 0]
            )
            for c in gl.static_range(BM // (2 * WARPS)):
                rows_dq = dq_s.slice(c * 2 * WARPS, 2 * WARPS, dim=0).load(rows_l)
                rows = m0 + c * 2 * WARPS + gl.arange(0, 2 * WARPS, gl.SliceLayout(1, rows_l))
                cols = gl.arange(0, D, layout=gl.SliceLayout(0, rows_l))
                at = DQ_ACC + (stat + rows).to(gl.int64)[:, None] * D + cols[None, :]
                if MASKED:
                    gl.atomic_add(at, rows_dq, mask=(rows < Sq)[:, None], sem="relaxed")
                else:
                    gl.atomic_add(at, rows_dq, sem="relaxed")
        else:
            dv, dk, p_op, ds_op = warpgroup_mma_wait(0, deps=[dv, dk, p_op, ds_op])
        return dk, dv

    @gluon.jit
    def _gluon_dkdv_math(DK, DV, DQ_ACC, QN, QB, QD, KN, KB, KD, k_s, v_s, q_s, do_s, lse_s,
                         delta_s, ds_s, dq_s, ready, empty, IDX, COUNT, row, Mt, b, hk, n0, H, HK,
                         GROUP, Sq, Sk, stride_qdb, stride_kdb, qk_scale, sm_scale,
                         BN: gl.constexpr, BM: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr,
                         WARPS: gl.constexpr, DQ: gl.constexpr):  # fmt: skip
        """The consumer warpgroups: dK, dV of the key tile over its query tiles and the group's
        heads (the producer's order), then stored."""
        mma_s: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, BM, 16]
        )
        mma_d: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, D, 16]
        )
        krows = n0 + gl.arange(0, BN, layout=gl.SliceLayout(1, mma_s))
        krow_ok = krows < Sk
        kn = gl.load(KN + krows, mask=krow_ok, other=0) != 0
        kb = gl.load(KB + krows, mask=krow_ok, other=0)
        kd = gl.load(KD + b * stride_kdb + krows, mask=krow_ok, other=-2)
        dk = gl.zeros([BN, D], gl.float32, mma_d)
        dv = gl.zeros([BN, D], gl.float32, mma_d)
        n_full = gl.load(COUNT + row * 3)
        n_partial = gl.load(COUNT + row * 3 + 1)
        idx = IDX + row.to(gl.int64) * Mt
        it = 0
        for g in range(0, GROUP):
            stat = (b * H + hk * GROUP + g) * Sq
            for j in range(0, n_full):
                s = it % STAGES
                mbarrier.wait(ready.index(s), (it // STAGES) & 1)
                dk, dv = _gluon_dkdv_tile(
                    dk, dv, k_s, v_s, q_s.index(s), do_s.index(s), lse_s.index(s),
                    delta_s.index(s), ds_s, dq_s, DQ_ACC, QN, QB, QD, stat,
                    gl.load(idx + j) * BM, b, Sq, stride_qdb, kn, kb, kd,
                    krow_ok, qk_scale, BN, BM, D, WARPS, False, DQ,
                )  # fmt: skip
                mbarrier.arrive(empty.index(s), count=1)
                it += 1
            for j in range(n_full, n_full + n_partial):
                s = it % STAGES
                mbarrier.wait(ready.index(s), (it // STAGES) & 1)
                dk, dv = _gluon_dkdv_tile(
                    dk, dv, k_s, v_s, q_s.index(s), do_s.index(s), lse_s.index(s),
                    delta_s.index(s), ds_s, dq_s, DQ_ACC, QN, QB, QD, stat,
                    gl.load(idx + j) * BM, b, Sq, stride_qdb, kn, kb, kd,
                    krow_ok, qk_scale, BN, BM, D, WARPS, True, DQ,
                )  # fmt: skip
                mbarrier.arrive(empty.index(s), count=1)
                it += 1
        rows = n0 + gl.arange(0, BN, layout=gl.SliceLayout(1, mma_d))
        cols = gl.arange(0, D, layout=gl.SliceLayout(0, mma_d))
        at = ((b * HK + hk) * Sk + rows).to(gl.int64)[:, None] * D + cols[None, :]
        ok = (rows < Sk)[:, None]
        gl.store(DK + at, (dk * sm_scale).to(DK.dtype.element_ty), mask=ok)
        gl.store(DV + at, dv.to(DV.dtype.element_ty), mask=ok)

    @gluon.jit(
        do_not_specialize=["H", "HK", "GROUP", "Mt", "Nt", "PER_BATCH", "CHUNK", *_ROW_LAYOUT]
    )
    def _gluon_dkdv_kernel(Q, K, V, DO, DK, DV, LSE2, DELTA, DQ_ACC, QN, QB, QD, KN, KB, KD,
                           ORDER, IDX, COUNT, qk_scale, sm_scale, H, HK, GROUP, Sq, Sk, Mt, Nt,
                           PER_BATCH, ROWS_Q, ROWS_K, stride_qdb, stride_kdb, stride_qs,
                           rows_qb, rows_qh, cols_qh, stride_ks, rows_kb, rows_kh, cols_kh,
                           stride_stat, BN: gl.constexpr,
                           BM: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr,
                           WARPS: gl.constexpr, DQ: gl.constexpr,
                           SPLIT: gl.constexpr = False, CHUNK=1):  # fmt: skip
        """One key tile of one KV head (grid: key tiles * batch * KV heads). Q and dO read
        through TMA descriptors as rows of `stride_qs` elements (`_tma_rows`: rows_qb rows a
        batch, rows_qh a head, head h's D columns from h * cols_qh), K and V likewise (the
        `_k*` ones); dK and dV contiguous (B, KV heads, Sk, D). With DQ, DQ_ACC (fp32,
        contiguous (B, H, Sq, D), zeroed) gets every tile pair's unscaled dS K added.
        Launch order (a 1-D grid of Nt * B * KV heads programs): ORDER lists the key tiles
        heaviest first, taken CHUNK at a time; each chunk runs for every (batch, KV head) in
        turn. CHUNK = Nt runs head by head (the programs running together share Q and dO in
        L2); CHUNK = 1 every head's heaviest tile first (no long program left for the last
        wave); `dkdv_chunk` picks between them."""
        bhs = gl.num_programs(0) // Nt
        p = gl.program_id(0)
        start = (p // (CHUNK * bhs)) * CHUNK
        size = gl.minimum(CHUNK, Nt - start)
        rest = p - start * bhs
        bh = rest // size
        pid = start + rest % size
        b = bh // HK
        hk = bh % HK
        lb = b * PER_BATCH  # 0: one schedule (one document per row) serves every batch row
        n_tile = gl.load(ORDER + lb * Nt + pid)
        row = lb * Nt + n_tile  # the key tile's row of the op's tile lists
        n0 = n_tile * BN
        smem: gl.constexpr = gl.NVMMASharedLayout(
            swizzle_byte_width=128, element_bitwidth=16, rank=2
        )
        q_desc = tma.make_tensor_descriptor(Q, [ROWS_Q, stride_qs], [stride_qs, 1], [BM, D], smem)
        do_desc = tma.make_tensor_descriptor(DO, [ROWS_Q, stride_qs], [stride_qs, 1], [BM, D], smem)
        k_desc = tma.make_tensor_descriptor(K, [ROWS_K, stride_ks], [stride_ks, 1], [BN, D], smem)
        v_desc = tma.make_tensor_descriptor(V, [ROWS_K, stride_ks], [stride_ks, 1], [BN, D], smem)
        k_s = gl.allocate_shared_memory(Q.dtype.element_ty, [BN, D], smem)
        v_s = gl.allocate_shared_memory(Q.dtype.element_ty, [BN, D], smem)
        q_s = gl.allocate_shared_memory(Q.dtype.element_ty, [STAGES, BM, D], smem)
        do_s = gl.allocate_shared_memory(Q.dtype.element_ty, [STAGES, BM, D], smem)
        # the query rows' lse2 and delta with each stage's Q and dO: (B * H, Sq) float32 rows
        # `stride_stat` apart (`_stat_rows`), one row's BM columns a box
        stats: gl.constexpr = gl.NVMMASharedLayout(
            swizzle_byte_width=0, element_bitwidth=32, rank=2
        )
        n_rows = (bhs // HK) * H
        lse_desc = tma.make_tensor_descriptor(LSE2, [n_rows, Sq], [stride_stat, 1], [1, BM], stats)
        delta_desc = tma.make_tensor_descriptor(
            DELTA, [n_rows, Sq], [stride_stat, 1], [1, BM], stats
        )
        lse_s = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BM], stats)
        delta_s = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BM], stats)
        ds_s = gl.allocate_shared_memory(Q.dtype.element_ty, [BN if DQ else 16, BM], smem)
        plain: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        dq_s = gl.allocate_shared_memory(gl.float32, [BM if DQ else 1, D if DQ else 4], plain)
        kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(kv_bar, count=1)
        for s in gl.static_range(STAGES):
            mbarrier.init(ready.index(s), count=1)
            mbarrier.init(empty.index(s), count=1 + SPLIT)
        fence_async_shared()
        # K and V of this key tile, once (rows past the tensor's end arrive as zeros; rows of
        # the next head or batch past Sk are masked out of P and the stores)
        mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        key0 = b * rows_kb + hk * rows_kh + n0
        _tma_load(k_desc, [key0, hk * cols_kh], kv_bar, k_s)
        _tma_load(v_desc, [key0, hk * cols_kh], kv_bar, v_s)
        mbarrier.wait(kv_bar, 0)
        loads = (q_desc, do_desc, lse_desc, delta_desc, q_s, do_s, lse_s, delta_s, ready, empty,
                 IDX, COUNT, row, Mt, hk, GROUP, b * rows_qb, rows_qh, cols_qh,
                 b * H + hk * GROUP, BM, STAGES)  # fmt: skip
        if SPLIT:
            HALF: gl.constexpr = BN // 2
            gl.warp_specialize(
                [(_gluon_dkdv_math, (DK, DV, DQ_ACC, QN, QB, QD, KN, KB, KD,
                                     k_s.slice(0, HALF, dim=0), v_s.slice(0, HALF, dim=0), q_s,
                                     do_s, lse_s, delta_s, ds_s, dq_s, ready, empty, IDX, COUNT,
                                     row, Mt, b, hk, n0, H, HK, GROUP, Sq, Sk, stride_qdb,
                                     stride_kdb, qk_scale, sm_scale, HALF, BM, D, STAGES,
                                     WARPS // 2, False)),
                 (_gluon_dkdv_math, (DK, DV, DQ_ACC, QN, QB, QD, KN, KB, KD,
                                     k_s.slice(HALF, HALF, dim=0), v_s.slice(HALF, HALF, dim=0),
                                     q_s, do_s, lse_s, delta_s, ds_s, dq_s, ready, empty, IDX,
                                     COUNT, row, Mt, b, hk, n0 + HALF, H, HK, GROUP, Sq, Sk,
                                     stride_qdb, stride_kdb, qk_scale, sm_scale, HALF, BM, D,
                                     STAGES, WARPS // 2, False)),
                 (_gluon_dkdv_loads, loads)],
                [WARPS // 2, 1],
                [240, 24],
            )  # fmt: skip
        else:
            gl.warp_specialize(
                [(_gluon_dkdv_math, (DK, DV, DQ_ACC, QN, QB, QD, KN, KB, KD, k_s, v_s, q_s, do_s,
                                     lse_s, delta_s, ds_s, dq_s, ready, empty, IDX, COUNT, row,
                                     Mt, b, hk, n0, H, HK, GROUP, Sq, Sk, stride_qdb, stride_kdb,
                                     qk_scale, sm_scale, BN, BM, D, STAGES, WARPS, DQ)),
                 (_gluon_dkdv_loads, loads)],
                [1],
                [24],
            )  # fmt: skip

    @gluon.jit
    def _gluon_kv_loads(k_desc, v_desc, k_s, v_s, ready, empty, IDX, COUNT, row, Nt, key0,
                        col, BN: gl.constexpr, STAGES: gl.constexpr):  # fmt: skip
        """The producer warp of a query tile's kernel (dQ; the forward prototype): K and V of
        its key tiles (the KV head's rows from `key0`, its columns from `col`), full ones first
        (the consumers' order); stage `it % STAGES` once the consumers released it."""
        n_tiles = gl.load(COUNT + row * 3) + gl.load(COUNT + row * 3 + 1)
        idx = IDX + row.to(gl.int64) * Nt
        for it in range(0, n_tiles):
            n0 = gl.load(idx + it) * BN
            s = it % STAGES
            mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
            mbarrier.expect(ready.index(s), k_desc.block_type.nbytes + v_desc.block_type.nbytes)
            _tma_load(k_desc, [key0 + n0, col], ready.index(s), k_s.index(s))
            _tma_load(v_desc, [key0 + n0, col], ready.index(s), v_s.index(s))

    @gluon.jit
    def _gluon_dq_tile(q_s, do_s, k, v, dq, lse2, delta, KN, KB, KD, n0, b, Sk, stride_kdb,
                       qn, qb, qd, row_ok, qk_scale, BM: gl.constexpr, BN: gl.constexpr,
                       D: gl.constexpr, WARPS: gl.constexpr, MASKED: gl.constexpr):  # fmt: skip
        """One (query tile, key tile) pair: the consumers' dQ rows, updated. dP is issued right
        behind S (computed while the warps exponentiate S); dS goes to dQ's wgmma in registers."""
        mma_s: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, BN, 16]
        )
        mma_d: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, D, 16]
        )
        a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_d, k_width=2)
        zero = gl.zeros([BM, BN], gl.float32, mma_s)  # shape and layout only (use_acc=False)
        s_ = warpgroup_mma(q_s, k.permute((1, 0)), zero, use_acc=False, is_async=True)
        dp = warpgroup_mma(do_s, v.permute((1, 0)), zero, use_acc=False, is_async=True)
        s_ = warpgroup_mma_wait(1, deps=[s_])  # groups complete in issue order: S, not dP
        p = gl.exp2(s_ * qk_scale - lse2[:, None])  # lse2 = +inf for a row that sees nothing
        if MASKED:
            offs_n = n0 + gl.arange(0, BN, layout=gl.SliceLayout(0, mma_s))
            col_ok = offs_n < Sk
            kn = gl.load(KN + offs_n, mask=col_ok, other=0) != 0
            kb = gl.load(KB + offs_n, mask=col_ok, other=0)
            kd = gl.load(KD + b * stride_kdb + offs_n, mask=col_ok, other=-2)
            visible = _gluon_visible(
                qn[:, None], qb[:, None], qd[:, None], kn[None, :], kb[None, :], kd[None, :]
            )
            visible = visible & col_ok[None, :] & row_ok[:, None]
            p = gl.where(visible, p, 0.0)
        dp = warpgroup_mma_wait(0, deps=[dp])
        ds_op = gl.convert_layout((p * (dp - delta[:, None])).to(k.dtype), a_op)
        dq = warpgroup_mma(ds_op, k, dq, is_async=True)
        dq, ds_op = warpgroup_mma_wait(0, deps=[dq, ds_op])
        return dq

    @gluon.jit
    def _gluon_dq_math(DQ, LSE2, DELTA, QN, QB, QD, KN, KB, KD, q_s, do_s, k_s, v_s, q_bar,
                       ready, empty, IDX, COUNT, row, Nt, b, h, bh, m0, Sq, Sk, stride_qdb,
                       stride_kdb, stride_dqb, stride_dqh, stride_dqs, qk_scale, sm_scale,
                       BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr,
                       STAGES: gl.constexpr, WARPS: gl.constexpr):  # fmt: skip
        """The consumer warpgroups: dQ of the query tile over its key tiles, then stored."""
        mma_s: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, BN, 16]
        )
        mma_d: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, D, 16]
        )
        offs_m = m0 + gl.arange(0, BM, layout=gl.SliceLayout(1, mma_s))
        row_ok = offs_m < Sq
        stat = bh.to(gl.int64) * Sq
        lse2 = gl.load(LSE2 + stat + offs_m, mask=row_ok, other=float("inf"))
        delta = gl.load(DELTA + stat + offs_m, mask=row_ok, other=0.0)
        qn = gl.load(QN + offs_m, mask=row_ok, other=0) != 0
        qb = gl.load(QB + offs_m, mask=row_ok, other=-1)
        qd = gl.load(QD + b * stride_qdb + offs_m, mask=row_ok, other=-1)
        dq = gl.zeros([BM, D], gl.float32, mma_d)
        n_full = gl.load(COUNT + row * 3)
        n_partial = gl.load(COUNT + row * 3 + 1)
        idx = IDX + row.to(gl.int64) * Nt
        mbarrier.wait(q_bar, 0)
        for it in range(0, n_full):
            s = it % STAGES
            mbarrier.wait(ready.index(s), (it // STAGES) & 1)
            dq = _gluon_dq_tile(
                q_s, do_s, k_s.index(s), v_s.index(s), dq, lse2, delta, KN, KB, KD,
                gl.load(idx + it) * BN, b, Sk, stride_kdb, qn, qb, qd, row_ok, qk_scale,
                BM, BN, D, WARPS, False,
            )  # fmt: skip
            mbarrier.arrive(empty.index(s), count=1)
        for it in range(n_full, n_full + n_partial):
            s = it % STAGES
            mbarrier.wait(ready.index(s), (it // STAGES) & 1)
            dq = _gluon_dq_tile(
                q_s, do_s, k_s.index(s), v_s.index(s), dq, lse2, delta, KN, KB, KD,
                gl.load(idx + it) * BN, b, Sk, stride_kdb, qn, qb, qd, row_ok, qk_scale,
                BM, BN, D, WARPS, True,
            )  # fmt: skip
            mbarrier.arrive(empty.index(s), count=1)
        rows = m0 + gl.arange(0, BM, layout=gl.SliceLayout(1, mma_d))
        cols = gl.arange(0, D, layout=gl.SliceLayout(0, mma_d))
        base = b.to(gl.int64) * stride_dqb + h.to(gl.int64) * stride_dqh
        at = base + rows.to(gl.int64)[:, None] * stride_dqs + cols[None, :]
        gl.store(DQ + at, (dq * sm_scale).to(DQ.dtype.element_ty), mask=(rows < Sq)[:, None])

    @gluon.jit(do_not_specialize=["H", "GROUP", "HK", "Mt", "Nt", "PER_BATCH", *_ROW_LAYOUT])
    def _gluon_dq_kernel(Q, K, V, DO, DQ, LSE2, DELTA, QN, QB, QD, KN, KB, KD, ORDER, IDX, COUNT,
                         qk_scale, sm_scale, H, GROUP, HK, Sq, Sk, Mt, Nt, PER_BATCH, ROWS_Q,
                         ROWS_K, stride_qdb, stride_kdb, stride_dqb, stride_dqh, stride_dqs,
                         stride_qs, rows_qb, rows_qh, cols_qh, stride_ks, rows_kb, rows_kh,
                         cols_kh,
                         BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr,
                         STAGES: gl.constexpr, WARPS: gl.constexpr,
                         SPLIT: gl.constexpr = False):  # fmt: skip
        """One query tile of one head (grid: query tiles x batch * heads, the op's order:
        heaviest tiles first). Q, K, V, dO read through TMA descriptors as rows (`_tma_rows`,
        as in the dK/dV kernel); dQ stored with its own strides. SPLIT: each
        consumer warpgroup its own partition of 64 query rows (they meet at no barrier)."""
        bh = gl.program_id(1)
        b = bh // H
        h = bh % H
        hk = h // GROUP
        lb = b * PER_BATCH  # 0: one schedule (one document per row) serves every batch row
        m_tile = gl.load(ORDER + lb * Mt + gl.program_id(0))
        row = lb * Mt + m_tile  # the query tile's row of the op's tile lists
        m0 = m_tile * BM
        smem: gl.constexpr = gl.NVMMASharedLayout(
            swizzle_byte_width=128, element_bitwidth=16, rank=2
        )
        q_desc = tma.make_tensor_descriptor(Q, [ROWS_Q, stride_qs], [stride_qs, 1], [BM, D], smem)
        do_desc = tma.make_tensor_descriptor(DO, [ROWS_Q, stride_qs], [stride_qs, 1], [BM, D], smem)
        k_desc = tma.make_tensor_descriptor(K, [ROWS_K, stride_ks], [stride_ks, 1], [BN, D], smem)
        v_desc = tma.make_tensor_descriptor(V, [ROWS_K, stride_ks], [stride_ks, 1], [BN, D], smem)
        q_s = gl.allocate_shared_memory(Q.dtype.element_ty, [BM, D], smem)
        do_s = gl.allocate_shared_memory(Q.dtype.element_ty, [BM, D], smem)
        k_s = gl.allocate_shared_memory(Q.dtype.element_ty, [STAGES, BN, D], smem)
        v_s = gl.allocate_shared_memory(Q.dtype.element_ty, [STAGES, BN, D], smem)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for s in gl.static_range(STAGES):
            mbarrier.init(ready.index(s), count=1)
            mbarrier.init(empty.index(s), count=1 + SPLIT)  # SPLIT: each warpgroup arrives
        fence_async_shared()
        # Q and dO of the query tile, once (rows past the tensor's end arrive as zeros; rows of
        # the next head past Sq are masked out of P and the store)
        mbarrier.expect(q_bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes)
        _tma_load(q_desc, [b * rows_qb + h * rows_qh + m0, h * cols_qh], q_bar, q_s)
        _tma_load(do_desc, [b * rows_qb + h * rows_qh + m0, h * cols_qh], q_bar, do_s)
        key0 = b * rows_kb + hk * rows_kh  # this KV head's first row
        if SPLIT:
            HALF: gl.constexpr = BM // 2
            gl.warp_specialize(
                [(_gluon_dq_math, (DQ, LSE2, DELTA, QN, QB, QD, KN, KB, KD,
                                   q_s.slice(0, HALF, dim=0), do_s.slice(0, HALF, dim=0), k_s,
                                   v_s, q_bar, ready, empty, IDX, COUNT, row, Nt, b, h, bh, m0,
                                   Sq, Sk, stride_qdb, stride_kdb, stride_dqb, stride_dqh,
                                   stride_dqs, qk_scale, sm_scale, HALF, BN, D, STAGES,
                                   WARPS // 2)),
                 (_gluon_dq_math, (DQ, LSE2, DELTA, QN, QB, QD, KN, KB, KD,
                                   q_s.slice(HALF, HALF, dim=0), do_s.slice(HALF, HALF, dim=0),
                                   k_s, v_s, q_bar, ready, empty, IDX, COUNT, row, Nt, b, h, bh,
                                   m0 + HALF, Sq, Sk, stride_qdb, stride_kdb, stride_dqb,
                                   stride_dqh, stride_dqs, qk_scale, sm_scale, HALF, BN, D,
                                   STAGES, WARPS // 2)),
                 (_gluon_kv_loads, (k_desc, v_desc, k_s, v_s, ready, empty, IDX, COUNT, row,
                                    Nt, key0, hk * cols_kh, BN, STAGES))],
                [WARPS // 2, 1],
                [240, 24],
            )  # fmt: skip
        else:
            gl.warp_specialize(
                [(_gluon_dq_math, (DQ, LSE2, DELTA, QN, QB, QD, KN, KB, KD, q_s, do_s, k_s, v_s,
                                   q_bar, ready, empty, IDX, COUNT, row, Nt, b, h, bh, m0, Sq,
                                   Sk, stride_qdb, stride_kdb, stride_dqb, stride_dqh,
                                   stride_dqs, qk_scale, sm_scale, BM, BN, D, STAGES, WARPS)),
                 (_gluon_kv_loads, (k_desc, v_desc, k_s, v_s, ready, empty, IDX, COUNT, row,
                                    Nt, key0, hk * cols_kh, BN, STAGES))],
                [1],
                [24],
            )  # fmt: skip


# --- launchers -----------------------------------------------------------------------------
def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, schedule: Schedule) -> None:
    if q.dim() != 4 or k.shape != v.shape or k.dim() != 4:
        raise ValueError(f"q, k, v must be (B, H, S, D), got {q.shape}, {k.shape}, {v.shape}")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3] or q.shape[1] % k.shape[1]:
        raise ValueError(
            f"q {tuple(q.shape)} and k {tuple(k.shape)} do not fit (GQA needs Hq % Hkv == 0)"
        )
    if q.dtype not in (torch.bfloat16, torch.float16) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"block_diffusion_attention takes bf16/fp16 q, k, v, got {q.dtype}")
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("q, k, v must have a contiguous last dimension")
    qn, _, qd = schedule.q_meta
    kn, _, kd = schedule.k_meta
    if qn.numel() != q.shape[2] or kn.numel() != k.shape[2]:
        raise ValueError(
            f"schedule covers {qn.numel()} queries and {kn.numel()} keys, "
            f"got {q.shape[2]} and {k.shape[2]}"
        )
    if qd.shape[0] != kd.shape[0] or qd.shape[0] not in (1, q.shape[0]):
        raise ValueError(
            f"schedule doc ids cover {qd.shape[0]} and {kd.shape[0]} rows, the batch has "
            f"{q.shape[0]} (one row serves every batch row)"
        )


def _tma_fits(t: torch.Tensor) -> bool:
    """The bulk tensor copy engine wants 16-byte aligned base and strides."""
    size = t.element_size()
    return t.data_ptr() % 16 == 0 and all((st * size) % 16 == 0 for st in t.stride()[:-1])


def _uses_tma(wanted: int, *tensors: torch.Tensor) -> int:
    """The TMA mode a kernel runs: `wanted` where every tensor fits it, else 0 (pointers)."""
    return int(wanted) if wanted and all(_tma_fits(t) for t in tensors) else 0


def _tma_rows(t: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int, int, int]]:
    """`t` (B, H, S, D) as the Gluon kernels' TMA descriptors read it, a matrix of rows, and
    (row length, rows a batch, rows a head, columns a head) to find head h of batch b: its row
    s is row b * rows_b + h * rows_h + s, from column h * cols_h. A contiguous t is B * H * S
    rows of D; a (B, S, H, D)-contiguous one (a projection's output viewed per head and
    transposed, as the model hands q, k, v over) B * S rows of H * D, read in place. Any other
    layout is copied to the first."""
    batch, heads, seq, dim = t.shape
    if not t.is_contiguous() and t.transpose(1, 2).is_contiguous():
        return t, (heads * dim, seq, 0, dim)
    return t.contiguous(), (dim, heads * seq, seq, 0)


def _tma_pair(a: torch.Tensor, b: torch.Tensor):
    """(a, b, their `_tma_rows` layout): two tensors one set of coordinates reads (q and dO, k
    and v), both contiguous unless they share a layout."""
    (a, layout), (b, other) = _tma_rows(a), _tma_rows(b)
    if layout != other:
        (a, layout), b = _tma_rows(a.contiguous()), b.contiguous()
    return a, b, layout


def _stat_rows(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    """`t` (B, H, S) float32 as the Gluon dK/dV kernel's TMA reads it: B * H rows of S, and
    their stride. TMA wants rows 16-byte aligned: when S is not a multiple of 4 the rows are
    copied into a padded buffer (a few MB; training lengths are multiples of 16)."""
    rows = t.reshape(-1, t.shape[-1])
    if t.shape[-1] % 4 == 0:
        return rows, rows.stride(0)
    padded = rows.new_zeros(rows.shape[0], -(-t.shape[-1] // 4) * 4)
    padded[:, : t.shape[-1]] = rows
    return padded, padded.stride(0)


def _scratch(size: int, alignment: int, stream):
    """Global memory for device-side tensor descriptors (`triton.set_allocator`)."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _descriptors(mode: int, tensors, rows: int):
    """What the kernels take as A_TMA, B_TMA: host-side descriptors (mode 1, boxes of `rows` x
    D), else the tensors themselves (pointers, or mode 2, whose descriptors the kernel makes
    from them; it needs Triton's scratch allocator)."""
    if mode == 2:
        triton.set_allocator(_scratch)
    if mode != 1:
        return tuple(tensors)
    from triton.tools.tensor_descriptor import TensorDescriptor

    return tuple(
        TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, t.shape[-1]])
        for t in tensors
    )


def _doc_strides(schedule: Schedule) -> tuple[int, int]:
    """Batch strides of the doc ids: 0 when one row serves the whole batch."""
    qd, kd = schedule.q_meta[2], schedule.k_meta[2]
    return (qd.stride(0) if qd.shape[0] > 1 else 0), (kd.stride(0) if kd.shape[0] > 1 else 0)


def _launch(kernel: str, config: KernelConfig, tiles: int, programs: int, tma: int) -> dict:
    """Grid and compile-time options of `kernel` ('fwd', 'dkdv', 'dq') under `config`."""
    part = config.part(kernel)
    grid = (tiles, programs) if part["order"] else (programs, tiles)
    options = dict(
        TMA=tma, PIPE=part["pipe"] or part["ws"], STAGES=part["stages"], WS=part["ws"],
        RUN_LOOPS=part["runs"], HEAD_MAJOR=part["order"],
        num_warps=part["warps"], num_stages=part["stages"],
    )  # fmt: skip
    if kernel == "dkdv":
        options["DQ"] = part["dq"]
    return {"grid": grid, **options}


def forward(
    q, k, v, schedule: Schedule, scale: float | None = None, config: KernelConfig | None = None
):
    """(out, lse): out like q, lse (B, H, Sq) float32 natural log (-inf: saw no key)."""
    _check(q, k, v, schedule)
    batch, heads, sq, dim = q.shape
    kv_heads, sk = k.shape[1], k.shape[2]
    config = config or default_config(dim)
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    out = torch.empty_like(q)
    lse = torch.empty((batch, heads, sq), device=q.device, dtype=torch.float32)
    lists = schedule.by_query_tile(config.fwd_m, config.fwd_n)
    lists_rows, mt, nt = lists.index.shape
    qn, qb, qd = schedule.q_meta
    kn, kb, kd = schedule.k_meta
    tma = _uses_tma(config.fwd_tma, q, k, v)
    launch = _launch("fwd", config, mt, batch * heads, tma)
    _fwd_kernel[launch.pop("grid")](
        q, k, v, out, lse, *_descriptors(tma, (k, v), config.fwd_n),
        qn, qb, qd, kn, kb, kd,
        lists.order, lists.index, lists.count, lists.runs,
        scale * LOG2E,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        *_doc_strides(schedule),
        heads, heads // kv_heads, sq, sk, mt, nt, int(lists_rows > 1),
        HEAD_DIM=dim, BLOCK_M=config.fwd_m, BLOCK_N=config.fwd_n, **launch,
    )  # fmt: skip
    return out, lse


def backward_prepare(grad_out, grad_lse, q, out, lse):
    """(grad_out in q's dtype, delta, lse2): what the dK/dV and dQ kernels read."""
    batch, heads, sq, dim = q.shape
    grad_out = grad_out.to(q.dtype)  # the matmuls take it in q's dtype
    grad_out = grad_out if grad_out.stride(-1) == 1 else grad_out.contiguous()
    delta = torch.empty((batch, heads, sq), device=q.device, dtype=torch.float32)
    lse2 = torch.empty_like(delta)
    glse = grad_lse.float().contiguous() if grad_lse is not None else delta
    pre_block = 64
    _bwd_preprocess_kernel[(triton.cdiv(sq, pre_block), batch * heads)](
        out, grad_out, lse.contiguous(), glse, delta, lse2,
        out.stride(0), out.stride(1), out.stride(2),
        grad_out.stride(0), grad_out.stride(1), grad_out.stride(2),
        heads, sq,
        HEAD_DIM=dim, BLOCK=pre_block, HAS_GLSE=grad_lse is not None,
    )  # fmt: skip
    return grad_out, delta, lse2


def backward_dkdv(grad_out, delta, lse2, q, k, v, schedule: Schedule, scale: float,
                  config: KernelConfig, dq_acc: torch.Tensor | None = None):  # fmt: skip
    """(dk, dv), contiguous: one program per (kv head, key tile) over its query tiles. With
    `dq_acc` (fp32, zeroed, like q; config.dkdv_dq) the unscaled dQ is added into it too."""
    batch, heads, sq, dim = q.shape
    kv_heads, sk = k.shape[1], k.shape[2]
    qn, qb, qd = schedule.q_meta
    kn, kb, kd = schedule.k_meta
    dk = k.new_empty(k.shape)  # contiguous: dk and dv share strides in the kernel
    dv = v.new_empty(v.shape)
    cols = schedule.by_key_tile(config.dkdv_m, config.dkdv_n)
    lists_rows, nt, mt = cols.index.shape
    tma = _uses_tma(config.dkdv_tma, q, k, v, grad_out)
    launch = _launch("dkdv", config, nt, batch * kv_heads, tma)
    if (dq_acc is not None) != bool(config.dkdv_dq):
        raise ValueError("dq_acc is the buffer of config.dkdv_dq: pass it exactly when that is 1")
    if config.dkdv_split and not config.dkdv_gluon:
        raise ValueError("dkdv_split is a layout of the Gluon dK/dV kernel (dkdv_gluon: 1)")
    if config.dkdv_gluon:
        return _gluon_backward_dkdv(grad_out, delta, lse2, q, k, v, schedule, scale, config, dq_acc)
    acc = dq_acc if dq_acc is not None else delta.view(*delta.shape, 1)  # unused without DQ
    _bwd_dkdv_kernel[launch.pop("grid")](
        q, k, v, grad_out, dk, dv, lse2, delta,
        *_descriptors(tma, (q, grad_out), config.dkdv_m), acc,
        qn, qb, qd, kn, kb, kd,
        cols.order, cols.index, cols.count, cols.runs,
        scale * LOG2E, scale,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        grad_out.stride(0), grad_out.stride(1), grad_out.stride(2),
        dk.stride(0), dk.stride(1), dk.stride(2),
        acc.stride(0), acc.stride(1), acc.stride(2),
        *_doc_strides(schedule),
        heads, kv_heads, heads // kv_heads, sq, sk, mt, nt, int(lists_rows > 1),
        HEAD_DIM=dim, BLOCK_M=config.dkdv_m, BLOCK_N=config.dkdv_n, **launch,
    )  # fmt: skip
    return dk, dv


def _check_gluon(kernel: str, part: dict[str, int], tile: tuple[int, int, int], q) -> None:
    """Refuse, by name and before any launch, what `<kernel>_gluon` cannot run."""
    name = f"{kernel}_gluon"
    if not HAS_GLUON:
        raise ValueError(
            f"{name} needs Triton's Gluon (3.6 or later); this is {triton.__version__}"
        )
    if (part["m"], part["n"], part["warps"]) != tile:
        raise ValueError(
            f"{name} runs {tile[0]} x {tile[1]} tiles on {tile[2]} warps, the config asks "
            f"m={part['m']} n={part['n']} warps={part['warps']}"
        )
    if q.shape[-1] not in (64, 128):
        raise ValueError(f"{name} takes head dim 64 or 128, not {q.shape[-1]}")
    if q.device.type != "cuda" or torch.cuda.get_device_capability(q.device)[0] != 9:
        raise ValueError(f"{name} runs on sm90 GPUs (Hopper), not on {q.device}")


def dkdv_chunk(order: int, tiles: int, heads: int, sms: int) -> int:
    """Key tiles per chunk of the Gluon dK/dV launch (`dkdv_order`: 1 head by head, N > 1
    chunks of N). 0 chooses by the grid (H200 measurements in docs/benchmarks.md, session 26):
    head by head, the programs running together share Q and dO in L2, and a head whose tiles
    fill two waves starts its heaviest ones early enough (32K step: 0.8 % faster than chunks);
    with fewer tiles a head's heaviest would be left for the last wave, so every head's
    heaviest tile runs first (chunks of 1: the 8K step's backward 14 % faster), in chunks of 16
    on a grid 16 waves deep, which balance as well and share more (64K tokens a call: 2 %)."""
    if order == 1:
        return tiles
    if order > 1:
        return min(order, tiles)
    if tiles >= 2 * sms:
        return tiles
    return min(16, tiles) if tiles * heads >= 16 * sms else 1


def _gluon_backward_dkdv(grad_out, delta, lse2, q, k, v, schedule: Schedule, scale: float,
                         config: KernelConfig, dq_acc: torch.Tensor | None):  # fmt: skip
    """`backward_dkdv` by the Gluon kernel (config.dkdv_gluon)."""
    batch, heads, sq, dim = q.shape
    kv_heads, sk = k.shape[1], k.shape[2]
    block_m, block_n, warps = GLUON_DKDV_TILE
    part = config.part("dkdv")
    if dq_acc is not None and (not dq_acc.is_contiguous() or dq_acc.dtype != torch.float32):
        raise ValueError("dkdv_gluon with dkdv_dq adds into a contiguous float32 dq_acc")
    if part["split"] and dq_acc is not None:
        raise ValueError("dkdv_split runs without dkdv_dq (dQ by its own kernel)")
    _check_gluon("dkdv", part, GLUON_DKDV_TILE, q)
    dk, dv = k.new_empty(k.shape), v.new_empty(v.shape)  # contiguous, whatever k's layout
    q, grad_out, q_rows = _tma_pair(q, grad_out)
    k, v, k_rows = _tma_pair(k, v)
    qn, qb, qd = schedule.q_meta
    kn, kb, kd = schedule.k_meta
    (lse2, stride_stat), (delta, _) = _stat_rows(lse2), _stat_rows(delta)
    cols = schedule.by_key_tile(block_m, block_n)
    lists_rows, nt, mt = cols.index.shape
    triton.set_allocator(_scratch)  # the kernel's device-side TMA descriptors live there
    split = part["split"]
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    chunk = dkdv_chunk(part["order"], nt, batch * kv_heads, sms)
    _gluon_dkdv_kernel[(nt * batch * kv_heads,)](
        q, k, v, grad_out, dk, dv, lse2, delta, dq_acc if dq_acc is not None else delta,
        qn, qb, qd, kn, kb, kd,
        cols.order, cols.index, cols.count, scale * LOG2E, scale,
        heads, kv_heads, heads // kv_heads, sq, sk, mt, nt, int(lists_rows > 1),
        q.numel() // q_rows[0], k.numel() // k_rows[0], *_doc_strides(schedule), *q_rows,
        *k_rows, stride_stat, BN=block_n, BM=block_m, D=dim, STAGES=part["stages"], WARPS=warps, DQ=dq_acc is not None,
        SPLIT=split, CHUNK=chunk, num_warps=warps // 2 if split else warps,
    )  # fmt: skip
    return dk, dv


def _gluon_backward_dq(grad_out, delta, lse2, q, k, v, schedule: Schedule, scale: float,
                       config: KernelConfig):  # fmt: skip
    """`backward_dq` by the Gluon kernel (config.dq_gluon): dq like q."""
    batch, heads, sq, dim = q.shape
    kv_heads, sk = k.shape[1], k.shape[2]
    block_m, block_n, warps = GLUON_DQ_TILE
    part = config.part("dq")
    _check_gluon("dq", part, GLUON_DQ_TILE, q)
    dq = torch.empty_like(q)  # q's strides, as the op's fake backward promises
    q, grad_out, q_rows = _tma_pair(q, grad_out)
    k, v, k_rows = _tma_pair(k, v)
    qn, qb, qd = schedule.q_meta
    kn, kb, kd = schedule.k_meta
    rows = schedule.by_query_tile(block_m, block_n)
    lists_rows, mt, nt = rows.index.shape
    triton.set_allocator(_scratch)  # the kernel's device-side TMA descriptors live there
    _gluon_dq_kernel[(mt, batch * heads)](
        q, k, v, grad_out, dq, lse2, delta, qn, qb, qd, kn, kb, kd,
        rows.order, rows.index, rows.count, scale * LOG2E, scale,
        heads, heads // kv_heads, kv_heads, sq, sk, mt, nt, int(lists_rows > 1),
        q.numel() // q_rows[0], k.numel() // k_rows[0], *_doc_strides(schedule),
        dq.stride(0), dq.stride(1), dq.stride(2), *q_rows, *k_rows,
        BM=block_m, BN=block_n, D=dim, STAGES=part["stages"], WARPS=warps,
        SPLIT=bool(part["split"]), num_warps=warps // 2 if part["split"] else warps,
    )  # fmt: skip
    return dq


def backward_dq(grad_out, delta, lse2, q, k, v, schedule: Schedule, scale: float,
                config: KernelConfig):  # fmt: skip
    """dq like q: one program per (head, query tile) over its key tiles."""
    if config.dq_split and not config.dq_gluon:
        raise ValueError("dq_split is a layout of the Gluon dQ kernel (dq_gluon: 1)")
    if config.dq_gluon:
        return _gluon_backward_dq(grad_out, delta, lse2, q, k, v, schedule, scale, config)
    batch, heads, sq, dim = q.shape
    kv_heads, sk = k.shape[1], k.shape[2]
    qn, qb, qd = schedule.q_meta
    kn, kb, kd = schedule.k_meta
    dq = torch.empty_like(q)
    rows = schedule.by_query_tile(config.dq_m, config.dq_n)
    lists_rows, mt, nt = rows.index.shape
    tma = _uses_tma(config.dq_tma, q, k, v, grad_out)
    launch = _launch("dq", config, mt, batch * heads, tma)
    _bwd_dq_kernel[launch.pop("grid")](
        q, k, v, grad_out, dq, lse2, delta, *_descriptors(tma, (k, v), config.dq_n),
        qn, qb, qd, kn, kb, kd,
        rows.order, rows.index, rows.count, rows.runs,
        scale * LOG2E, scale,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        grad_out.stride(0), grad_out.stride(1), grad_out.stride(2),
        dq.stride(0), dq.stride(1), dq.stride(2),
        *_doc_strides(schedule),
        heads, heads // kv_heads, sq, sk, mt, nt, int(lists_rows > 1),
        HEAD_DIM=dim, BLOCK_M=config.dq_m, BLOCK_N=config.dq_n, **launch,
    )  # fmt: skip
    return dq


def backward(
    grad_out, grad_lse, q, k, v, out, lse, schedule: Schedule,
    scale: float | None = None, config: KernelConfig | None = None,
):  # fmt: skip
    """(dq, dk, dv) of (out, lse) = forward(q, k, v); grad_lse may be None."""
    _check(q, k, v, schedule)
    dim = q.shape[-1]
    config = config or default_config(dim)
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    grad_out, delta, lse2 = backward_prepare(grad_out, grad_lse, q, out, lse)
    if config.dkdv_dq:  # one kernel: dQ accumulated in fp32 by the dK/dV programs
        dq_acc = torch.zeros(q.shape, device=q.device, dtype=torch.float32)
        dk, dv = backward_dkdv(grad_out, delta, lse2, q, k, v, schedule, scale, config, dq_acc)
        dq = torch.empty_like(q)  # q's strides, as the op's fake backward promises
        return dq.copy_(dq_acc.mul_(scale)), dk, dv
    dk, dv = backward_dkdv(grad_out, delta, lse2, q, k, v, schedule, scale, config)
    dq = backward_dq(grad_out, delta, lse2, q, k, v, schedule, scale, config)
    return dq, dk, dv
