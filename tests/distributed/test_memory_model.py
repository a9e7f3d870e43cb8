"""benchmarks/memory_model.py: per-rank live bytes of a real trainer step, whole vs CSBP."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "memory_model.py"


def test_csbp_rank_holds_about_half_of_a_whole_sequence_rank(tmp_path):
    out = tmp_path / "mm.json"
    command = [sys.executable, str(SCRIPT), "--seq-len", "1024", "--modes", "whole,csbp"]
    proc = subprocess.run(
        [*command, "--out", str(out)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())["rows"]
    whole = [r for r in rows if r["mode"] == "whole"]
    csbp = [r for r in rows if r["mode"] == "csbp"]
    assert len(whole) == 1 and len(csbp) == 2
    # Each CSBP rank holds half the tokens: well under the whole run, above half of it (the
    # FSDP buffers and the gathered clean K/V come on top of the halved activations).
    for row in csbp:
        assert 0.5 * whole[0]["peak_mb"] < row["peak_mb"] < 0.75 * whole[0]["peak_mb"], rows
    # The peak's largest tensors are named, so a regression can be traced to its op.
    assert csbp[0]["largest"] and csbp[0]["largest"][0]["mb"] > 0
