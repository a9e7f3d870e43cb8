"""Prototype: the block-diffusion dK/dV kernel in Gluon, FlashAttention-3's layout, against the
op's Triton (`tl`) dK/dV kernel on one GPU: the same inputs, dK and dV compared, both timed.

    python benchmarks/attention_gluon_dkdv.py                        # H200: check and time
    python benchmarks/attention_gluon_dkdv.py --compile-only [--triton-path DIR]   # any host

Not part of the op yet. The `tl` kernel holds dK and dV for 128 keys x D = 128 in registers and
spills in its inner loop (Triton 3.6 gives each thread at most 255 registers), which keeps it at
~320 useful TFLOP/s (docs/benchmarks.md). Here one warp (24 registers) streams the Q and dO tiles
of the key tile's query tiles through a ring of shared-memory stages with TMA and mbarriers, and
two consumer warpgroups (240 registers each, 64 keys each) keep K and V in shared memory and
dK, dV in registers: S^T = K Q^T, P^T = exp2(S^T - lse), dV += P^T dO, dP^T = V dO^T,
dS^T = P^T (dP^T - delta), dK += dS^T Q, with P^T and dS^T passed to their wgmmas through
shared memory. The tile lists, the block-diffusion predicate on partial tiles, GQA and the
numbers (lse2 in log2 units, delta, the sm scale on dK) are the op's own: its plan
(`by_key_tile`), forward and `backward_prepare` make the inputs. Compiled for sm90 with Triton
3.6.0 on a host without a GPU (164 KB of shared memory): 8 spill instructions inside the
full-tile loop and 41 inside the partial-tile one (the query tile's metadata, in registers),
where the `tl` kernel has 8 and 52 (the one-head probe without the GQA loop, 0 and 0). Written against Triton 3.6's Gluon, the H200's (Gluon
is experimental: 3.9 renamed `tma.async_copy_global_to_shared` to `async_load`), without a GPU
at hand (session 13). Its first run, on an H200 in session 14: dK and dV bit for bit the `tl`
kernel's, at 0.95-0.97x its speed (2L 16K and 32K, blocks 32 and 64, 2-4 stages;
`results/2026-12-02-h200-s14/gluon_dkdv.txt`): the spills were not what holds dK/dV back.
`--rs` (`_tile_rs`, session 16) hands P^T and dS^T to the dV and dK wgmmas in registers (the
accumulator layout of S^T is the A operand's: no shuffles, no shared-memory round trip, fence or
barrier) and issues dP^T right behind S^T, so the tensor cores run it while the warps
exponentiate: on the H200 dK and dV again bit for bit the `tl` kernel's, at **1.12x** its speed
(8.86 against 9.96 ms, 2L 16K, block 32) and 1.13x with 3 stages
(`results/2026-12-02-h200-s16/gluon_rs/`).
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
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument(
        "--rs", action="store_true",
        help="P^T and dS^T to their wgmmas in registers, dP^T issued behind S^T (`_tile_rs`)",
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

# Triton 3.9 renamed the TMA load (the old name raises there); 3.6, the H200's, has only the old
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared

BN, BM, D, WARPS = 128, 64, 128, 8  # keys per program, queries per tile, head dim, consumer warps


@gluon.jit
def _loads(q_desc, do_desc, q_s, do_s, ready, empty, IDX, COUNT, row, Mt, b, hk, H, GROUP, Sq,
           BM: gl.constexpr, STAGES: gl.constexpr):  # fmt: skip
    """The producer warp: every (head, query tile) of the key tile, full tiles first, in the
    consumers' order; stage `it % STAGES` once the consumers released it."""
    n_tiles = gl.load(COUNT + row * 3) + gl.load(COUNT + row * 3 + 1)
    idx = IDX + row.to(gl.int64) * Mt
    it = 0
    for g in range(0, GROUP):
        first = (b * H + hk * GROUP + g) * Sq  # the head's first row in the (B*H*Sq, D) view
        for j in range(0, n_tiles):
            m0 = gl.load(idx + j) * BM
            s = it % STAGES
            mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
            mbarrier.expect(ready.index(s), q_desc.block_type.nbytes + do_desc.block_type.nbytes)
            _tma_load(q_desc, [first + m0, 0], ready.index(s), q_s.index(s))
            _tma_load(do_desc, [first + m0, 0], ready.index(s), do_s.index(s))
            it += 1


@gluon.jit
def _tile(dk, dv, k_s, v_s, q, do, p_s, ds_s, LSE2, DELTA, QN, QB, QD, stat, m0, b, Sq,
          stride_qdb, kn, kb, kd, krow_ok, qk_scale, BN: gl.constexpr, BM: gl.constexpr,
          WARPS: gl.constexpr, MASKED: gl.constexpr):  # fmt: skip
    """One (query tile, key tile) pair: dK and dV of the consumers' 128 keys, updated."""
    mma_s: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, BM, 16]
    )
    offs = m0 + gl.arange(0, BM, layout=gl.SliceLayout(0, mma_s))
    zero = gl.zeros([BN, BM], gl.float32, mma_s)  # shape and layout only (use_acc=False)
    s_t = warpgroup_mma(k_s, q.permute((1, 0)), zero, use_acc=False, is_async=True)
    s_t = warpgroup_mma_wait(0, deps=[s_t])
    if MASKED:
        q_ok = offs < Sq
        lse2 = gl.load(LSE2 + stat + offs, mask=q_ok, other=float("inf"))
        p_t = gl.exp2(s_t * qk_scale - lse2[None, :])
        qn = gl.load(QN + offs, mask=q_ok, other=0) != 0
        qb = gl.load(QB + offs, mask=q_ok, other=-1)
        qd = gl.load(QD + b * stride_qdb + offs, mask=q_ok, other=-1)
        visible = (
            (qn[None, :] & kn[:, None] & (qb[None, :] == kb[:, None]))
            | (qn[None, :] & ~kn[:, None] & (kb[:, None] < qb[None, :]))
            | (~qn[None, :] & ~kn[:, None] & (kb[:, None] <= qb[None, :]))
        ) & (qd[None, :] == kd[:, None])
        visible = visible & q_ok[None, :] & krow_ok[:, None]
        p_t = gl.where(visible, p_t, 0.0)
    else:  # every pair allowed, every row and column in bounds
        lse2 = gl.load(LSE2 + stat + offs)
        p_t = gl.exp2(s_t * qk_scale - lse2[None, :])
    p_s.store(p_t.to(gl.bfloat16))
    fence_async_shared()
    gl.thread_barrier()
    # wgmma groups complete in issue order: dP^T first, so waiting for all but the newest (dV's)
    # waits for dP^T
    dp_t = warpgroup_mma(v_s, do.permute((1, 0)), zero, use_acc=False, is_async=True)
    dv = warpgroup_mma(p_s, do, dv, is_async=True)
    dp_t = warpgroup_mma_wait(1, deps=[dp_t])
    if MASKED:
        delta = gl.load(DELTA + stat + offs, mask=offs < Sq, other=0.0)
    else:
        delta = gl.load(DELTA + stat + offs)
    ds_s.store((p_t * (dp_t - delta[None, :])).to(gl.bfloat16))
    fence_async_shared()
    gl.thread_barrier()
    dk = warpgroup_mma(ds_s, q, dk, is_async=True)
    dv, dk = warpgroup_mma_wait(0, deps=[dv, dk])
    return dk, dv


@gluon.jit
def _tile_rs(dk, dv, k_s, v_s, q, do, LSE2, DELTA, QN, QB, QD, stat, m0, b, Sq, stride_qdb, kn,
             kb, kd, krow_ok, qk_scale, BN: gl.constexpr, BM: gl.constexpr, D: gl.constexpr,
             WARPS: gl.constexpr, MASKED: gl.constexpr):  # fmt: skip
    """`_tile` with P^T and dS^T handed to their wgmmas in registers (no shared-memory round
    trip, fence or barrier) and dP^T issued right behind S^T, so the tensor cores compute it
    while the warps exponentiate S^T, and dS^T is computed while dV's wgmma runs."""
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
    s_t = warpgroup_mma_wait(1, deps=[s_t])  # groups complete in issue order: S^T, not dP^T
    if MASKED:
        q_ok = offs < Sq
        lse2 = gl.load(LSE2 + stat + offs, mask=q_ok, other=float("inf"))
        p_t = gl.exp2(s_t * qk_scale - lse2[None, :])
        qn = gl.load(QN + offs, mask=q_ok, other=0) != 0
        qb = gl.load(QB + offs, mask=q_ok, other=-1)
        qd = gl.load(QD + b * stride_qdb + offs, mask=q_ok, other=-1)
        visible = (
            (qn[None, :] & kn[:, None] & (qb[None, :] == kb[:, None]))
            | (qn[None, :] & ~kn[:, None] & (kb[:, None] < qb[None, :]))
            | (~qn[None, :] & ~kn[:, None] & (kb[:, None] <= qb[None, :]))
        ) & (qd[None, :] == kd[:, None])
        visible = visible & q_ok[None, :] & krow_ok[:, None]
        p_t = gl.where(visible, p_t, 0.0)
        delta = gl.load(DELTA + stat + offs, mask=q_ok, other=0.0)
    else:  # every pair allowed, every row and column in bounds
        lse2 = gl.load(LSE2 + stat + offs)
        p_t = gl.exp2(s_t * qk_scale - lse2[None, :])
        delta = gl.load(DELTA + stat + offs)
    p_op = gl.convert_layout(p_t.to(gl.bfloat16), a_op)
    dv = warpgroup_mma(p_op, do, dv, is_async=True)
    dp_t, p_op = warpgroup_mma_wait(1, deps=[dp_t, p_op])  # dP^T done; dV may still run
    ds_op = gl.convert_layout((p_t * (dp_t - delta[None, :])).to(gl.bfloat16), a_op)
    dk = warpgroup_mma(ds_op, q, dk, is_async=True)
    dv, dk, p_op, ds_op = warpgroup_mma_wait(0, deps=[dv, dk, p_op, ds_op])
    return dk, dv


@gluon.jit
def _math(DK, DV, LSE2, DELTA, QN, QB, QD, KN, KB, KD, k_s, v_s, q_s, do_s, p_s, ds_s, ready,
          empty, IDX, COUNT, row, Mt, b, hk, n0, H, HK, GROUP, Sq, Sk, stride_qdb, stride_kdb,
          qk_scale, sm_scale, BN: gl.constexpr, BM: gl.constexpr, D: gl.constexpr,
          STAGES: gl.constexpr, WARPS: gl.constexpr, RS: gl.constexpr):  # fmt: skip
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
            if RS:
                dk, dv = _tile_rs(dk, dv, k_s, v_s, q_s.index(s), do_s.index(s), LSE2, DELTA, QN,
                                  QB, QD, stat, gl.load(idx + j) * BM, b, Sq, stride_qdb, kn, kb,
                                  kd, krow_ok, qk_scale, BN, BM, D, WARPS, False)  # fmt: skip
            else:
                dk, dv = _tile(dk, dv, k_s, v_s, q_s.index(s), do_s.index(s), p_s, ds_s, LSE2,
                               DELTA, QN, QB, QD, stat, gl.load(idx + j) * BM, b, Sq, stride_qdb,
                               kn, kb, kd, krow_ok, qk_scale, BN, BM, WARPS, False)  # fmt: skip
            mbarrier.arrive(empty.index(s), count=1)
            it += 1
        for j in range(n_full, n_full + n_partial):
            s = it % STAGES
            mbarrier.wait(ready.index(s), (it // STAGES) & 1)
            if RS:
                dk, dv = _tile_rs(dk, dv, k_s, v_s, q_s.index(s), do_s.index(s), LSE2, DELTA, QN,
                                  QB, QD, stat, gl.load(idx + j) * BM, b, Sq, stride_qdb, kn, kb,
                                  kd, krow_ok, qk_scale, BN, BM, D, WARPS, True)  # fmt: skip
            else:
                dk, dv = _tile(dk, dv, k_s, v_s, q_s.index(s), do_s.index(s), p_s, ds_s, LSE2,
                               DELTA, QN, QB, QD, stat, gl.load(idx + j) * BM, b, Sq, stride_qdb,
                               kn, kb, kd, krow_ok, qk_scale, BN, BM, WARPS, True)  # fmt: skip
            mbarrier.arrive(empty.index(s), count=1)
            it += 1
    rows = n0 + gl.arange(0, BN, layout=gl.SliceLayout(1, mma_d))
    cols = gl.arange(0, D, layout=gl.SliceLayout(0, mma_d))
    at = ((b * HK + hk) * Sk + rows).to(gl.int64)[:, None] * D + cols[None, :]
    ok = (rows < Sk)[:, None]
    gl.store(DK + at, (dk * sm_scale).to(gl.bfloat16), mask=ok)
    gl.store(DV + at, dv.to(gl.bfloat16), mask=ok)


@gluon.jit
def gluon_dkdv_kernel(Q, K, V, DO, DK, DV, LSE2, DELTA, QN, QB, QD, KN, KB, KD, IDX, COUNT,
                      qk_scale, sm_scale, H, HK, GROUP, Sq, Sk, Mt, Nt, PER_BATCH, ROWS_Q,
                      ROWS_K, stride_qdb, stride_kdb, BN: gl.constexpr, BM: gl.constexpr,
                      D: gl.constexpr, STAGES: gl.constexpr, WARPS: gl.constexpr,
                      RS: gl.constexpr):  # fmt: skip
    """One key tile of one KV head (grid: key tiles x batch * KV heads). Q, K, V, dO, dK, dV
    contiguous (B, heads, S, D), read as (B * heads * S, D) through TMA descriptors."""
    n_tile = gl.program_id(0)
    b = gl.program_id(1) // HK
    hk = gl.program_id(1) % HK
    row = b * PER_BATCH * Nt + n_tile  # the key tile's row of the op's tile lists
    n0 = n_tile * BN
    smem: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    q_desc = tma.make_tensor_descriptor(Q, [ROWS_Q, D], [D, 1], [BM, D], smem)
    do_desc = tma.make_tensor_descriptor(DO, [ROWS_Q, D], [D, 1], [BM, D], smem)
    k_desc = tma.make_tensor_descriptor(K, [ROWS_K, D], [D, 1], [BN, D], smem)
    v_desc = tma.make_tensor_descriptor(V, [ROWS_K, D], [D, 1], [BN, D], smem)
    k_s = gl.allocate_shared_memory(gl.bfloat16, [BN, D], smem)
    v_s = gl.allocate_shared_memory(gl.bfloat16, [BN, D], smem)
    q_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BM, D], smem)
    do_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BM, D], smem)
    p_s = gl.allocate_shared_memory(gl.bfloat16, [BN, BM], smem)
    ds_s = gl.allocate_shared_memory(gl.bfloat16, [BN, BM], smem)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    fence_async_shared()
    # K and V of this key tile, once (rows past the tensor's end arrive as zeros; rows of the
    # next head past Sk are masked out of P and the stores)
    mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    key0 = (b * HK + hk) * Sk + n0
    _tma_load(k_desc, [key0, 0], kv_bar, k_s)
    _tma_load(v_desc, [key0, 0], kv_bar, v_s)
    mbarrier.wait(kv_bar, 0)
    gl.warp_specialize(
        [(_math, (DK, DV, LSE2, DELTA, QN, QB, QD, KN, KB, KD, k_s, v_s, q_s, do_s, p_s, ds_s,
                  ready, empty, IDX, COUNT, row, Mt, b, hk, n0, H, HK, GROUP, Sq, Sk, stride_qdb,
                  stride_kdb, qk_scale, sm_scale, BN, BM, D, STAGES, WARPS, RS)),
         (_loads, (q_desc, do_desc, q_s, do_s, ready, empty, IDX, COUNT, row, Mt, b, hk, H, GROUP,
                   Sq, BM, STAGES))],
        [1],
        [24],
    )  # fmt: skip


def gluon_backward_dkdv(
    module, grad_out, delta, lse2, q, k, v, schedule, scale, stages=2, rs=False
):
    """(dk, dv) like the op's (`module`) `backward_dkdv`, from the Gluon kernel."""
    import torch
    import triton

    batch, heads, sq, dim = q.shape
    kv_heads, sk = k.shape[1], k.shape[2]
    assert dim == D and all(t.is_contiguous() for t in (q, k, v, grad_out))
    qn, qb, qd = schedule.q_meta
    kn, kb, kd = schedule.k_meta
    cols = schedule.by_key_tile(BM, BN)
    rows, nt, mt = cols.index.shape
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    # device-side TMA descriptors are written to a scratch buffer Triton asks for
    triton.set_allocator(
        lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda")
    )
    gluon_dkdv_kernel[(nt, batch * kv_heads)](
        q, k, v, grad_out, dk, dv, lse2, delta, qn, qb, qd, kn, kb, kd,
        cols.index, cols.count, scale * 1.4426950408889634, scale,
        heads, kv_heads, heads // kv_heads, sq, sk, mt, nt, int(rows > 1),
        batch * heads * sq, batch * kv_heads * sk,
        *module._doc_strides(schedule),
        BN=BN, BM=BM, D=D, STAGES=stages, WARPS=WARPS, RS=rs, num_warps=WARPS,
    )  # fmt: skip
    return dk, dv


def compile_only(stages: int, rs: bool) -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    names = gluon_dkdv_kernel.arg_names
    sig = {n: "*bf16" for n in ("Q", "K", "V", "DO", "DK", "DV")}
    sig |= {"LSE2": "*fp32", "DELTA": "*fp32", "QN": "*i8", "KN": "*i8"}
    sig |= {n: "*i32" for n in ("QB", "QD", "KB", "KD", "IDX", "COUNT")}
    sig |= {"qk_scale": "fp32", "sm_scale": "fp32"}
    sig |= {n: "constexpr" for n in ("BN", "BM", "D", "STAGES", "WARPS", "RS")}
    sig |= {n: "i32" for n in names if n not in sig}
    constants = dict(BN=BN, BM=BM, D=D, STAGES=stages, WARPS=WARPS, RS=rs)
    source = GluonASTSource(gluon_dkdv_kernel, {n: sig[n] for n in names}, constants)
    compiled = triton.compile(
        source, target=GPUTarget("cuda", 90, 32), options={"num_warps": WARPS}
    )
    sys.path.insert(0, str(ROOT / "ci"))
    from triton_sm90_compile import register_use

    print(f"triton {triton.__version__}: gluon_dkdv_kernel compiled for sm90, shared memory "
          f"{compiled.metadata.shared} bytes;" + register_use(compiled.asm["cubin"]))  # fmt: skip


def main(args) -> int:
    if args.compile_only:
        compile_only(args.stages, args.rs)
        return 0
    import torch

    sys.path.insert(0, str(ROOT))
    from turbo_dllm.kernels.selftest import block_diffusion_tokens
    from turbo_dllm.kernels.triton_ops import triton_module

    module = triton_module("block_diffusion_attention", "jit")
    config = module.default_config(D)
    meta = [
        t.cuda() for t in block_diffusion_tokens(args.seq_len, args.block_size, args.batch, None)
    ]
    schedule = module.make_schedule(*meta, *meta)
    gen = torch.Generator().manual_seed(0)
    s = 2 * args.seq_len

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(device="cuda", dtype=torch.bfloat16)

    q = randn(args.batch, args.heads, s, D)
    k, v = randn(args.batch, args.kv_heads, s, D), randn(args.batch, args.kv_heads, s, D)
    scale = D**-0.5
    out, lse = module.forward(q, k, v, schedule, scale, config)
    grad_out, delta, lse2 = module.backward_prepare(randn(*q.shape), None, q, out, lse)

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

    reference = module.backward_dkdv(grad_out, delta, lse2, q, k, v, schedule, scale, config)
    mine = gluon_backward_dkdv(
        module, grad_out, delta, lse2, q, k, v, schedule, scale, args.stages, args.rs
    )
    worst = 0.0
    for name, want, got in zip(("dk", "dv"), reference, mine, strict=True):
        error = float((got.float() - want.float()).abs().max() / want.float().abs().max())
        worst = max(worst, error)
        print(f"{name}: max |gluon - tl| / max |tl| = {error:.3g}")
    if not worst < 3e-2:  # the GPU tests' tolerance against the reference (NaN fails too)
        print("MISMATCH: the Gluon kernel's dK/dV differ from the tl kernel's")
        return 1
    tl_ms = timed(lambda: module.backward_dkdv(grad_out, delta, lse2, q, k, v, schedule, scale,
                                               config))  # fmt: skip
    gl_ms = timed(lambda: gluon_backward_dkdv(module, grad_out, delta, lse2, q, k, v, schedule,
                                              scale, args.stages, args.rs))  # fmt: skip
    print(f"2L={s} B={args.batch} H={args.heads}/{args.kv_heads} block {args.block_size}: dK/dV "
          f"tl {tl_ms:.3f} ms, gluon {gl_ms:.3f} ms ({tl_ms / gl_ms:.2f}x)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main(ARGS))
