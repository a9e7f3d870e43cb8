"""Prototype: the block-diffusion forward in Gluon, against the op's Triton (`tl`) forward on one
GPU: the same inputs, out and lse compared, both timed.

    python benchmarks/attention_gluon_fwd.py                        # H200: check and time
    python benchmarks/attention_gluon_fwd.py --compile-only [--triton-path DIR]   # any host

Not part of the op. The `tl` forward reaches 515-580 useful TFLOP/s on the H200 from 2L 16K up
(session 18's table). This is the structure of the op's Gluon
dK/dV kernel (session 16: 1.12x the `tl` one) turned to the forward: the op's producer warp
(`_gluon_kv_loads`, its dQ kernel's) streams the query tile's key tiles (K and V, full tiles
first) through a ring of shared-memory stages with TMA and mbarriers; two consumer warpgroups
(240 registers each, 64 query rows each) keep their Q rows in shared memory and the output in
registers, compute S = Q K^T, the online softmax, and O += P V with P handed to the wgmma in
registers (S's accumulator layout is the A operand's). The two warpgroups meet once a tile (the
partition barrier Triton puts before each stage's release), so one's softmax overlaps the
other's wgmmas only within a tile. The tile lists, the block-diffusion predicate on partial
tiles (the op's `_gluon_visible`), GQA, documents
and the numbers (log2-scaled scores, lse in natural log, -inf and a zero output for a query that
sees no key) are the op's: its plan (`by_query_tile`) and launch order (`ORDER`, heaviest tiles
first) make the inputs. Written in session 16 without a GPU at hand: compiled for sm90 with
Triton 3.6.0 (the H200's) and 3.9.0. On the H200 (session 17): out and lse equal the `tl`
forward's; 0.89-0.94x its speed, 0.94x with `--split` (each warpgroup its own partition, so
the two meet at no barrier), 0.72-0.77x with `--overlap` (FlashAttention-3's intra-warpgroup
overlap as written here spills). `--pingpong` (session 18): split, and the two warpgroups take
turns at the tensor cores through a pair of mbarriers, FlashAttention-3's inter-warpgroup
ping-pong: in its turn a warpgroup issues the previous tile's P V and this tile's S together,
lets the other issue, and runs its softmax while the other's wgmmas do; full and partial tiles
walk separate loops, so no loop holds both softmax paths (compiled for sm90 under Triton 3.6:
24 bytes of stack, as `--split`; 3.9: none). On the H200: out and lse bit for bit the `tl`
forward's; 3 stages 1.00-1.03x its speed, 2 stages 0.85x.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compile-only", action="store_true", help="compile for sm90, no GPU")
    parser.add_argument("--triton-path", type=Path, help="an unpacked Triton wheel to use")
    parser.add_argument("--seq-len", type=int, default=8192, help="L (the stream is 2L)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128, choices=(64, 128))
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument(
        "--split", action="store_true",
        help="each consumer warpgroup its own partition (no barrier between them)",
    )  # fmt: skip
    parser.add_argument(
        "--overlap", action="store_true",
        help="FlashAttention-3's intra-warpgroup overlap (softmax of tile j beside P V of j-1)",
    )  # fmt: skip
    parser.add_argument(
        "--pingpong", action="store_true",
        help="--split with FlashAttention-3's ping-pong: the warpgroups take turns at the tensor "
        "cores (one's softmax beside the other's wgmmas), full and partial tiles in two loops",
    )  # fmt: skip
    return parser.parse_args(argv)


ARGS = _parse(sys.argv[1:]) if __name__ == "__main__" else None
if ARGS is not None and ARGS.triton_path:
    sys.path.insert(0, str(ARGS.triton_path))

from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import (  # noqa: E402
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

sys.path.insert(0, str(ROOT))
from turbo_dllm.kernels.triton_ops import triton_module  # noqa: E402

OP = triton_module("block_diffusion_attention", "jit")
# the op's producer warp (the dQ kernel streams K and V the same way), TMA load and predicate
_loads, _tma_load, _visible = OP._gluon_kv_loads, OP._tma_load, OP._gluon_visible

BM, BN, WARPS = 128, 128, 8  # query rows and key rows per tile, consumer warps (2 warpgroups)
LN2 = 0.6931471805599453


@gluon.jit
def _store_out(OUT, LSE, acc, m_i, l_i, offs_m, row_ok, m0, bh, Sq, BM: gl.constexpr,
               D: gl.constexpr, WARPS: gl.constexpr):  # fmt: skip
    """The query tile's lse (natural log, -inf where a row saw nothing) and out (0 there)."""
    mma_o: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, D, 16]
    )
    seen = l_i > 0.0
    l_safe = gl.where(seen, l_i, 1.0)
    lse = gl.where(seen, (m_i + gl.log2(l_safe)) * 0.6931471805599453, float("-inf"))
    stat = bh.to(gl.int64) * Sq
    gl.store(LSE + stat + offs_m, lse, mask=row_ok)
    out = acc / gl.convert_layout(l_safe, gl.SliceLayout(1, mma_o))[:, None]
    rows = m0 + gl.arange(0, BM, layout=gl.SliceLayout(1, mma_o))
    cols = gl.arange(0, D, layout=gl.SliceLayout(0, mma_o))
    at = (stat + rows)[:, None] * D + cols[None, :]
    gl.store(OUT + at, out.to(OUT.dtype.element_ty), mask=(rows < Sq)[:, None])


@gluon.jit
def _softmax_tile(q_s, k, v, m_i, l_i, acc, KN, KB, KD, n0, b, Sk, stride_kdb, qn, qb, qd,
                  row_ok, qk_scale, BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr,
                  WARPS: gl.constexpr, MASKED: gl.constexpr):  # fmt: skip
    """One key tile of the online softmax: (m_i, l_i, acc) updated."""
    mma_s: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, BN, 16]
    )
    mma_o: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, D, 16]
    )
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_o, k_width=2)
    zero = gl.zeros([BM, BN], gl.float32, mma_s)  # shape and layout only (use_acc=False)
    s = warpgroup_mma(q_s, k.permute((1, 0)), zero, use_acc=False)
    p, m_new, l_i, alpha = _softmax(s, m_i, l_i, KN, KB, KD, n0, b, Sk, stride_kdb, qn, qb, qd,
                                    row_ok, qk_scale, BN, WARPS, MASKED)  # fmt: skip
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, mma_o))[:, None]
    p_op = gl.convert_layout(p.to(v.dtype), a_op)
    acc = warpgroup_mma(p_op, v, acc)
    return m_new, l_i, acc


@gluon.jit
def _softmax(s, m_i, l_i, KN, KB, KD, n0, b, Sk, stride_kdb, qn, qb, qd, row_ok, qk_scale,
             BN: gl.constexpr, WARPS: gl.constexpr, MASKED: gl.constexpr):  # fmt: skip
    """The online softmax of one key tile's S: (p, m_new, l_i, alpha). With MASKED the predicate
    from metadata; a row may still see nothing (m_new = -inf)."""
    mma_s: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, BN, 16]
    )
    if MASKED:
        offs_n = n0 + gl.arange(0, BN, layout=gl.SliceLayout(0, mma_s))
        col_ok = offs_n < Sk
        kn = gl.load(KN + offs_n, mask=col_ok, other=0) != 0
        kb = gl.load(KB + offs_n, mask=col_ok, other=0)
        kd = gl.load(KD + b * stride_kdb + offs_n, mask=col_ok, other=-2)
        visible = _visible(
            qn[:, None], qb[:, None], qd[:, None], kn[None, :], kb[None, :], kd[None, :]
        )
        visible = visible & col_ok[None, :] & row_ok[:, None]
        s = gl.where(visible, s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        m_safe = m_new
    p = gl.exp2(s * qk_scale - m_safe[:, None])
    alpha = gl.exp2(m_i - m_safe)
    l_i = l_i * alpha + gl.sum(p, 1)
    return p, m_new, l_i, alpha


@gluon.jit
def _query_rows(QN, QB, QD, b, m0, Sq, stride_qdb, BM: gl.constexpr, BN: gl.constexpr,
                D: gl.constexpr, WARPS: gl.constexpr):  # fmt: skip
    """A consumer's query rows: (offs_m, row_ok, qn, qb, qd) and the online softmax's start
    (m_i, l_i, acc)."""
    mma_s: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, BN, 16]
    )
    mma_o: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, D, 16]
    )
    offs_m = m0 + gl.arange(0, BM, layout=gl.SliceLayout(1, mma_s))
    row_ok = offs_m < Sq
    qn = gl.load(QN + offs_m, mask=row_ok, other=0) != 0
    qb = gl.load(QB + offs_m, mask=row_ok, other=-1)
    qd = gl.load(QD + b * stride_qdb + offs_m, mask=row_ok, other=-1)
    m_i = gl.full([BM], float("-inf"), gl.float32, gl.SliceLayout(1, mma_s))
    l_i = gl.zeros([BM], gl.float32, gl.SliceLayout(1, mma_s))
    acc = gl.zeros([BM, D], gl.float32, mma_o)
    return offs_m, row_ok, qn, qb, qd, m_i, l_i, acc


@gluon.jit
def _first_softmax(s, m_i, l_i, KN, KB, KD, n0, n_full, b, Sk, stride_kdb, qn, qb, qd, row_ok,
                   qk_scale, BN: gl.constexpr, WARPS: gl.constexpr):  # fmt: skip
    """`_softmax` of a query tile's first key tile: full, unless the tile has no full ones."""
    if n_full > 0:
        p, m_i, l_i, alpha = _softmax(s, m_i, l_i, KN, KB, KD, n0, b, Sk, stride_kdb, qn, qb, qd,
                                      row_ok, qk_scale, BN, WARPS, False)  # fmt: skip
    else:
        p, m_i, l_i, alpha = _softmax(s, m_i, l_i, KN, KB, KD, n0, b, Sk, stride_kdb, qn, qb, qd,
                                      row_ok, qk_scale, BN, WARPS, True)  # fmt: skip
    return p, m_i, l_i, alpha


@gluon.jit
def _math_overlap(OUT, LSE, QN, QB, QD, KN, KB, KD, q_s, k_s, v_s, q_bar, ready, empty, IDX,
                  COUNT, row, Nt, b, bh, m0, Sq, Sk, stride_qdb, stride_kdb, qk_scale,
                  BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr,
                  WARPS: gl.constexpr):  # fmt: skip
    """`_math` with FlashAttention-3's intra-warpgroup overlap: tile j's S = Q K_j^T is issued,
    then the previous tile's O += P V, and the softmax of S_j runs while that wgmma does; O is
    rescaled once it is done."""
    mma_s: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, BN, 16]
    )
    mma_o: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, D, 16]
    )
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_o, k_width=2)
    offs_m, row_ok, qn, qb, qd, m_i, l_i, acc = _query_rows(QN, QB, QD, b, m0, Sq, stride_qdb,
                                                            BM, BN, D, WARPS)  # fmt: skip
    zero = gl.zeros([BM, BN], gl.float32, mma_s)
    n_full = gl.load(COUNT + row * 3)
    n_tiles = n_full + gl.load(COUNT + row * 3 + 1)
    idx = IDX + row.to(gl.int64) * Nt
    mbarrier.wait(q_bar, 0)
    # tile 0: S and its softmax (a query tile has at least one key tile)
    mbarrier.wait(ready.index(0), 0)
    s = warpgroup_mma(q_s, k_s.index(0).permute((1, 0)), zero, use_acc=False)
    p, m_i, l_i, alpha = _first_softmax(s, m_i, l_i, KN, KB, KD, gl.load(idx) * BN, n_full, b,
                                        Sk, stride_kdb, qn, qb, qd, row_ok, qk_scale, BN,
                                        WARPS)  # fmt: skip
    for it in range(1, n_tiles):
        st = it % STAGES
        prev = (it - 1) % STAGES
        mbarrier.wait(ready.index(st), (it // STAGES) & 1)
        s = warpgroup_mma(q_s, k_s.index(st).permute((1, 0)), zero, use_acc=False,
                          is_async=True)  # fmt: skip
        p_op = gl.convert_layout(p.to(gl.bfloat16), a_op)
        acc = warpgroup_mma(p_op, v_s.index(prev), acc, is_async=True)
        s = warpgroup_mma_wait(1, deps=[s])  # groups complete in issue order: S, not P V
        n0 = gl.load(idx + it) * BN
        if it < n_full:
            p, m_i, l_i, alpha = _softmax(s, m_i, l_i, KN, KB, KD, n0, b, Sk, stride_kdb, qn, qb,
                                          qd, row_ok, qk_scale, BN, WARPS, False)  # fmt: skip
        else:
            p, m_i, l_i, alpha = _softmax(s, m_i, l_i, KN, KB, KD, n0, b, Sk, stride_kdb, qn, qb,
                                          qd, row_ok, qk_scale, BN, WARPS, True)  # fmt: skip
        acc, p_op = warpgroup_mma_wait(0, deps=[acc, p_op])
        mbarrier.arrive(empty.index(prev), count=1)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, mma_o))[:, None]
    # the last tile's P V
    last = (n_tiles - 1) % STAGES
    p_op = gl.convert_layout(p.to(gl.bfloat16), a_op)
    acc = warpgroup_mma(p_op, v_s.index(last), acc)
    mbarrier.arrive(empty.index(last), count=1)
    _store_out(OUT, LSE, acc, m_i, l_i, offs_m, row_ok, m0, bh, Sq, BM, D, WARPS)


@gluon.jit
def _my_turn(turn, k, WG: gl.constexpr):
    """Wait until this warpgroup may issue its k-th pair of wgmmas: warpgroup 0's k-th turn
    follows warpgroup 1's (k-1)-th, warpgroup 1's k-th follows warpgroup 0's k-th (each
    arrives on the other's barrier once its wgmmas are issued, so the two alternate strictly)."""
    if WG == 0:
        if k > 0:
            mbarrier.wait(turn.index(0), (k - 1) & 1)
    else:
        mbarrier.wait(turn.index(1), k & 1)


@gluon.jit
def _pingpong_step(q_s, k_s, v_s, ready, empty, turn, it, p, m_i, l_i, alpha, acc, idx, KN, KB,
                   KD, b, Sk, stride_kdb, qn, qb, qd, row_ok, qk_scale, BM: gl.constexpr,
                   BN: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr,
                   WARPS: gl.constexpr, WG: gl.constexpr, MASKED: gl.constexpr):  # fmt: skip
    """Tile `it` >= 1 in this warpgroup's turn `it`: O = alpha O + P V of the previous tile and
    S = Q K^T of this one issued together, then (the other warpgroup's turn) the softmax of S."""
    mma_s: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, BN, 16]
    )
    mma_o: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, D, 16]
    )
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_o, k_width=2)
    st = it % STAGES
    prev = (it - 1) % STAGES
    mbarrier.wait(ready.index(st), (it // STAGES) & 1)
    _my_turn(turn, it, WG)
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, mma_o))[:, None]
    p_op = gl.convert_layout(p.to(gl.bfloat16), a_op)
    acc = warpgroup_mma(p_op, v_s.index(prev), acc, is_async=True)
    zero = gl.zeros([BM, BN], gl.float32, mma_s)
    s = warpgroup_mma(q_s, k_s.index(st).permute((1, 0)), zero, use_acc=False, is_async=True)
    # issued: the other warpgroup may queue its wgmmas behind these (FA3 signals here too)
    mbarrier.arrive(turn.index(1 - WG), count=1)
    acc, s, p_op = warpgroup_mma_wait(0, deps=[acc, s, p_op])
    mbarrier.arrive(empty.index(prev), count=1)
    p, m_i, l_i, alpha = _softmax(s, m_i, l_i, KN, KB, KD, gl.load(idx + it) * BN, b, Sk,
                                  stride_kdb, qn, qb, qd, row_ok, qk_scale, BN, WARPS,
                                  MASKED)  # fmt: skip
    return p, m_i, l_i, alpha, acc


@gluon.jit
def _math_pingpong(OUT, LSE, QN, QB, QD, KN, KB, KD, q_s, k_s, v_s, q_bar, ready, empty, turn,
                   IDX, COUNT, row, Nt, b, bh, m0, Sq, Sk, stride_qdb, stride_kdb, qk_scale,
                   BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr,
                   WARPS: gl.constexpr, WG: gl.constexpr):  # fmt: skip
    """One warpgroup of a split kernel under FlashAttention-3's ping-pong: the two warpgroups
    take turns at the tensor cores (`turn`), each issuing the previous tile's P V and this
    tile's S together, so one's softmax runs while the other's wgmmas do. Full and partial tiles
    walk separate loops (no branch on the tile class inside a loop)."""
    mma_s: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, BN, 16]
    )
    mma_o: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, D, 16]
    )
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_o, k_width=2)
    offs_m, row_ok, qn, qb, qd, m_i, l_i, acc = _query_rows(QN, QB, QD, b, m0, Sq, stride_qdb,
                                                            BM, BN, D, WARPS)  # fmt: skip
    n_full = gl.load(COUNT + row * 3)
    n_tiles = n_full + gl.load(COUNT + row * 3 + 1)
    idx = IDX + row.to(gl.int64) * Nt
    mbarrier.wait(q_bar, 0)
    # turn 0: tile 0's S alone (a query tile has at least one key tile)
    mbarrier.wait(ready.index(0), 0)
    _my_turn(turn, 0, WG)
    zero = gl.zeros([BM, BN], gl.float32, mma_s)
    s = warpgroup_mma(q_s, k_s.index(0).permute((1, 0)), zero, use_acc=False, is_async=True)
    mbarrier.arrive(turn.index(1 - WG), count=1)
    s = warpgroup_mma_wait(0, deps=[s])
    p, m_i, l_i, alpha = _first_softmax(s, m_i, l_i, KN, KB, KD, gl.load(idx) * BN, n_full, b,
                                        Sk, stride_kdb, qn, qb, qd, row_ok, qk_scale, BN,
                                        WARPS)  # fmt: skip
    for it in range(1, n_full):
        p, m_i, l_i, alpha, acc = _pingpong_step(
            q_s, k_s, v_s, ready, empty, turn, it, p, m_i, l_i, alpha, acc, idx, KN, KB, KD, b,
            Sk, stride_kdb, qn, qb, qd, row_ok, qk_scale, BM, BN, D, STAGES, WARPS, WG, False,
        )  # fmt: skip
    for it in range(gl.maximum(n_full, 1), n_tiles):
        p, m_i, l_i, alpha, acc = _pingpong_step(
            q_s, k_s, v_s, ready, empty, turn, it, p, m_i, l_i, alpha, acc, idx, KN, KB, KD, b,
            Sk, stride_kdb, qn, qb, qd, row_ok, qk_scale, BM, BN, D, STAGES, WARPS, WG, True,
        )  # fmt: skip
    # turn n_tiles: the last tile's P V
    last = (n_tiles - 1) % STAGES
    _my_turn(turn, n_tiles, WG)
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, mma_o))[:, None]
    p_op = gl.convert_layout(p.to(gl.bfloat16), a_op)
    acc = warpgroup_mma(p_op, v_s.index(last), acc, is_async=True)
    mbarrier.arrive(turn.index(1 - WG), count=1)
    acc, p_op = warpgroup_mma_wait(0, deps=[acc, p_op])
    mbarrier.arrive(empty.index(last), count=1)
    _store_out(OUT, LSE, acc, m_i, l_i, offs_m, row_ok, m0, bh, Sq, BM, D, WARPS)


@gluon.jit
def _math_plain(OUT, LSE, QN, QB, QD, KN, KB, KD, q_s, k_s, v_s, q_bar, ready, empty, IDX, COUNT,
          row, Nt, b, bh, m0, Sq, Sk, stride_qdb, stride_kdb, qk_scale, BM: gl.constexpr,
          BN: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr,
          WARPS: gl.constexpr):  # fmt: skip
    """The consumer warpgroups: the query tile over its key tiles, then out and lse stored."""
    offs_m, row_ok, qn, qb, qd, m_i, l_i, acc = _query_rows(QN, QB, QD, b, m0, Sq, stride_qdb,
                                                            BM, BN, D, WARPS)  # fmt: skip
    n_full = gl.load(COUNT + row * 3)
    n_partial = gl.load(COUNT + row * 3 + 1)
    idx = IDX + row.to(gl.int64) * Nt
    mbarrier.wait(q_bar, 0)
    for it in range(0, n_full):
        s = it % STAGES
        mbarrier.wait(ready.index(s), (it // STAGES) & 1)
        m_i, l_i, acc = _softmax_tile(
            q_s, k_s.index(s), v_s.index(s), m_i, l_i, acc, KN, KB, KD, gl.load(idx + it) * BN,
            b, Sk, stride_kdb, qn, qb, qd, row_ok, qk_scale, BM, BN, D, WARPS, False,
        )  # fmt: skip
        mbarrier.arrive(empty.index(s), count=1)
    for it in range(n_full, n_full + n_partial):
        s = it % STAGES
        mbarrier.wait(ready.index(s), (it // STAGES) & 1)
        m_i, l_i, acc = _softmax_tile(
            q_s, k_s.index(s), v_s.index(s), m_i, l_i, acc, KN, KB, KD, gl.load(idx + it) * BN,
            b, Sk, stride_kdb, qn, qb, qd, row_ok, qk_scale, BM, BN, D, WARPS, True,
        )  # fmt: skip
        mbarrier.arrive(empty.index(s), count=1)
    _store_out(OUT, LSE, acc, m_i, l_i, offs_m, row_ok, m0, bh, Sq, BM, D, WARPS)


@gluon.jit
def _math(OUT, LSE, QN, QB, QD, KN, KB, KD, q_s, k_s, v_s, q_bar, ready, empty, IDX, COUNT,
          row, Nt, b, bh, m0, Sq, Sk, stride_qdb, stride_kdb, qk_scale, BM: gl.constexpr,
          BN: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr, WARPS: gl.constexpr,
          OVERLAP: gl.constexpr):  # fmt: skip
    """The consumer partition: `_math_overlap` or `_math_plain`."""
    if OVERLAP:
        _math_overlap(OUT, LSE, QN, QB, QD, KN, KB, KD, q_s, k_s, v_s, q_bar, ready, empty, IDX,
                      COUNT, row, Nt, b, bh, m0, Sq, Sk, stride_qdb, stride_kdb, qk_scale, BM,
                      BN, D, STAGES, WARPS)  # fmt: skip
    else:
        _math_plain(OUT, LSE, QN, QB, QD, KN, KB, KD, q_s, k_s, v_s, q_bar, ready, empty, IDX,
                    COUNT, row, Nt, b, bh, m0, Sq, Sk, stride_qdb, stride_kdb, qk_scale, BM, BN,
                    D, STAGES, WARPS)  # fmt: skip


@gluon.jit(do_not_specialize=["H", "GROUP", "HK", "Mt", "Nt", "PER_BATCH"])
def gluon_fwd_kernel(Q, K, V, OUT, LSE, QN, QB, QD, KN, KB, KD, ORDER, IDX, COUNT, qk_scale,
                     H, GROUP, HK, Sq, Sk, Mt, Nt, PER_BATCH, ROWS_Q, ROWS_K, stride_qdb,
                     stride_kdb, BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr,
                     STAGES: gl.constexpr, WARPS: gl.constexpr, SPLIT: gl.constexpr,
                     OVERLAP: gl.constexpr, PINGPONG: gl.constexpr = False):  # fmt: skip
    """One query tile of one head (grid: query tiles x batch * heads, the op's order: heaviest
    tiles first). Q, K, V, OUT contiguous (B, heads, S, D), read as (B * heads * S, D) through
    TMA descriptors; LSE (B, H, Sq)."""
    bh = gl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // GROUP
    lb = b * PER_BATCH  # 0: one schedule (one document per row) serves every batch row
    m_tile = gl.load(ORDER + lb * Mt + gl.program_id(0))
    row = lb * Mt + m_tile  # the query tile's row of the op's tile lists
    m0 = m_tile * BM
    smem: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    q_desc = tma.make_tensor_descriptor(Q, [ROWS_Q, D], [D, 1], [BM, D], smem)
    k_desc = tma.make_tensor_descriptor(K, [ROWS_K, D], [D, 1], [BN, D], smem)
    v_desc = tma.make_tensor_descriptor(V, [ROWS_K, D], [D, 1], [BN, D], smem)
    q_s = gl.allocate_shared_memory(Q.dtype.element_ty, [BM, D], smem)
    k_s = gl.allocate_shared_memory(Q.dtype.element_ty, [STAGES, BN, D], smem)
    v_s = gl.allocate_shared_memory(Q.dtype.element_ty, [STAGES, BN, D], smem)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1 + SPLIT)  # SPLIT: each warpgroup arrives
    for w in gl.static_range(2):  # PINGPONG: warpgroup w waits on turn[w], the other arrives
        mbarrier.init(turn.index(w), count=1)
    fence_async_shared()
    # the query tile, once (rows past the tensor's end arrive as zeros; rows of the next head
    # past Sq are masked out of the scores and the stores)
    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    _tma_load(q_desc, [bh * Sq + m0, 0], q_bar, q_s)
    key0 = (b * HK + hk) * Sk  # this KV head's first row in the (B*HK*Sk, D) view
    if PINGPONG:  # split, and the two take turns at the tensor cores
        HALF: gl.constexpr = BM // 2
        gl.warp_specialize(
            [(_math_pingpong, (OUT, LSE, QN, QB, QD, KN, KB, KD, q_s.slice(0, HALF, dim=0), k_s,
                               v_s, q_bar, ready, empty, turn, IDX, COUNT, row, Nt, b, bh, m0,
                               Sq, Sk, stride_qdb, stride_kdb, qk_scale, HALF, BN, D, STAGES, 4,
                               0)),
             (_math_pingpong, (OUT, LSE, QN, QB, QD, KN, KB, KD, q_s.slice(HALF, HALF, dim=0),
                               k_s, v_s, q_bar, ready, empty, turn, IDX, COUNT, row, Nt, b, bh,
                               m0 + HALF, Sq, Sk, stride_qdb, stride_kdb, qk_scale, HALF, BN, D,
                               STAGES, 4, 1)),
             (_loads, (k_desc, v_desc, k_s, v_s, ready, empty, IDX, COUNT, row, Nt, key0, 0, BN,
                       STAGES))],
            [4, 1],
            [240, 24],
        )  # fmt: skip
    elif SPLIT:  # each warpgroup its own partition, 64 query rows each: they meet at no barrier
        HALF: gl.constexpr = BM // 2
        gl.warp_specialize(
            [(_math, (OUT, LSE, QN, QB, QD, KN, KB, KD, q_s.slice(0, HALF, dim=0), k_s, v_s,
                      q_bar, ready, empty, IDX, COUNT, row, Nt, b, bh, m0, Sq, Sk, stride_qdb,
                      stride_kdb, qk_scale, HALF, BN, D, STAGES, 4, OVERLAP)),
             (_math, (OUT, LSE, QN, QB, QD, KN, KB, KD, q_s.slice(HALF, HALF, dim=0), k_s, v_s,
                      q_bar, ready, empty, IDX, COUNT, row, Nt, b, bh, m0 + HALF, Sq, Sk,
                      stride_qdb, stride_kdb, qk_scale, HALF, BN, D, STAGES, 4, OVERLAP)),
             (_loads, (k_desc, v_desc, k_s, v_s, ready, empty, IDX, COUNT, row, Nt, key0, 0, BN,
                       STAGES))],
            [4, 1],
            [240, 24],
        )  # fmt: skip
    else:
        gl.warp_specialize(
            [(_math, (OUT, LSE, QN, QB, QD, KN, KB, KD, q_s, k_s, v_s, q_bar, ready, empty, IDX,
                      COUNT, row, Nt, b, bh, m0, Sq, Sk, stride_qdb, stride_kdb, qk_scale, BM, BN,
                      D, STAGES, WARPS, OVERLAP)),
             (_loads, (k_desc, v_desc, k_s, v_s, ready, empty, IDX, COUNT, row, Nt, key0, 0, BN,
                       STAGES))],
            [1],
            [24],
        )  # fmt: skip


def gluon_forward(module, q, k, v, schedule, scale, stages=2, split=False, overlap=False,
                  pingpong=False):  # fmt: skip
    """(out, lse) like the op's (`module`) `forward`, from the Gluon kernel (`pingpong`: split,
    the two warpgroups taking turns)."""
    split = split or pingpong
    import torch
    import triton

    batch, heads, sq, dim = q.shape
    kv_heads, sk = k.shape[1], k.shape[2]
    assert dim in (64, 128) and all(t.is_contiguous() for t in (q, k, v))
    qn, qb, qd = schedule.q_meta
    kn, kb, kd = schedule.k_meta
    lists = schedule.by_query_tile(BM, BN)
    rows, mt, nt = lists.index.shape
    out = torch.empty_like(q)
    lse = torch.empty((batch, heads, sq), device=q.device, dtype=torch.float32)
    # device-side TMA descriptors are written to a scratch buffer Triton asks for
    triton.set_allocator(
        lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda")
    )
    gluon_fwd_kernel[(mt, batch * heads)](
        q, k, v, out, lse, qn, qb, qd, kn, kb, kd, lists.order, lists.index, lists.count,
        scale * 1.4426950408889634, heads, heads // kv_heads, kv_heads, sq, sk, mt, nt,
        int(rows > 1), batch * heads * sq, batch * kv_heads * sk,
        *module._doc_strides(schedule),
        BM=BM, BN=BN, D=dim, STAGES=stages, WARPS=WARPS, SPLIT=split, OVERLAP=overlap,
        PINGPONG=pingpong, num_warps=WARPS // 2 if split else WARPS,
    )  # fmt: skip
    return out, lse


def compile_only(stages: int, dim: int, split: bool = False, overlap: bool = False,
                 pingpong: bool = False) -> None:  # fmt: skip
    split = split or pingpong
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    names = gluon_fwd_kernel.arg_names
    sig = {n: "*bf16" for n in ("Q", "K", "V", "OUT")}
    sig |= {"LSE": "*fp32", "QN": "*i8", "KN": "*i8", "qk_scale": "fp32"}
    sig |= {n: "*i32" for n in ("QB", "QD", "KB", "KD", "ORDER", "IDX", "COUNT")}
    flags = ("BM", "BN", "D", "STAGES", "WARPS", "SPLIT", "OVERLAP", "PINGPONG")
    sig |= {n: "constexpr" for n in flags}
    sig |= {n: "i32" for n in names if n not in sig}
    constants = dict(BM=BM, BN=BN, D=dim, STAGES=stages, WARPS=WARPS, SPLIT=split,
                     OVERLAP=overlap, PINGPONG=pingpong)  # fmt: skip
    source = GluonASTSource(gluon_fwd_kernel, {n: sig[n] for n in names}, constants)
    warps = WARPS // 2 if split else WARPS
    compiled = triton.compile(
        source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps}
    )
    sys.path.insert(0, str(ROOT / "ci"))
    from triton_sm90_compile import register_use

    print(f"triton {triton.__version__}: gluon_fwd_kernel D={dim} {stages} stages"
          f"{' split' if split else ''}{' overlap' if overlap else ''}"
          f"{' pingpong' if pingpong else ''} compiled for "
          f"sm90, shared memory {compiled.metadata.shared} bytes;"
          + register_use(compiled.asm["cubin"]))  # fmt: skip


def main(args) -> int:
    if args.compile_only:
        compile_only(args.stages, args.head_dim, args.split, args.overlap, args.pingpong)
        return 0
    import torch

    from turbo_dllm.kernels.selftest import block_diffusion_tokens

    dim = args.head_dim
    module = OP
    config = module.default_config(dim)
    gen = torch.Generator().manual_seed(0)
    s = 2 * args.seq_len

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(device="cuda", dtype=torch.bfloat16)

    def timed(fn) -> float:
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(args.repeats):
            start.record()
            fn()
            stop.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(stop))
        return statistics.median(times)

    # Correctness first on a small case with two documents and a stream no tile divides, then
    # the timed shape (one document per row, as the benchmark's).
    for seq_len, batch, doc_cut, timed_case in ((1000, 2, 333, False),
                                                (args.seq_len, args.batch, None, True)):  # fmt: skip
        meta = [t.cuda() for t in block_diffusion_tokens(seq_len, args.block_size, batch, doc_cut)]
        schedule = module.make_schedule(*meta, *meta)
        q = randn(batch, args.heads, 2 * seq_len, dim)
        k = randn(batch, args.kv_heads, 2 * seq_len, dim)
        v = randn(batch, args.kv_heads, 2 * seq_len, dim)
        scale = dim**-0.5
        want_out, want_lse = module.forward(q, k, v, schedule, scale, config)
        got_out, got_lse = gluon_forward(
            module, q, k, v, schedule, scale, args.stages, args.split, args.overlap, args.pingpong
        )
        torch.cuda.synchronize()
        out_error = float(
            (got_out.float() - want_out.float()).abs().max() / want_out.float().abs().max()
        )
        same_inf = bool(torch.equal(got_lse.isinf(), want_lse.isinf()))
        finite = ~want_lse.isinf()
        lse_error = float((got_lse[finite] - want_lse[finite]).abs().max())
        print(f"2L={2 * seq_len} B={batch} docs={doc_cut is not None}: out max |gluon - tl| / "
              f"max |tl| = {out_error:.3g}, lse max abs {lse_error:.3g}, same -inf rows "
              f"{same_inf}")  # fmt: skip
        if not (out_error < 3e-2 and lse_error < 1e-2 and same_inf):
            print("MISMATCH: the Gluon forward differs from the tl forward")
            return 1
        if timed_case:
            inputs = (q, k, v, schedule, scale)
            tl_ms = timed(lambda x=inputs: module.forward(*x, config))
            gl_ms = timed(
                lambda x=inputs: gluon_forward(
                    module, *x, args.stages, args.split, args.overlap, args.pingpong
                )
            )
            print(f"2L={s} B={args.batch} H={args.heads}/{args.kv_heads} D={dim} block "
                  f"{args.block_size}: forward tl {tl_ms:.3f} ms, gluon {gl_ms:.3f} ms "
                  f"({tl_ms / gl_ms:.2f}x)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main(ARGS))
