"""`benchmarks/dflash_features.py --tiny`: a random HF target and standard-library rows on CPU;
both ways of running the target (one row a forward, a micro-batch a forward) write the same
features, and the JSON says how fast each was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_tiny_features_benchmark_compares_batched_rows_with_one_row(tmp_path):
    out = tmp_path / "features.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "dflash_features.py"), "--tiny",
         "--batch-rows", "4", "--work", str(tmp_path / "work"), "--out", str(out)],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and result["rows"] >= 64 and result["seq_len"] == 128
    assert set(result["seconds"]) == {"batch_rows=1", "batch_rows=4"}
    assert result["largest_difference"] == 0.0  # on CPU a row's numbers ignore its batch
    assert (
        result["speedup"] == result["seconds"]["batch_rows=1"] / result["seconds"]["batch_rows=4"]
    )
    assert "speedup" in proc.stdout
