"""`benchmarks/dflash_features.py --tiny`: a random HF target and standard-library rows on CPU;
every way of running it (one row or a micro-batch a forward, shards written inline or on a
thread) writes the same features, and the JSON says how fast each was."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests import prefetch

ROOT = Path(__file__).resolve().parents[2]

# Started with the session (tests/prefetch.py), on the core the other tests leave idle.
prefetch.declare(
    "dflash features benchmark",
    [sys.executable, str(ROOT / "benchmarks" / "dflash_features.py"), "--tiny",
     "--batch-rows", "4", "--work", "{work}/work", "--out", "{work}/features.json"],
    env={"OMP_NUM_THREADS": "1"}, timeout=300,
)  # fmt: skip


def test_the_tiny_features_benchmark_compares_batched_rows_with_one_row():
    proc, work = prefetch.result("dflash features benchmark")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((work / "features.json").read_text())
    assert result["device"] == "cpu" and result["rows"] >= 64 and result["seq_len"] == 128
    names = ["one row, inline writes", "batch, inline writes", "batch, writer thread"]
    assert list(result["seconds"]) == names and result["batch_rows"] == 4
    assert result["largest_difference"] == 0.0  # on CPU a row's numbers ignore its batch
    baseline = result["seconds"][names[0]]
    assert result["speedup_over_baseline"] == {n: baseline / result["seconds"][n] for n in names}
    assert "the baseline" in proc.stdout
