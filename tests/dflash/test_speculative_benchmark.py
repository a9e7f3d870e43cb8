"""`benchmarks/speculative.py --tiny`: the whole benchmark (data from the standard library,
target, both drafters, evaluation) runs on CPU and reports lossless decoding for both."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests import prefetch
from turbo_dllm.train.schedules import lr_multiplier

ROOT = Path(__file__).resolve().parents[2]


# One intra-op thread, as the other tests' subprocesses: on a 2-core host shared with other
# processes two threads' spin-waits made its untimed parts (the target's 40 steps, the warm-ups,
# the evaluation) 4-7x slower, and its timed drafters 10x fewer steps. Started with the session
# (tests/prefetch.py), on the core the other tests leave idle.
prefetch.declare(
    "speculative benchmark",
    [sys.executable, str(ROOT / "benchmarks" / "speculative.py"), "--tiny",
     "--work", "{work}/work", "--out", "{work}/spec.json",
     "--dflash-variants", "greedy-ce,plain,greedy-ce-half-anchors,dflash2-dpace",
     "--dflash-warmup", "on", "--drafter-seconds", "2",
     # not first, the constant drafter is still the one named `autoregressive`
     "--ar-variants", "constant-quarter,constant,cosine"],
    env={"OMP_NUM_THREADS": "1"}, timeout=600,
)  # fmt: skip


def test_the_tiny_speculative_benchmark_runs_end_to_end():
    proc, work = prefetch.result("speculative benchmark")
    out = work / "spec.json"
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["training"]["target"]["steps"] == 40  # --target-steps, capped for --tiny
    assert set(result["training"]) == {
        "target", "ar-drafter", "ar-drafter-cosine", "ar-drafter-constant-quarter",
        "dflash", "dflash-plain",
        "dflash-greedy-ce-half-anchors", "dflash-dflash2-dpace",
    }  # fmt: skip
    # --tiny's seq_len 128 gives 32 anchors a row by default; the variant drafts half of them
    assert result["max_anchors"] == result["training"]["dflash"]["max_anchors"] == 32
    assert result["training"]["dflash-greedy-ce-half-anchors"]["max_anchors"] == 16
    # the cosine AR drafter decays over the steps its time holds at the constant one's rate
    cosine = [
        json.loads(line)
        for line in (work / "work" / "ar-run-cosine" / "metrics.jsonl").read_text().splitlines()
    ]
    # How far it gets in its 2 s depends on the host's load (a loaded host may not leave the
    # warmup): what is asserted is the schedule every logged step followed, which decays to
    # min_lr_ratio by the last of the steps planned (at least 40).
    schedule = result["training"]["ar-drafter-cosine"]["schedule"]
    assert schedule["name"] == "cosine" and schedule["planned_steps"] >= 40
    assert schedule["warmup_steps"] < schedule["planned_steps"]

    def planned_lr(step: int) -> float:
        return schedule["lr"] * lr_multiplier(
            step - 1,
            name="cosine",
            warmup_steps=schedule["warmup_steps"],
            total_steps=schedule["planned_steps"],
            min_lr_ratio=schedule["min_lr_ratio"],
        )

    assert [row["lr"] for row in cosine] == pytest.approx([planned_lr(r["step"]) for r in cosine])
    last = planned_lr(schedule["planned_steps"])
    assert (
        last == pytest.approx(schedule["lr"] * schedule["min_lr_ratio"]) and last < schedule["lr"]
    )
    # a quarter of the time (how many steps that holds depends on the host's load)
    quarter = result["training"]["ar-drafter-constant-quarter"]["max_duration_s"]
    assert quarter == pytest.approx(0.25 * result["training"]["ar-drafter"]["max_duration_s"])
    ars = ("autoregressive", "autoregressive-cosine", "autoregressive-constant-quarter")
    assert result["ar_baseline"] in ars
    best = max(result["reports"][name]["tau"] for name in ars)
    assert result["tau_ratios"]["dflash"] == result["reports"]["dflash"]["tau"] / best
    variants = {"dflash", "dflash-plain", "dflash-greedy-ce-half-anchors", "dflash-dflash2-dpace"}
    assert set(result["tau_ratios"]) == set(result["tau_ratio_stderrs"]) == variants
    assert all(error >= 0 for error in result["tau_ratio_stderrs"].values())
    assert "paired over the prompts" in proc.stdout
    # once per architecture, before its first variant's timed run
    warmup = result["dflash_warmup_s"]
    assert set(warmup) == {"DFlashDraftModel", "DFlash2DraftModel"} and min(warmup.values()) > 0
    for run in ("dflash-warmup-run", "dflash-warmup-run-DFlash2DraftModel"):
        assert (work / "work" / run / "metrics.jsonl").read_text().count("\n") == 3
    # each drafter's own parameters (a DFlash drafter's leave out the target's embeddings and
    # head); DFlash2 adds its convolutions and candidate selector to the same layers
    params = {name: record["params"] for name, record in result["training"].items()}
    assert params["dflash"] == params["dflash-plain"] > 0 and params["ar-drafter"] > 0
    assert params["dflash-dflash2-dpace"] > params["dflash"]
    assert params["target"] >= params["ar-drafter"]  # --tiny: both have 2 layers
    for name in (
        "dflash", "dflash-plain", "dflash-dflash2-dpace", "autoregressive", "autoregressive-cosine"
    ):  # fmt: skip
        report = result["reports"][name]
        assert report["lossless"] is True
        assert report["tau"] >= 1.0
        assert len(report["prompt_forwards"]) == len(report["prompt_tokens"]) == 2
        assert report["tau"] == sum(report["prompt_tokens"]) / sum(report["prompt_forwards"])
    assert result["args"]["dflash_eager"] is False  # compiled only where there is a GPU


def test_the_benchmark_bpe_tokenizer_prepares_an_artifact_with_its_mask(tmp_path, monkeypatch):
    """`--tokenizer bpe:N`: a byte-level BPE tokenizer trained on the training files, saved
    as a transformers folder that `data prepare` reads (`kind: huggingface`), whose mask token
    is the drafter's."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import speculative

    from turbo_dllm.data.artifact import DataArtifact

    files = speculative.stdlib_files(6)
    folder = speculative.train_bpe(files, tmp_path / "tok", 400)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    assert len(tokenizer) == 400 and tokenizer.mask_token_id == 2
    text = files[0].read_text(encoding="utf-8")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text and len(ids) < len(text.encode()) / 1.5  # merges
    artifact = speculative.prepare(files, tmp_path / "data", 128, folder)
    tokens = DataArtifact(artifact).tokens
    assert 2 < int(tokens.max()) < 400 and int(tokens.min()) >= 0
