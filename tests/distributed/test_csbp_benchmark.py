"""benchmarks/context_parallel.py still runs end to end (CPU, gloo, tiny model, one measurement
per part) and writes the JSON it promises."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests import prefetch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "context_parallel.py"


_COMMON = [sys.executable, str(SCRIPT), "--tiny", "--out", "{work}/cp.json"]
# The throughput part, then a search capped at its start (one probe per GPU count) merged into
# the same JSON; started with the session (tests/prefetch.py), on the core the other tests
# leave idle.
prefetch.declare(
    "context parallel benchmark",
    [*_COMMON, "--parts", "throughput", "--modes", "csbp", "--seq-lens", "128"],
    [*_COMMON, "--parts", "search", "--search-start", "128", "--search-max", "128"],
    timeout=300,
)


@pytest.mark.slow
def test_tiny_benchmark_smoke():
    proc, work = prefetch.result("context parallel benchmark")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((work / "cp.json").read_text())
    (row,) = result["throughput"]
    assert (row["mode"], row["gpus"], row["status"]) == ("csbp", 2, "ok"), row
    assert row["tokens_per_s"] > 0 and row["peak_gb_per_gpu"] > 0
    for key, mode in (("1gpu", "none"), ("2gpu", "csbp")):
        found = result["search"][key]
        assert found["mode"] == mode and found["max_seq_len"] == 128, found
        assert found["status"] == "reached --search-max"
    assert result["max_context_ratio"] == 1.0
    assert "Longest context" in proc.stdout and "Throughput" in proc.stdout


def _benchmark_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("context_parallel_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_context_search_jumps_to_the_capacity_its_memory_slope_predicts():
    bench = _benchmark_module()
    # One fit: no slope yet, double.
    assert bench._next_length(64, None, [(64, 10.0)], 100.0, 32) == 128
    # Two fits, 10 GB per 64 tokens: the line meets 98 GB at 627 -> 608 on the 32 grid.
    peaks = [(64, 10.0), (128, 20.0)]
    assert bench._next_length(128, None, peaks, 100.0, 32) == 608
    # Below a failure the same prediction is clamped inside the bracket...
    assert bench._next_length(128, 512, peaks, 100.0, 32) == 480
    # ...and without a usable slope (flat memory) it bisects.
    assert bench._next_length(128, 512, [(64, 20.0), (128, 20.0)], 100.0, 32) == 320
    # Never re-tries a length already known to fit.
    assert bench._next_length(600, None, [(64, 10.0), (600, 97.9)], 100.0, 32) == 632


def test_the_max_context_ratio_says_when_a_search_did_not_settle():
    """The tiny CPU search ran out of --budget-s at 2 GPUs (512 fit, 2688 did not) and printed
    '2-GPU / 1-GPU max context: 0.14x' as if measured; an unsettled search is a bound."""
    line = _benchmark_module().ratio_line

    def search(one: str, two: str) -> dict:
        return {
            "1gpu": {"max_seq_len": 3712, "status": one},
            "2gpu": {"max_seq_len": 512, "status": two},
        }

    assert line(search("converged", "reached --search-max")) == "2-GPU / 1-GPU max context: 0.14x"
    assert line(search("converged", "budget exhausted")) == (
        "2-GPU / 1-GPU max context: 0.14x (a lower bound: the search did not settle, "
        "2gpu: budget exhausted)"
    )
    assert "(an upper bound: " in line(search("budget exhausted", "converged"))
    assert "(not a measurement: " in line(search("failed", "budget exhausted"))
    assert line({"1gpu": {"max_seq_len": None, "status": "nothing fits"}}) is None
