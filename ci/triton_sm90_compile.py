"""Compile block_diffusion_attention's sweep variants for sm90 on a host without a GPU.

    python ci/triton_sm90_compile.py [--head-dim 128] [--only runs] [--triton-path DIR]
    python ci/triton_sm90_compile.py --defaults --head-dim 64    # what ships (a CPU test runs it)

`triton.compile` for `GPUTarget("cuda", 90, 32)` runs the whole pipeline (TTIR, TTGIR, LLVM,
PTX, ptxas to a cubin) without a driver, so API misuse, shared-memory overflow and pass failures
show here before GPU time is spent (a variant asking more shared memory than an sm90 block may
use, 227 KB, fails here as it would at launch). Per kernel and variant it prints ok/FAILED, the
shared memory, the `ttg.async_wait {num = N}` of the full-tile loop (N > 0: copies stay in flight
across iterations, i.e. the loop is software-pipelined), and, from the cubin (Triton's own
cuobjdump), the registers per thread, the stack and the local-memory stores and loads of register
spills. To check against the GPU host's Triton, put an unpacked wheel of that version first
(`--triton-path`, e.g. `pip download triton==3.6.0` and unzip).
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
import time
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "native/block_diffusion_attention"
# upper-case scalars (the other upper-case arguments are pointers)
SIZES = {"H", "HK", "GROUP", "PER_BATCH", "ROWS_Q", "ROWS_K", "CHUNK"}
BF16 = {"Q", "K", "V", "OUT", "DO", "DK", "DV", "DQ"}
F32 = {"LSE", "LSE2", "DELTA", "DQ_ACC"}
I8 = {"QN", "KN"}
SM90_SHARED_BYTES = 232448  # the most dynamic shared memory one block may use on H100/H200


def _module():
    spec = importlib.util.spec_from_file_location(
        "bda_sm90", SOURCE / "block_diffusion_attention.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["bda_sm90"] = module
    spec.loader.exec_module(module)
    return module


def _signature(fn, tma: int, rows: int, dim: int, constexprs: dict):
    """Argument types as a launch at the trainer's shapes gives them (16-divisible pointers,
    strides and sequence lengths)."""
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            sig[name] = "constexpr"
            continue
        if name in ("A_TMA", "B_TMA"):
            sig[name] = f"tensordesc<bf16[1, 1, {rows}, {dim}]>" if tma == 1 else "*bf16"
        elif name in BF16:
            sig[name] = "*bf16"
        elif name in F32:
            sig[name] = "*fp32"
        elif name in I8:
            sig[name] = "*i8"
        elif name.isupper() and name not in SIZES:
            sig[name] = "*i32"
        elif name in ("qk_scale", "sm_scale"):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
        if sig[name].startswith("*") or name.startswith("stride") or name in ("Sq", "Sk"):
            attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, attrs


def compile_variant(module, kernel: str, config, dim: int):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    part = config.part(kernel)
    if kernel == "dkdv" and part["gluon"]:  # as `_gluon_backward_dkdv` launches it
        return compile_gluon(
            module._gluon_dkdv_kernel,
            module.GLUON_DKDV_TILE,
            dim,
            part["stages"],
            bool(part["split"]),
            DQ=bool(part["dq"]),
        )
    if kernel == "dq" and part["gluon"]:  # as `_gluon_backward_dq` launches it
        return compile_gluon(
            module._gluon_dq_kernel, module.GLUON_DQ_TILE, dim, part["stages"], bool(part["split"])
        )
    fn = {"fwd": module._fwd_kernel, "dkdv": module._bwd_dkdv_kernel, "dq": module._bwd_dq_kernel}
    fn = fn[kernel]
    launch = module._launch(kernel, config, 1, 1, part["tma"])
    launch.pop("grid")
    options = {"num_warps": launch.pop("num_warps"), "num_stages": launch.pop("num_stages")}
    constexprs = dict(HEAD_DIM=dim, BLOCK_M=part["m"], BLOCK_N=part["n"], **launch)
    rows = part["m"] if kernel == "dkdv" else part["n"]
    sig, attrs = _signature(fn, part["tma"], rows, dim, constexprs)
    source = ASTSource(fn, sig, constexprs, attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def compile_gluon(fn, tile: tuple[int, int, int], dim: int, stages: int, split: bool,
                  **constexprs):  # fmt: skip
    """One of the op's Gluon kernels (`tile`: its query rows, key rows and consumer warps;
    `split`: each consumer warpgroup its own partition, launched on half the warps)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    block_m, block_n, warps = tile
    constexprs |= dict(BM=block_m, BN=block_n, D=dim, STAGES=stages, WARPS=warps, SPLIT=split)
    sig, attrs = _signature(fn, 0, block_m, dim, constexprs)
    source = GluonASTSource(fn, sig, constexprs, attrs)
    options = {"num_warps": warps // 2 if split else warps}
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def register_use(cubin: bytes) -> str:
    """ "regs R stack S spills STL/LDL" of a cubin, by the cuobjdump shipped in Triton's wheel
    ("" when it is missing)."""
    import subprocess
    import tempfile

    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.is_file():
        return ""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(cubin)
        handle.flush()
        usage = subprocess.run(
            [tool, "--dump-resource-usage", handle.name], capture_output=True, text=True
        ).stdout
        found = re.search(r"REG:(\d+) STACK:(\d+)", usage)
        if not found:
            return ""
        stores = loads = 0
        # Spill stores and loads (STL/LDL) use local memory: a kernel with no stack and no local
        # memory has none, and its disassembly (seconds a cubin) is not needed to say so.
        local = re.search(r"LOCAL:(\d+)", usage)
        if int(found[2]) or local is None or int(local[1]):
            sass = subprocess.run(
                [tool, "-sass", handle.name], capture_output=True, text=True
            ).stdout
            stores, loads = len(re.findall(r"\bSTL", sass)), len(re.findall(r"\bLDL", sass))
    return f" regs {found[1]} stack {found[2]:>4} spills {stores}/{loads}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--only", default=None, help="variants whose name contains this")
    parser.add_argument("--triton-path", type=Path, default=None, help="an unpacked Triton wheel")
    parser.add_argument(
        "--defaults", action="store_true", help="only each kernel's default config (what ships)"
    )
    args = parser.parse_args(argv)
    if args.triton_path:
        sys.path.insert(0, str(args.triton_path))
    import triton

    module = _module()
    print(f"triton {triton.__version__} from {Path(triton.__file__).parent}")
    failed = 0
    if args.defaults:
        default = module.default_config(args.head_dim)
        variants = {kernel: [("default", default)] for kernel in module.KERNELS}
    else:
        variants = _all_variants(module, args.head_dim)
    for kernel, entries in variants.items():
        for name, config in entries:
            if args.only and args.only not in name:
                continue
            tick = time.perf_counter()
            try:
                compiled = compile_variant(module, kernel, config, args.head_dim)
                if compiled.metadata.shared > SM90_SHARED_BYTES:
                    raise RuntimeError(
                        f"needs {compiled.metadata.shared} bytes of shared memory, an sm90 block "
                        f"may use {SM90_SHARED_BYTES}"
                    )
            except Exception as error:  # report and go on: one variant must not hide the rest
                failed += 1
                last = str(error).strip().splitlines()[-1:] or [type(error).__name__]
                print(f"{kernel:5} {name:28} FAILED {last[0][:200]}", flush=True)
                continue
            waits = re.findall(r"async_wait .*\{num = (\d+)", compiled.asm["ttgir"])
            print(
                f"{kernel:5} {name:28} ok {time.perf_counter() - tick:5.1f}s "
                f"smem {compiled.metadata.shared:>6} first-loop wait num={waits[0] if waits else '-'}"
                + register_use(compiled.asm["cubin"]),
                flush=True,
            )
    return 1 if failed else 0


def _all_variants(module, head_dim: int) -> dict[str, list]:
    """The sweep's variants, the fused-dQ kernel and the GPU tests' flag configs."""
    variants = module.sweep_variants(head_dim)
    # not a sweep entry (the sweep times kernels apart; this one replaces the dQ kernel)
    fused = module.tl_default(head_dim).with_part("dkdv", dq=1)
    variants["dkdv"] = [*variants["dkdv"], ("dq fused (atomics)", fused)]
    # and the GPU tests' configs, each kernel of them (their flags combined, not one at a time)
    for name, config in module.flag_configs(head_dim).items():
        for kernel in variants:
            variants[kernel].append((f"test: {name}", config))
    return variants


if __name__ == "__main__":
    raise SystemExit(main())
