"""benchmarks/attention.py's arithmetic: useful TFLOP/s count only the mask's pairs, and the
summary compares turbo with flex shape by shape against the issue's targets."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "attention.py"


def _benchmark():
    spec = importlib.util.spec_from_file_location("attention_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rates_count_four_flops_per_pair_head_and_dim_forward_and_2_5x_backward():
    bench = _benchmark()
    row = bench.rates({"fwd_ms": 1.0, "bwd_ms": 2.5, "fwdbwd_ms": 3.5}, 10**9, 16, 128)
    fwd = 4 * 10**9 * 16 * 128 / 1e-3 / 1e12
    assert abs(row["fwd_tflops"] - fwd) < 1e-6
    assert abs(row["bwd_tflops"] - fwd) < 1e-6  # 2.5x the flops in 2.5x the time
    assert abs(row["fwdbwd_tflops"] - fwd) < 1e-6


def test_summary_checks_the_targets_at_16k():
    bench = _benchmark()

    def row(kernel, ms, fwd_tf, fwdbwd_tf):
        return {"kernel": kernel, "stream_len": 16384, "block_size": 32, "fwd_ms": ms / 3,
                "fwdbwd_ms": ms, "fwd_tflops": fwd_tf, "fwdbwd_tflops": fwdbwd_tf}  # fmt: skip

    fast = bench._summary([row("turbo", 10.0, 520, 470), row("flex", 14.0, 380, 330)])
    assert "1.40x flex" in fast["lines"][0] and "meets" in fast["lines"][0]
    assert abs(fast["speedups"][0]["fwdbwd_speedup"] - 1.4) < 1e-9
    slow = bench._summary([row("turbo", 10.0, 480, 470), row("flex", 14.0, 380, 330)])
    assert "misses" in slow["lines"][0]  # forward under 500 TF/s
    assert bench._summary([row("turbo", 10.0, 520, 470)])["lines"] == []  # no flex row
