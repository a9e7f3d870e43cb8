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

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453

EMPTY, PARTIAL, FULL = 0, 1, 2


# --- tile configurations (a small fixed set for sm90; no autotuning at run time) ------------
@dataclass(frozen=True)
class KernelConfig:
    """Tile shapes, warps and pipeline depth of the three kernels."""

    fwd_m: int = 128
    fwd_n: int = 64
    fwd_warps: int = 8
    fwd_stages: int = 3
    dkdv_m: int = 64
    dkdv_n: int = 128
    dkdv_warps: int = 8
    dkdv_stages: int = 2
    dq_m: int = 128
    dq_n: int = 64
    dq_warps: int = 8
    dq_stages: int = 2
    # Full tiles through the bulk tensor copy engine (host-side descriptors); partial tiles keep
    # bounds-checked pointer loads. Off by default until timed on the H200 (`--sweep`).
    tma: bool = False


SM90_CONFIGS = {
    64: KernelConfig(fwd_n=128, fwd_stages=3),
    # Timed on the H200 (2026-12-01, 2L = 16K, block 32, H 16 / Hkv 8): 128 x 128 forward tiles
    # in 2 stages ran the forward in 6.79 ms against 7.24 ms for 128 x 64 in 3.
    128: KernelConfig(fwd_n=128, fwd_stages=2),
}

# Candidates the benchmark may compare (`--sweep`); the first entry per head dim is the default.
SM90_SWEEP = {
    64: [
        SM90_CONFIGS[64],
        KernelConfig(fwd_n=128, fwd_stages=3, tma=True),
        KernelConfig(fwd_n=64, fwd_stages=4),
        KernelConfig(fwd_n=128, fwd_stages=2, dkdv_m=32, dq_n=32, dkdv_stages=3, dq_stages=3),
    ],
    128: [
        SM90_CONFIGS[128],
        KernelConfig(fwd_n=64, fwd_stages=3, tma=True),
        KernelConfig(fwd_n=64, fwd_stages=3),
        KernelConfig(fwd_n=64, fwd_stages=2, dkdv_m=64, dkdv_n=64, dq_n=32, dq_stages=3),
    ],
}


def default_config(head_dim: int) -> KernelConfig:
    if head_dim not in SM90_CONFIGS:
        raise ValueError(f"block_diffusion_attention supports head dim 64 or 128, not {head_dim}")
    return SM90_CONFIGS[head_dim]


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
    (B, R, 2) int32 = (full, partial).
    """

    order: torch.Tensor
    index: torch.Tensor
    count: torch.Tensor


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
    return TileLists(order.contiguous(), index.contiguous(), torch.stack([full, partial], -1))


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
def _fwd_kernel(
    Q, K, V, OUT, LSE, A_TMA, B_TMA,
    QN, QB, QD, KN, KB, KD,
    ORDER, IDX, COUNT,
    qk_scale,
    stride_qb, stride_qh, stride_qs,
    stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs,
    stride_ob, stride_oh, stride_os,
    stride_qdb, stride_kdb,
    H, GROUP, Sq, Sk, Mt, Nt, PER_BATCH,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, USE_TMA: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(1)  # tile rank: heaviest first across all heads (axis 0 runs first)
    bh = tl.program_id(0)
    b = bh // H
    h = bh % H
    hk = h // GROUP
    lb = b * PER_BATCH  # 0: one schedule (one document per row) serves every batch row
    m_tile = tl.load(ORDER + lb * Mt + pid)
    row = lb * Mt + m_tile
    offs_m = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_j = tl.arange(0, BLOCK_N)
    row_ok = offs_m < Sq
    b64 = b.to(tl.int64)
    q_base = Q + b64 * stride_qb + h.to(tl.int64) * stride_qh
    k_base = K + b64 * stride_kb + hk.to(tl.int64) * stride_kh
    v_base = V + b64 * stride_vb + hk.to(tl.int64) * stride_vh
    q = tl.load(
        q_base + offs_m[:, None] * stride_qs + offs_d[None, :], mask=row_ok[:, None], other=0.0
    )

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    n_full = tl.load(COUNT + row * 2)
    n_partial = tl.load(COUNT + row * 2 + 1)
    idx = IDX + row.to(tl.int64) * Nt

    # Full tiles: every pair allowed, no bounds or mask arithmetic; m_new is finite here.
    for i in range(0, n_full):
        n0 = tl.load(idx + i) * BLOCK_N
        if USE_TMA:  # A_TMA, B_TMA: descriptors of K and V, boxes (1, 1, BLOCK_N, D)
            k = A_TMA.load([b, hk, n0, 0]).reshape(BLOCK_N, HEAD_DIM)
            v = B_TMA.load([b, hk, n0, 0]).reshape(BLOCK_N, HEAD_DIM)
        else:
            offs_n = n0 + offs_j
            k = tl.load(k_base + offs_n[:, None] * stride_ks + offs_d[None, :])
            v = tl.load(v_base + offs_n[:, None] * stride_vs + offs_d[None, :])
        # Raw scores: the row max scales as a vector, the exponent is one multiply-add.
        s = tl.dot(q, tl.trans(k))
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        p = tl.math.exp2(s * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new

    # Partial tiles: the predicate from metadata; a row may still see nothing (m_new = -inf).
    qn = tl.load(QN + offs_m, mask=row_ok, other=0)
    qb = tl.load(QB + offs_m, mask=row_ok, other=-1)
    qd = tl.load(QD + b64 * stride_qdb + offs_m, mask=row_ok, other=-1)
    for i in range(n_full, n_full + n_partial):
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


@triton.jit
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
def _bwd_dkdv_kernel(
    Q, K, V, DO, DK, DV, LSE2, DELTA, A_TMA, B_TMA,
    QN, QB, QD, KN, KB, KD,
    ORDER, IDX, COUNT,
    qk_scale, sm_scale,
    stride_qb, stride_qh, stride_qs,
    stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs,
    stride_dob, stride_doh, stride_dos,
    stride_dkb, stride_dkh, stride_dks,
    stride_qdb, stride_kdb,
    H, HK, GROUP, Sq, Sk, Mt, Nt, PER_BATCH,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, USE_TMA: tl.constexpr,
):  # fmt: skip
    """One key tile of one kv head: dK, dV summed over the query tiles and the GQA group."""
    pid = tl.program_id(1)  # tile rank: heaviest first across all heads (axis 0 runs first)
    bhk = tl.program_id(0)
    b = bhk // HK
    hk = bhk % HK
    lb = b * PER_BATCH  # 0: one schedule (one document per row) serves every batch row
    n_tile = tl.load(ORDER + lb * Nt + pid)
    row = lb * Nt + n_tile
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
    n_full = tl.load(COUNT + row * 2)
    n_partial = tl.load(COUNT + row * 2 + 1)
    idx = IDX + row.to(tl.int64) * Mt
    for g in range(0, GROUP):
        h = hk * GROUP + g
        q_base = Q + b64 * stride_qb + h.to(tl.int64) * stride_qh
        do_base = DO + b64 * stride_dob + h.to(tl.int64) * stride_doh
        stat = (b64 * H + h) * Sq
        for i in range(0, n_full):
            m0 = tl.load(idx + i) * BLOCK_M
            offs_m = m0 + offs_i
            if USE_TMA:  # A_TMA, B_TMA: descriptors of Q and dO, boxes (1, 1, BLOCK_M, D)
                q = A_TMA.load([b, h, m0, 0]).reshape(BLOCK_M, HEAD_DIM)
                do = B_TMA.load([b, h, m0, 0]).reshape(BLOCK_M, HEAD_DIM)
            else:
                q = tl.load(q_base + offs_m[:, None] * stride_qs + offs_d[None, :])
                do = tl.load(do_base + offs_m[:, None] * stride_dos + offs_d[None, :])
            lse2 = tl.load(LSE2 + stat + offs_m)
            delta = tl.load(DELTA + stat + offs_m)
            s_t = tl.dot(k, tl.trans(q)) * qk_scale
            p_t = tl.math.exp2(s_t - lse2[None, :])
            dv = tl.dot(p_t.to(do.dtype), do, dv)
            dp_t = tl.dot(v, tl.trans(do))
            ds_t = p_t * (dp_t - delta[None, :])
            dk = tl.dot(ds_t.to(q.dtype), q, dk)
        for i in range(n_full, n_full + n_partial):
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
            ds_t = p_t * (dp_t - delta[None, :])
            dk = tl.dot(ds_t.to(q.dtype), q, dk)

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
def _bwd_dq_kernel(
    Q, K, V, DO, DQ, LSE2, DELTA, A_TMA, B_TMA,
    QN, QB, QD, KN, KB, KD,
    ORDER, IDX, COUNT,
    qk_scale, sm_scale,
    stride_qb, stride_qh, stride_qs,
    stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs,
    stride_dob, stride_doh, stride_dos,
    stride_dqb, stride_dqh, stride_dqs,
    stride_qdb, stride_kdb,
    H, GROUP, Sq, Sk, Mt, Nt, PER_BATCH,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, USE_TMA: tl.constexpr,
):  # fmt: skip
    """One query tile of one head: dQ over its key tiles."""
    pid = tl.program_id(1)  # tile rank: heaviest first across all heads (axis 0 runs first)
    bh = tl.program_id(0)
    b = bh // H
    h = bh % H
    hk = h // GROUP
    lb = b * PER_BATCH  # 0: one schedule (one document per row) serves every batch row
    m_tile = tl.load(ORDER + lb * Mt + pid)
    row = lb * Mt + m_tile
    offs_m = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_j = tl.arange(0, BLOCK_N)
    row_ok = offs_m < Sq
    b64 = b.to(tl.int64)
    q_base = Q + b64 * stride_qb + h.to(tl.int64) * stride_qh
    do_base = DO + b64 * stride_dob + h.to(tl.int64) * stride_doh
    k_base = K + b64 * stride_kb + hk.to(tl.int64) * stride_kh
    v_base = V + b64 * stride_vb + hk.to(tl.int64) * stride_vh
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
    n_full = tl.load(COUNT + row * 2)
    n_partial = tl.load(COUNT + row * 2 + 1)
    idx = IDX + row.to(tl.int64) * Nt
    for i in range(0, n_full):
        n0 = tl.load(idx + i) * BLOCK_N
        if USE_TMA:  # A_TMA, B_TMA: descriptors of K and V, boxes (1, 1, BLOCK_N, D)
            k = A_TMA.load([b, hk, n0, 0]).reshape(BLOCK_N, HEAD_DIM)
            v = B_TMA.load([b, hk, n0, 0]).reshape(BLOCK_N, HEAD_DIM)
        else:
            offs_n = n0 + offs_j
            k = tl.load(k_base + offs_n[:, None] * stride_ks + offs_d[None, :])
            v = tl.load(v_base + offs_n[:, None] * stride_vs + offs_d[None, :])
        s = tl.dot(q, tl.trans(k)) * qk_scale
        p = tl.math.exp2(s - lse2[:, None])
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq)
    qn = tl.load(QN + offs_m, mask=row_ok, other=0)
    qb = tl.load(QB + offs_m, mask=row_ok, other=-1)
    qd = tl.load(QD + b64 * stride_qdb + offs_m, mask=row_ok, other=-1)
    for i in range(n_full, n_full + n_partial):
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


def _uses_tma(wanted: bool, *tensors: torch.Tensor) -> bool:
    return bool(wanted) and all(_tma_fits(t) for t in tensors)


def _descriptors(wanted: bool, tensors, rows: int):
    """Host-side TMA descriptors (boxes of `rows` x D) for full tiles, or the tensors themselves
    (unused) when TMA is off or a layout does not fit it (the pointer path then runs)."""
    if not _uses_tma(wanted, *tensors):
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
    _fwd_kernel[(batch * heads, mt)](
        q, k, v, out, lse, *_descriptors(config.tma, (k, v), config.fwd_n),
        qn, qb, qd, kn, kb, kd,
        lists.order, lists.index, lists.count,
        scale * LOG2E,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        *_doc_strides(schedule),
        heads, heads // kv_heads, sq, sk, mt, nt, int(lists_rows > 1),
        HEAD_DIM=dim, BLOCK_M=config.fwd_m, BLOCK_N=config.fwd_n, USE_TMA=_uses_tma(config.tma, q, k, v),
        num_warps=config.fwd_warps, num_stages=config.fwd_stages,
    )  # fmt: skip
    return out, lse


def backward(
    grad_out, grad_lse, q, k, v, out, lse, schedule: Schedule,
    scale: float | None = None, config: KernelConfig | None = None,
):  # fmt: skip
    """(dq, dk, dv) of (out, lse) = forward(q, k, v); grad_lse may be None."""
    _check(q, k, v, schedule)
    batch, heads, sq, dim = q.shape
    kv_heads, sk = k.shape[1], k.shape[2]
    config = config or default_config(dim)
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
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
    qn, qb, qd = schedule.q_meta
    kn, kb, kd = schedule.k_meta
    dk = k.new_empty(k.shape)  # contiguous: dk and dv share strides in the kernel
    dv = v.new_empty(v.shape)
    cols = schedule.by_key_tile(config.dkdv_m, config.dkdv_n)
    lists_rows, nt, mt = cols.index.shape
    _bwd_dkdv_kernel[(batch * kv_heads, nt)](
        q, k, v, grad_out, dk, dv, lse2, delta,
        *_descriptors(config.tma, (q, grad_out), config.dkdv_m),
        qn, qb, qd, kn, kb, kd,
        cols.order, cols.index, cols.count,
        scale * LOG2E, scale,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        grad_out.stride(0), grad_out.stride(1), grad_out.stride(2),
        dk.stride(0), dk.stride(1), dk.stride(2),
        *_doc_strides(schedule),
        heads, kv_heads, heads // kv_heads, sq, sk, mt, nt, int(lists_rows > 1),
        HEAD_DIM=dim, BLOCK_M=config.dkdv_m, BLOCK_N=config.dkdv_n, USE_TMA=_uses_tma(config.tma, q, k, v, grad_out),
        num_warps=config.dkdv_warps, num_stages=config.dkdv_stages,
    )  # fmt: skip
    dq = torch.empty_like(q)
    rows = schedule.by_query_tile(config.dq_m, config.dq_n)
    lists_rows, mt, nt = rows.index.shape
    _bwd_dq_kernel[(batch * heads, mt)](
        q, k, v, grad_out, dq, lse2, delta, *_descriptors(config.tma, (k, v), config.dq_n),
        qn, qb, qd, kn, kb, kd,
        rows.order, rows.index, rows.count,
        scale * LOG2E, scale,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        grad_out.stride(0), grad_out.stride(1), grad_out.stride(2),
        dq.stride(0), dq.stride(1), dq.stride(2),
        *_doc_strides(schedule),
        heads, heads // kv_heads, sq, sk, mt, nt, int(lists_rows > 1),
        HEAD_DIM=dim, BLOCK_M=config.dq_m, BLOCK_N=config.dq_n, USE_TMA=_uses_tma(config.tma, q, k, v, grad_out),
        num_warps=config.dq_warps, num_stages=config.dq_stages,
    )  # fmt: skip
    return dq, dk, dv
