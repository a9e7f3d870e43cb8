"""A cost model of CSBP against the context-parallel baseline, calibrated on our H200 measurements.

Runs on the CPU in a second. It predicts, per GPU, the step time and memory of one training step
of a block-diffusion model at a context length for two layouts of P GPUs sharing one sequence:

- `cp`   the baseline: both streams zigzag-sharded over P ranks; every layer all-gathers the K/V of
         the whole 2L stream (and reduce-scatters their gradients), with nothing to overlap it.
- `csbp` bp = P, cp = c (the best divisor of P): noisy blocks spread over all P ranks in dual-end
         pairs, the clean stream zigzag-sharded over c ranks and replicated over P / c groups;
         only clean K/V move (over c ranks), overlapped with the local noisy-block attention.

Per layer and rank, time = GEMMs (6 x matmul params x tokens, x 4/3 with activation
checkpointing) at the measured GEMM rate + attention pairs at the measured per-pair forward and
backward times (the forward twice with checkpointing) + exposed communication (ring all-gather /
reduce-scatter: (n - 1) steps of latency + chunk / bandwidth; the bandwidth of the slowest link
the ring crosses). Assumptions are printed with the table; all of them are arguments.

Calibration (`--calibrate`, on by default) reads what we measured:
- the 1-GPU profile of the 1.7B / 8K step (GEMM time, FlexAttention forward and backward) gives
  the kernel rates (results/2026-11-30-h200-s4/train_profile.txt, train_step.json);
- the 2-GPU CSBP and CP steps at 32K and 64K (uncompiled, one document per sequence) give one
  eager-overhead factor (measured / modelled), fitted over all four, and the error of each.

    python benchmarks/csbp_model.py                      # predictions for 8/16/64 GPUs, 128K-1M
    python benchmarks/csbp_model.py --json out.json      # also the numbers as JSON
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from turbo_dllm.registry import get_family  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
PROFILE = RESULTS / "2026-11-30-h200-s4" / "train_profile.txt"
MEASURED_2GPU = [
    RESULTS / "2026-11-30-h200" / "context_parallel.json",  # 32K
    RESULTS / "2026-11-30-h200-s4" / "context_parallel_64k.json",  # 64K
]


@dataclass(frozen=True)
class Hardware:
    gemm_tflops: float = 780.0  # achieved bf16 GEMM rate (calibrated from the profile)
    attn_fwd_pair_s: float = 0.0  # seconds per allowed (q, k) pair per layer, forward
    attn_bwd_pair_s: float = 0.0  # ... backward
    nvlink_gbps: float = 350.0  # achieved all-gather bus bandwidth inside a node, GB/s
    network_gbps: float = 45.0  # per GPU between nodes (8 x 400 Gb/s NICs per 8 GPUs), GB/s
    nvlink_latency_s: float = 15e-6  # per ring step
    network_latency_s: float = 30e-6
    gpus_per_node: int = 8
    eager_factor: float = 1.0  # measured / modelled, from the uncompiled 2-GPU runs
    hbm_gb: float = 141.0


@dataclass(frozen=True)
class Shape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    layer_params: int  # matmul parameters per layer
    vocab: int
    params: int

    @classmethod
    def preset(cls, name: str) -> Shape:
        c = get_family("qwen3").resolve_config(path=None, from_config=name)
        return cls(
            c.num_hidden_layers,
            c.hidden_size,
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim,
            c.layer_matmul_params,
            c.vocab_size,
            c.num_params(),
        )

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.kv_heads * self.head_dim * 2  # K and V, bf16


def pairs(seq_len: int, block: int, one_doc_per_block: bool) -> dict[str, float]:
    """Allowed attention pairs of one sequence, by mask part (docs/training.md's table)."""
    n = seq_len // block
    local = n * block * block  # noisy block with itself
    if one_doc_per_block:  # the probe layout of context_parallel.py: attention is O(L)
        return {"local": local, "prefix": 0.0, "clean": n * block * block}
    prefix = block * block * n * (n - 1) / 2  # noisy block i -> clean blocks < i
    clean = block * block * n * (n + 1) / 2  # clean block-causal
    return {"local": local, "prefix": prefix, "clean": clean}


def ring_time(bytes_per_rank: float, ranks: int, hw: Hardware) -> float:
    """All-gather (or reduce-scatter) of `bytes_per_rank` from each of `ranks` ranks."""
    if ranks <= 1:
        return 0.0
    crosses_nodes = ranks > hw.gpus_per_node
    bw = (hw.network_gbps if crosses_nodes else hw.nvlink_gbps) * 1e9
    latency = hw.network_latency_s if crosses_nodes else hw.nvlink_latency_s
    return (ranks - 1) * (latency + bytes_per_rank / bw)


def step(
    mode: str,
    gpus: int,
    seq_len: int,
    shape: Shape,
    hw: Hardware,
    *,
    block: int = 32,
    cp: int | None = None,
    checkpointing: bool = True,
    one_doc_per_block: bool = False,
) -> dict[str, float]:
    """Modelled step time (s) and its parts for one rank of a context group of `gpus` ranks."""
    p = pairs(seq_len, block, one_doc_per_block)
    recompute = 1.0 if checkpointing else 0.0
    passes = 2.0 + recompute  # K/V moves in the forward, the recomputed forward, the backward
    if mode == "cp":
        tokens = 2 * seq_len / gpus
        attn_pairs = sum(p.values()) / gpus
        overlap_s = 0.0  # the baseline waits for its all-gather
        comm_bytes = 2 * seq_len / gpus * shape.kv_bytes_per_token
        comm_ranks = gpus
        clean_replicas = 1
    elif mode == "csbp":
        c = cp or gpus
        tokens = seq_len / gpus + seq_len / c  # own noisy blocks + the clean shard of its group
        attn_pairs = (p["local"] + p["prefix"]) / gpus + p["clean"] / c
        overlap_s = 0.0
        comm_bytes = seq_len / c * shape.kv_bytes_per_token
        comm_ranks = c
        clean_replicas = gpus // c
        # the local noisy-block attention runs while the clean K/V arrive
        overlap_s = p["local"] / gpus * hw.attn_fwd_pair_s
    else:
        raise ValueError(mode)
    gemm_flops = 6.0 * shape.layer_params * tokens * (1 + recompute / 3)
    gemm_s = gemm_flops / (hw.gemm_tflops * 1e12)
    attn_s = attn_pairs * ((1 + recompute) * hw.attn_fwd_pair_s + hw.attn_bwd_pair_s)
    one_pass = ring_time(comm_bytes, comm_ranks, hw)
    comm_s = passes * one_pass
    exposed_s = max(0.0, comm_s - overlap_s * (1 + recompute))
    layer_s = gemm_s + attn_s + exposed_s
    head_s = 6.0 * shape.vocab * shape.hidden * (seq_len / gpus) / (hw.gemm_tflops * 1e12)
    total = hw.eager_factor * (shape.layers * layer_s + head_s)
    return {
        "step_s": total,
        "tokens_per_s": seq_len / total,  # L data tokens per step per context group
        "gemm_s": hw.eager_factor * shape.layers * gemm_s,
        "attention_s": hw.eager_factor * shape.layers * attn_s,
        "comm_s": shape.layers * comm_s,
        "exposed_comm_s": hw.eager_factor * shape.layers * exposed_s,
        "kv_bytes_per_layer_pass": comm_bytes * (comm_ranks - 1),
        "clean_replicas": clean_replicas,
        "memory_gb": memory_gb(mode, gpus, seq_len, shape, cp=cp, checkpointing=checkpointing),
    }


def memory_gb(mode: str, gpus: int, seq_len: int, shape: Shape, *, cp=None, checkpointing=True):
    """Per-GPU memory: sharded weights + fp32 grads/moments (FSDP over the context group), the
    checkpointed layer inputs of the rank's tokens, one layer's live activations, gathered K/V."""
    state = shape.params * (2 + 4 + 8) / gpus  # bf16 weights, fp32 grads, Adam moments
    if mode == "cp":
        tokens, gathered = 2 * seq_len / gpus, 2 * seq_len
    else:
        c = cp or gpus
        tokens, gathered = seq_len / gpus + seq_len / c, seq_len
    saved = shape.layers * tokens * shape.hidden * 2 if checkpointing else 0.0
    live = tokens * (shape.hidden * 10 + 3 * shape.layer_params // shape.hidden // 2) * 2
    kv = gathered * shape.kv_bytes_per_token * 2  # the gathered K/V and their gradients
    return (state + saved + live + kv) / 1e9


# --- calibration -----------------------------------------------------------------------------
def kernel_rates(shape: Shape) -> Hardware:
    """GEMM rate and per-pair attention times from the 1-GPU profile of the 1.7B / 8K step."""
    text = PROFILE.read_text()
    steps = int(re.match(r"(\d+) steps", text).group(1))

    def self_cuda_s(name: str) -> float:
        """The `Self CUDA` column of the profile row `name`, per step, in seconds."""
        for line in text.splitlines():
            fields = re.split(r"\s{2,}", line.strip())
            if fields[0] == name and len(fields) == 11:
                value = fields[6]
                scale = 1e-6 if value.endswith("us") else 1e-3
                return float(value.rstrip("mus")) * scale / steps
        raise ValueError(f"{PROFILE} has no row {name!r}")

    mm_s = self_cuda_s("aten::mm")
    fwd_s = self_cuda_s("triton_tem_fused__unsafe_view_flex_attention_transpose_view_3")
    bwd_s = self_cuda_s("triton_tem_fused_flex_attention_backward_transpose_view_3")
    seq_len, block = 8192, 32
    stream = 2 * seq_len
    # The profiled step was compiled, without activation checkpointing.
    gemm_flops = 6.0 * shape.layers * shape.layer_params * stream
    total_pairs = sum(pairs(seq_len, block, one_doc_per_block=False).values()) * shape.layers
    return Hardware(
        gemm_tflops=gemm_flops / mm_s / 1e12,
        attn_fwd_pair_s=fwd_s / total_pairs,
        attn_bwd_pair_s=bwd_s / total_pairs,
    )


def measured_2gpu() -> list[dict]:
    rows = []
    for path in MEASURED_2GPU:
        data = json.loads(path.read_text())
        block = data["config"]["block_size"]
        for row in data["throughput"]:
            rows.append(
                {
                    "mode": row["mode"],
                    "seq_len": row["seq_len"],
                    "gpus": row["gpus"],
                    "block": block,
                    "step_s": row["step_time_s"],
                    "memory_gb": row["peak_gb_per_gpu"],
                }
            )
    return rows


def calibrate(shape: Shape, hw: Hardware) -> tuple[Hardware, list[dict]]:
    rows = measured_2gpu()
    model = [
        step(
            r["mode"], r["gpus"], r["seq_len"], shape, hw, block=r["block"], one_doc_per_block=False
        )["step_s"]
        for r in rows
    ]
    factor = math.exp(
        sum(math.log(r["step_s"] / m) for r, m in zip(rows, model, strict=True)) / len(rows)
    )
    hw = Hardware(**{**asdict(hw), "eager_factor": factor})
    report = []
    for r in rows:
        got = step(
            r["mode"], r["gpus"], r["seq_len"], shape, hw, block=r["block"], one_doc_per_block=False
        )
        report.append(
            {**r, "model_step_s": got["step_s"], "error": got["step_s"] / r["step_s"] - 1}
        )
    return hw, report


def best_csbp(gpus: int, seq_len: int, shape: Shape, hw: Hardware, block: int) -> tuple[int, dict]:
    """CSBP at the clean-group size c (a divisor of P) that is fastest and fits in memory."""
    options = []
    for c in (d for d in range(1, gpus + 1) if gpus % d == 0):
        result = step("csbp", gpus, seq_len, shape, hw, block=block, cp=c)
        if result["memory_gb"] <= hw.hbm_gb:
            options.append((result["step_s"], c, result))
    if not options:
        return gpus, step("csbp", gpus, seq_len, shape, hw, block=block, cp=gpus)
    _, c, result = min(options)
    return c, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3-1.7b")
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--gpus", default="8,16,64")
    parser.add_argument("--seq-lens", default="131072,262144,524288,1048576")
    parser.add_argument("--nvlink-gbps", type=float, default=Hardware.nvlink_gbps)
    parser.add_argument("--network-gbps", type=float, default=Hardware.network_gbps)
    parser.add_argument(
        "--compiled",
        action="store_true",
        help="predict compiled steps (eager factor 1) instead of the calibrated uncompiled ones",
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    shape = Shape.preset(args.model)
    hw = kernel_rates(Shape.preset("qwen3-1.7b"))
    hw = Hardware(
        **{**asdict(hw), "nvlink_gbps": args.nvlink_gbps, "network_gbps": args.network_gbps}
    )
    hw, report = calibrate(Shape.preset("qwen3-1.7b"), hw)
    print(
        f"kernel rates (1.7B / 8K profile): GEMM {hw.gemm_tflops:.0f} TFLOP/s; attention "
        f"{hw.attn_fwd_pair_s * 1e12:.2f} / {hw.attn_bwd_pair_s * 1e12:.2f} ps per pair "
        f"(fwd / bwd); eager factor {hw.eager_factor:.2f} from the 2-GPU runs"
    )
    print("calibration, 2 x H200 (one document per sequence, uncompiled, reference merge):")
    for r in report:
        print(
            f"  {r['mode']:<5} {r['seq_len']:>7}: measured {r['step_s']:.2f} s, model "
            f"{r['model_step_s']:.2f} s ({100 * r['error']:+.1f} %)"
        )
    if args.compiled:
        hw = Hardware(**{**asdict(hw), "eager_factor": 1.0})
    predictions = []
    print(
        f"\npredictions, {args.model}, block {args.block_size}, one document per sequence, "
        f"activation checkpointing ({'compiled' if args.compiled else 'uncompiled'} kernels); "
        f"NVLink {hw.nvlink_gbps:.0f} GB/s in a node of {hw.gpus_per_node}, "
        f"{hw.network_gbps:.0f} GB/s per GPU between nodes"
    )
    print(
        f"{'GPUs':>5} {'context':>8} {'CP s':>8} {'CSBP s':>8} {'c':>3} {'CSBP/CP':>8} "
        f"{'CP exposed comm':>16} {'CP GB':>7} {'CSBP GB':>8}"
    )
    for gpus in map(int, args.gpus.split(",")):
        for seq_len in map(int, args.seq_lens.split(",")):
            cp = step("cp", gpus, seq_len, shape, hw, block=args.block_size)
            c, csbp = best_csbp(gpus, seq_len, shape, hw, args.block_size)
            speedup = cp["step_s"] / csbp["step_s"]
            predictions.append(
                {
                    "gpus": gpus,
                    "seq_len": seq_len,
                    "cp": cp,
                    "csbp": csbp,
                    "csbp_cp": c,
                    "speedup": speedup,
                }
            )
            print(
                f"{gpus:>5} {seq_len // 1024:>7}K {cp['step_s']:>8.2f} {csbp['step_s']:>8.2f} "
                f"{c:>3} {speedup:>7.2f}x {cp['exposed_comm_s']:>15.2f}s "
                f"{cp['memory_gb']:>7.1f} {csbp['memory_gb']:>8.1f}"
            )
    if args.json:
        args.json.write_text(
            json.dumps(
                {"hardware": asdict(hw), "calibration": report, "predictions": predictions},
                indent=1,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
