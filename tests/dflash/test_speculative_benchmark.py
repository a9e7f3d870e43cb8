"""`benchmarks/speculative.py --tiny`: the whole benchmark (data from the standard library,
target, both drafters, evaluation) runs on CPU and reports lossless decoding for both."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_tiny_speculative_benchmark_runs_end_to_end(tmp_path):
    out = tmp_path / "spec.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "speculative.py"), "--tiny",
         "--work", str(tmp_path / "work"), "--out", str(out),
         "--dflash-variants", "greedy-ce,plain,greedy-ce-half-anchors", "--dflash-warmup", "on",
         "--ar-variants", "constant,cosine"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["training"]["target"]["steps"] == 40  # --target-steps, capped for --tiny
    assert set(result["training"]) == {
        "target", "ar-drafter", "ar-drafter-cosine", "dflash", "dflash-plain",
        "dflash-greedy-ce-half-anchors",
    }  # fmt: skip
    # --tiny's seq_len 128 gives 32 anchors a row by default; the variant drafts half of them
    assert result["max_anchors"] == result["training"]["dflash"]["max_anchors"] == 32
    assert result["training"]["dflash-greedy-ce-half-anchors"]["max_anchors"] == 16
    # the cosine AR drafter decays over the steps its time holds at the constant one's rate
    cosine = [
        json.loads(line)
        for line in (tmp_path / "work" / "ar-run-cosine" / "metrics.jsonl").read_text().splitlines()
    ]
    assert max(row["lr"] for row in cosine) > 2 * cosine[-1]["lr"] > 0
    assert result["ar_baseline"] in {"autoregressive", "autoregressive-cosine"}
    best = max(
        result["reports"][name]["tau"] for name in ("autoregressive", "autoregressive-cosine")
    )
    assert result["tau_ratios"]["dflash"] == result["reports"]["dflash"]["tau"] / best
    variants = {"dflash", "dflash-plain", "dflash-greedy-ce-half-anchors"}
    assert set(result["tau_ratios"]) == set(result["tau_ratio_stderrs"]) == variants
    assert all(error >= 0 for error in result["tau_ratio_stderrs"].values())
    assert "paired over the prompts" in proc.stdout
    assert result["dflash_warmup_s"] > 0  # once, before the first variant's timed run
    assert (tmp_path / "work" / "dflash-warmup-run" / "metrics.jsonl").read_text().count("\n") == 3
    for name in ("dflash", "dflash-plain", "autoregressive", "autoregressive-cosine"):
        report = result["reports"][name]
        assert report["lossless"] is True
        assert report["tau"] >= 1.0
        assert len(report["prompt_forwards"]) == len(report["prompt_tokens"]) == 2
        assert report["tau"] == sum(report["prompt_tokens"]) / sum(report["prompt_forwards"])
    assert result["args"]["dflash_eager"] is False  # compiled only where there is a GPU
