"""Gluon on sm90, compile only (session 13): a warp-specialised matmul tile, a one-warp TMA
producer at 24 registers feeding a 4-warp wgmma consumer through mbarriers in a 3-stage ring:
the FlashAttention-3 structure a dK/dV kernel needs, in miniature. No GPU: `triton.compile` for
sm90 down to the cubin, then what the PTX and cubin hold (gluon_sm90_probe.txt).

    python gluon_sm90_probe.py /tmp/triton36     # an unpacked triton 3.6.0 wheel (the H200's)
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

BM, BN, BK, STAGES = 128, 128, 64, 3


@gluon.jit
def _producer(a_desc, b_desc, a_s, b_s, ready, empty, K, BK: gl.constexpr, STAGES: gl.constexpr):
    for i in range(0, gl.cdiv(K, BK)):
        s = i % STAGES
        mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(s), a_desc.block_type.nbytes + b_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(a_desc, [0, i * BK], ready.index(s), a_s.index(s))
        tma.async_copy_global_to_shared(b_desc, [0, i * BK], ready.index(s), b_s.index(s))


@gluon.jit
def _consumer(
    c_ptr,
    a_s,
    b_s,
    ready,
    empty,
    K,
    BM: gl.constexpr,
    BN: gl.constexpr,
    BK: gl.constexpr,
    STAGES: gl.constexpr,
):
    layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16]
    )
    acc = gl.zeros([BM, BN], gl.float32, layout)
    for i in range(0, gl.cdiv(K, BK)):
        s = i % STAGES
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        acc = warpgroup_mma(a_s.index(s), b_s.index(s).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=[acc])
        mbarrier.arrive(empty.index(s), count=1)
    rows = gl.arange(0, BM, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, BN, layout=gl.SliceLayout(0, layout))
    gl.store(c_ptr + rows[:, None] * BN + cols[None, :], acc.to(gl.bfloat16))


@gluon.jit
def matmul_ws(
    a_ptr,
    b_ptr,
    c_ptr,
    K,
    BM: gl.constexpr,
    BN: gl.constexpr,
    BK: gl.constexpr,
    STAGES: gl.constexpr,
):
    smem: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    a_desc = tma.make_tensor_descriptor(a_ptr, [BM, K], [K, 1], [BM, BK], smem)
    b_desc = tma.make_tensor_descriptor(b_ptr, [BN, K], [K, 1], [BN, BK], smem)
    a_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BM, BK], smem)
    b_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BN, BK], smem)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    fence_async_shared()
    gl.warp_specialize(
        [
            (_consumer, (c_ptr, a_s, b_s, ready, empty, K, BM, BN, BK, STAGES)),
            (_producer, (a_desc, b_desc, a_s, b_s, ready, empty, K, BK, STAGES)),
        ],
        [1],
        [24],
    )


if __name__ == "__main__":
    from triton.experimental.gluon._runtime import GluonASTSource

    sig = {
        "a_ptr": "*bf16",
        "b_ptr": "*bf16",
        "c_ptr": "*bf16",
        "K": "i32",
        "BM": "constexpr",
        "BN": "constexpr",
        "BK": "constexpr",
        "STAGES": "constexpr",
    }
    src = GluonASTSource(matmul_ws, sig, dict(BM=BM, BN=BN, BK=BK, STAGES=STAGES))
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    ptx = k.asm["ptx"]
    print(
        f"triton {triton.__version__}: compiled for sm90, shared memory {k.metadata.shared} bytes"
    )
    for what in ("setmaxnreg", "wgmma.mma_async", "cp.async.bulk.tensor", "mbarrier.try_wait"):
        print(f"  {what} in the PTX: {what in ptx}")
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "ci"))
    try:
        from triton_sm90_compile import register_use

        print("cubin:" + register_use(k.asm["cubin"]))
    except ImportError:
        pass
    print(
        "setmaxnreg lines:",
        sorted({line.strip() for line in ptx.splitlines() if "setmaxnreg" in line}),
    )
