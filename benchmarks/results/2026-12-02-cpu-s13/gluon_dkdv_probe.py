"""Gluon dK/dV on sm90, compile only (session 13): the block-diffusion kernel's inner loop at its
default shape (128 keys x 64 queries, D = 128), one head, FlashAttention-3's layout: a one-warp
TMA producer (24 registers) streams Q and dO tiles through a 2-stage mbarrier ring to two
consumer warpgroups (240 registers each), which hold K and V in shared memory and dK, dV in
registers (each warpgroup 64 keys), compute S^T = K Q^T, P^T, dV += P^T dO, dP^T = V dO^T,
dS^T, dK += dS^T Q with wgmma, P^T and dS^T going to their MMAs through shared memory. Compiled
twice: over full tiles, and over partial ones (MASKED: the block-diffusion predicate from the
tokens' noisy / block / document metadata, as the Triton kernel's `_visible`). No tile lists, no
GQA loop, and its numbers were never run: the question is whether the loop keeps within the
registers (Triton's `tl` kernel spills, 8 instructions in its full-tile loop and 52 in its
partial-tile one: tl_dkdv_loop_spills.txt). gluon_dkdv_probe.txt holds the answer:
the cubin's spill stores and loads, and how many sit inside the loop.

    python gluon_dkdv_probe.py /tmp/triton36     # an unpacked triton 3.6.0 wheel (the H200's)
"""

import sys
from pathlib import Path

sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else "/tmp/triton36")
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import (  # noqa: E402
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

BN, BM, D, STAGES, WARPS = 128, 64, 128, 2, 8


@gluon.jit
def _loads(
    q_desc, do_desc, q_s, do_s, ready, empty, n_tiles, BM: gl.constexpr, STAGES: gl.constexpr
):
    for i in range(0, n_tiles):
        s = i % STAGES
        mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(s), q_desc.block_type.nbytes + do_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [i * BM, 0], ready.index(s), q_s.index(s))
        tma.async_copy_global_to_shared(do_desc, [i * BM, 0], ready.index(s), do_s.index(s))


@gluon.jit
def _math(
    dk_ptr,
    dv_ptr,
    lse2_ptr,
    delta_ptr,
    qn_ptr,
    qb_ptr,
    qd_ptr,
    kn_ptr,
    kb_ptr,
    kd_ptr,
    k_s,
    v_s,
    q_s,
    do_s,
    p_s,
    ds_s,
    ready,
    empty,
    n_tiles,
    qk_scale,
    BN: gl.constexpr,
    BM: gl.constexpr,
    D: gl.constexpr,
    STAGES: gl.constexpr,
    WARPS: gl.constexpr,
    MASKED: gl.constexpr,
):
    # S^T, dP^T: [BN keys, BM queries]; dK, dV: [BN keys, D]; keys split over the warpgroups
    mma_s: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, BM, 16]
    )
    mma_d: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, D, 16]
    )
    cols: gl.constexpr = gl.SliceLayout(0, mma_s)
    dk = gl.zeros([BN, D], gl.float32, mma_d)
    dv = gl.zeros([BN, D], gl.float32, mma_d)
    offs = gl.arange(0, BM, layout=cols)
    if MASKED:  # the key tile's metadata, once
        krows = gl.arange(0, BN, layout=gl.SliceLayout(1, mma_s))
        kn = gl.load(kn_ptr + krows) != 0
        kb = gl.load(kb_ptr + krows)
        kd = gl.load(kd_ptr + krows)
    zero = gl.zeros([BN, BM], gl.float32, mma_s)  # shape and layout only (use_acc=False)
    for i in range(0, n_tiles):
        s = i % STAGES
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        q = q_s.index(s)
        do = do_s.index(s)
        s_t = warpgroup_mma(k_s, q.permute((1, 0)), zero, use_acc=False, is_async=True)
        s_t = warpgroup_mma_wait(0, deps=[s_t])
        lse2 = gl.load(lse2_ptr + i * BM + offs)  # loaded where used: short live ranges
        p_t = gl.exp2(s_t * qk_scale - lse2[None, :])
        if MASKED:  # a partial tile: the block-diffusion predicate per (key row, query column)
            qn = gl.load(qn_ptr + i * BM + offs) != 0
            qb = gl.load(qb_ptr + i * BM + offs)
            qd = gl.load(qd_ptr + i * BM + offs)
            visible = (
                (qn[None, :] & kn[:, None] & (qb[None, :] == kb[:, None]))
                | (qn[None, :] & ~kn[:, None] & (kb[:, None] < qb[None, :]))
                | (~qn[None, :] & ~kn[:, None] & (kb[:, None] <= qb[None, :]))
            ) & (qd[None, :] == kd[:, None])
            p_t = gl.where(visible, p_t, 0.0)
        p_s.store(p_t.to(gl.bfloat16))  # P^T and dS^T go to the MMAs from shared memory
        fence_async_shared()
        gl.thread_barrier()
        dv = warpgroup_mma(p_s, do, dv, is_async=True)
        dp_t = warpgroup_mma(v_s, do.permute((1, 0)), zero, use_acc=False, is_async=True)
        dp_t = warpgroup_mma_wait(0, deps=[dp_t])
        delta = gl.load(delta_ptr + i * BM + offs)
        ds_s.store((p_t * (dp_t - delta[None, :])).to(gl.bfloat16))
        fence_async_shared()
        gl.thread_barrier()
        dk = warpgroup_mma(ds_s, q, dk, is_async=True)
        dv, dk = warpgroup_mma_wait(0, deps=[dv, dk])
        mbarrier.arrive(empty.index(s), count=1)
    rows = gl.arange(0, BN, layout=gl.SliceLayout(1, mma_d))
    dcols = gl.arange(0, D, layout=gl.SliceLayout(0, mma_d))
    gl.store(dk_ptr + rows[:, None] * D + dcols[None, :], dk.to(gl.bfloat16))
    gl.store(dv_ptr + rows[:, None] * D + dcols[None, :], dv.to(gl.bfloat16))


@gluon.jit
def dkdv(
    q_ptr,
    k_ptr,
    v_ptr,
    do_ptr,
    dk_ptr,
    dv_ptr,
    lse2_ptr,
    delta_ptr,
    qn_ptr,
    qb_ptr,
    qd_ptr,
    kn_ptr,
    kb_ptr,
    kd_ptr,
    Sq,
    qk_scale,
    BN: gl.constexpr,
    BM: gl.constexpr,
    D: gl.constexpr,
    STAGES: gl.constexpr,
    WARPS: gl.constexpr,
    MASKED: gl.constexpr,
):
    smem: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    q_desc = tma.make_tensor_descriptor(q_ptr, [Sq, D], [D, 1], [BM, D], smem)
    do_desc = tma.make_tensor_descriptor(do_ptr, [Sq, D], [D, 1], [BM, D], smem)
    kv_desc_k = tma.make_tensor_descriptor(k_ptr, [BN, D], [D, 1], [BN, D], smem)
    kv_desc_v = tma.make_tensor_descriptor(v_ptr, [BN, D], [D, 1], [BN, D], smem)
    k_s = gl.allocate_shared_memory(gl.bfloat16, [BN, D], smem)
    v_s = gl.allocate_shared_memory(gl.bfloat16, [BN, D], smem)
    q_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BM, D], smem)
    p_s = gl.allocate_shared_memory(gl.bfloat16, [BN, BM], smem)
    ds_s = gl.allocate_shared_memory(gl.bfloat16, [BN, BM], smem)
    do_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BM, D], smem)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    fence_async_shared()
    mbarrier.expect(kv_bar, 2 * BN * D * 2)
    tma.async_copy_global_to_shared(kv_desc_k, [0, 0], kv_bar, k_s)
    tma.async_copy_global_to_shared(kv_desc_v, [0, 0], kv_bar, v_s)
    mbarrier.wait(kv_bar, 0)
    n_tiles = gl.cdiv(Sq, BM)
    gl.warp_specialize(
        [
            (
                _math,
                (
                    dk_ptr,
                    dv_ptr,
                    lse2_ptr,
                    delta_ptr,
                    qn_ptr,
                    qb_ptr,
                    qd_ptr,
                    kn_ptr,
                    kb_ptr,
                    kd_ptr,
                    k_s,
                    v_s,
                    q_s,
                    do_s,
                    p_s,
                    ds_s,
                    ready,
                    empty,
                    n_tiles,
                    qk_scale,
                    BN,
                    BM,
                    D,
                    STAGES,
                    WARPS,
                    MASKED,
                ),
            ),
            (_loads, (q_desc, do_desc, q_s, do_s, ready, empty, n_tiles, BM, STAGES)),
        ],
        [1],
        [24],
    )


if __name__ == "__main__":
    import re
    import subprocess
    import tempfile

    from triton.experimental.gluon._runtime import GluonASTSource

    sig = {n: "*bf16" for n in ("q_ptr", "k_ptr", "v_ptr", "do_ptr", "dk_ptr", "dv_ptr")}
    sig |= {"lse2_ptr": "*fp32", "delta_ptr": "*fp32", "Sq": "i32", "qk_scale": "fp32"}
    sig |= {"qn_ptr": "*i8", "kn_ptr": "*i8"}
    sig |= {n: "*i32" for n in ("qb_ptr", "qd_ptr", "kb_ptr", "kd_ptr")}
    sig |= {n: "constexpr" for n in ("BN", "BM", "D", "STAGES", "WARPS", "MASKED")}
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    for masked in (False, True):
        constants = dict(BN=BN, BM=BM, D=D, STAGES=STAGES, WARPS=WARPS, MASKED=masked)
        src = GluonASTSource(dkdv, sig, constants)
        k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": WARPS})
        ptx = k.asm["ptx"]
        print(f"{'partial tiles (masked)' if masked else 'full tiles'}: triton {triton.__version__}, "
              f"sm90, shared memory {k.metadata.shared} bytes")  # fmt: skip
        print(
            "  setmaxnreg:", sorted({ln.strip() for ln in ptx.splitlines() if "setmaxnreg" in ln})
        )
        with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
            handle.write(k.asm["cubin"])
            handle.flush()
            usage = subprocess.run([tool, "--dump-resource-usage", handle.name],
                                   capture_output=True, text=True).stdout  # fmt: skip
            sass = subprocess.run([tool, "-sass", handle.name], capture_output=True,
                                  text=True).stdout  # fmt: skip
        print("  resources:", " ".join(re.findall(r"(REG:\d+|STACK:\d+)", usage)))
        code = [line for line in sass.splitlines() if re.search(r"/\*[0-9a-f]{4}\*/", line)]
        mma = [i for i, line in enumerate(code) if "HGMMA" in line]
        # the loop: from the target of the first backward branch after the last HGMMA to it
        address = [int(re.search(r"/\*([0-9a-f]{4})\*/", line)[1], 16) for line in code]
        back = next(i for i in range(mma[-1], len(code))
                    if (m := re.search(r"BRA 0x([0-9a-f]+)", code[i])) and int(m[1], 16) < address[i])  # fmt: skip
        top = address.index(int(re.search(r"BRA 0x([0-9a-f]+)", code[back])[1], 16))
        spills = [(i, "STL" if "STL" in line else "LDL") for i, line in enumerate(code)
                  if re.search(r"\b(STL|LDL)", line)]  # fmt: skip
        inside = [kind for i, kind in spills if top <= i <= back]
        print(f"  the loop: SASS lines {top}-{back} of {len(code)}, {len(mma)} HGMMA in it")
        print(f"  spill stores/loads: {sum(k == 'STL' for _, k in spills)}/"
              f"{sum(k == 'LDL' for _, k in spills)} in all, {len(inside)} inside the loop")  # fmt: skip
