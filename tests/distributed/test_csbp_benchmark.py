"""benchmarks/context_parallel.py still runs end to end (CPU, gloo, tiny model, one measurement
per part) and writes the JSON it promises."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "context_parallel.py"


@pytest.mark.slow
def test_tiny_benchmark_smoke(tmp_path):
    out = tmp_path / "cp.json"
    common = [sys.executable, str(SCRIPT), "--tiny", "--out", str(out)]
    throughput = [*common, "--parts", "throughput", "--modes", "csbp", "--seq-lens", "128"]
    proc = subprocess.run(throughput, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # A search capped at its start: one probe per GPU count, merged into the same JSON.
    search = [*common, "--parts", "search", "--search-start", "128", "--search-max", "128"]
    proc = subprocess.run(search, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    (row,) = result["throughput"]
    assert (row["mode"], row["gpus"], row["status"]) == ("csbp", 2, "ok"), row
    assert row["tokens_per_s"] > 0 and row["peak_gb_per_gpu"] > 0
    for key, mode in (("1gpu", "none"), ("2gpu", "csbp")):
        found = result["search"][key]
        assert found["mode"] == mode and found["max_seq_len"] == 128, found
        assert found["status"] == "reached --search-max"
    assert result["max_context_ratio"] == 1.0
    assert "Longest context" in proc.stdout and "Throughput" in proc.stdout
