"""benchmarks/attention.py's arithmetic: useful TFLOP/s count only the mask's pairs, and the
summary compares turbo with flex shape by shape against the issue's targets."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

from tests.helpers import benchmark_module

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


def test_rounds_take_the_kernels_in_turn_and_report_medians(monkeypatch):
    """--rounds: every round measures each kernel once, in turn (a drift during the run is
    spread over all of them); each figure is the median over the rounds, a failing kernel is
    reported and not measured again."""
    bench = _benchmark()
    calls = []
    times = {"a": iter([3.0, 1.0, 2.0]), "b": iter([5.0, 4.0, 9.0, 7.0])}

    def fake_measure(attend, q, k, v, repeats, pipelined=True):
        calls.append(attend)
        if attend == "broken":
            raise RuntimeError("no kernel")
        ms = next(times[attend])
        return {"fwd_ms": ms, "bwd_ms": 2 * ms, "fwdbwd_ms": 3 * ms}

    monkeypatch.setattr(bench, "measure", fake_measure)
    args = SimpleNamespace(rounds=3, repeats=10, synced=False)
    candidates = [("a", "a"), ("x", "broken"), ("b", "b")]
    got = bench.measure_rounds(candidates, None, None, None, args)
    assert calls == ["a", "broken", "b", "a", "b", "a", "b"]
    assert got["a"]["fwd_ms"] == 2.0 and got["a"]["fwdbwd_ms"] == 6.0
    assert got["b"]["bwd_ms"] == 10.0 and len(got["b"]["rounds"]) == 3
    assert got["x"] == {"error": "RuntimeError: no kernel"}
    one = bench.measure_rounds(
        [("b", "b")], None, None, None, SimpleNamespace(rounds=1, repeats=1, synced=True)
    )
    assert one["b"]["fwd_ms"] == 7.0
    assert "rounds" not in one["b"]


def _sweep():
    return benchmark_module("attention_sweep")


def test_sweep_picks_per_kernel_winners_and_never_a_wrong_or_partial_one():
    sweep = _sweep()

    def row(kernel, variant, shape, ratio, wrong=False, failed=False):
        r = {"kernel": kernel, "variant": variant, "stream_len": shape, "block_size": 32,
             "config": {"pipe": 1, "variant": variant}}  # fmt: skip
        if failed:
            return r | {"failed": "CompilationError"}
        return r | {"ms": ratio, "vs_default": ratio, "wrong": wrong}

    rows = [
        row("fwd", "a", 8192, 0.9), row("fwd", "a", 16384, 0.9),
        row("fwd", "fast-but-wrong", 8192, 0.5, wrong=True), row("fwd", "fast-but-wrong", 16384, 0.5),
        row("fwd", "fails-at-16k", 8192, 0.4), row("fwd", "fails-at-16k", 16384, 0, failed=True),
        row("dq", "b", 8192, 1.2), row("dq", "b", 16384, 0.7),  # mean 0.95
        row("dq", "c", 8192, 1.0), row("dq", "c", 16384, 1.0),
    ]  # fmt: skip
    winners = sweep.pick_winners(rows, None)
    assert winners["fwd"]["variant"] == "a" and winners["dq"]["variant"] == "b"
    assert "dkdv" not in winners


def test_sweep_defaults_file_is_what_the_op_loads():
    """The file the sweep writes, copied next to the op's source, gives its winners as defaults."""
    import json

    from turbo_dllm.kernels.triton_ops import triton_module

    sweep = _sweep()
    module = triton_module("block_diffusion_attention", "jit")
    best = module.default_config(128).with_part("dkdv", runs=1, pipe=1, warps=4)
    table = sweep.defaults_file(module, best, 128, "a test")
    assert table["configs"]["64"] == json.loads(module._DEFAULTS_FILE.read_text())["configs"]["64"]
    loaded = module.KernelConfig(**json.loads(json.dumps(table))["configs"]["128"])
    assert loaded == best and loaded.dkdv_runs == 1 and loaded.dkdv_warps == 4
    # The op's own defaults come from the shipped file (KernelConfig's own differ).
    shipped = json.loads(module._DEFAULTS_FILE.read_text())["configs"]["128"]
    assert module.default_config(128) == module.KernelConfig(**shipped) != module.KernelConfig()


def test_sweep_times_the_best_tiles_with_the_best_loop_variant_together():
    from turbo_dllm.kernels.triton_ops import triton_module

    sweep = _sweep()
    module = triton_module("block_diffusion_attention", "jit")
    base = module.default_config(128)
    variants = dict(module.sweep_variants(128)["fwd"])

    def row(variant, ratio):
        return {"kernel": "fwd", "variant": variant, "stream_len": 16384, "block_size": 32,
                "config": variants[variant].part("fwd"), "ms": ratio, "vs_default": ratio,
                "wrong": False}  # fmt: skip

    rows = [row("128x64 w4 s3", 0.9), row("runs 128x64 w8 s4", 0.7), row("runs tl.range", 0.8),
            row("head-major", 0.85)]  # fmt: skip
    ((kernel, name, config),) = sweep._combinations(module, rows, base)
    assert (kernel, name) == ("fwd", "runs 128x64 w8 s4 + runs tl.range")
    part = config.part("fwd")
    assert (part["n"], part["warps"], part["stages"], part["runs"], part["pipe"]) == (
        64,
        8,
        4,
        1,
        1,
    )
    assert config.part("dq") == base.part("dq")
    # Nothing to combine when either kind does not beat the default.
    assert sweep._combinations(module, [row("128x64 w4 s3", 1.1), row("runs", 0.8)], base) == []


def test_a_config_variant_changes_only_the_named_fields():
    import pytest

    bench = _benchmark()
    name, config = bench.config_variant("turbo-dq-fused:dkdv_dq=1,dkdv_stages=3", 128)
    assert name == "turbo-dq-fused"
    assert (config.dkdv_dq, config.dkdv_stages) == (1, 3)
    default = bench.config_variant("same:dkdv_dq=0", 128)[1]
    assert config.fwd_m == default.fwd_m and config.dq_n == default.dq_n
    with pytest.raises(SystemExit, match="no_such_field"):
        bench.config_variant("x:no_such_field=1", 128)
    with pytest.raises(SystemExit, match="NAME:FIELD"):
        bench.config_variant("missing-fields", 128)
