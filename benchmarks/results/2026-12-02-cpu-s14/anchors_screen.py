"""CPU screen (session 14): fewer anchors per row for the DFlash drafter at equal steps (350,
seed 1, constant lr): 32 and 16 per 256-token row (seq_len / 8 and / 16) against session 13's
seed-1 drafter at 64 (/tmp/study13/const1, ../2026-12-02-cpu-s13/schedule_screen.py with its
scheduler line left out), on session 12's 300-step target, with that session's seed-1 AR drafter
as the baseline; the same 48 held-out prompts x 64 new tokens: anchors_screen.txt. On the H200
the drafter's part of a DFlash step scales with the anchors while the frozen target's does not,
so fewer anchors at equal tau would mean more steps in the same time."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import speculative as S  # noqa: E402

from turbo_dllm.families.dflash.speculative import compare, tau_ratio_stderr  # noqa: E402

SEQ, MICRO = 256, 16
shape = (128, 4, 4, 2, 32, 384)
base = Path("/tmp/study12/s300")
target = base / "target"
train_data, eval_data = Path("/tmp/study12/data/train-data"), Path("/tmp/study12/data/heldout-data")
work = Path("/tmp/study14/anchors")
work.mkdir(parents=True, exist_ok=True)


def train_dflash(anchors: int) -> Path:
    run, out = work / f"dflash-a{anchors}-run", work / f"dflash-a{anchors}-drafter"
    if out.exists():
        return out
    doc = S.decoder_spec(
        train_data, run, shape, seconds=None, steps=350, seq_len=SEQ, micro=MICRO, lr=1e-3,
        gpu=False, every=100,
    )  # fmt: skip
    doc["launch"]["seed"] = 1
    doc["model"] = {
        "family": "dflash",
        "from_config": "target",
        "dflash": {"target": str(target), "num_layers": 2, "block_size": 8, "mask_token_id": 259},
    }
    doc["objective"] = {
        "name": "dflash_distillation",
        "block_size": 8,
        "max_anchors": anchors,
        "anchor_sampling": "locality",
        "decay_gamma": 7.0,
        "dflash_loss": "greedy_ce",
        "greedy_path": True,
    }
    S.train_and_export(doc, run, out, f"dflash-a{anchors}")
    return out


c13 = Path("/tmp/study13/const1")
drafters = [c13 / "dflash-drafter", train_dflash(32), train_dflash(16), c13 / "ar-drafter"]
names = ["dflash-a64", "dflash-a32", "dflash-a16", "ar-const"]
reps = compare(
    str(target),
    [str(d) for d in drafters],
    str(eval_data),
    block_size=8,
    max_new_tokens=64,
    num_prompts=48,
    prompt_len=64,
    strict=False,
)
for n, r in zip(names, reps, strict=True):
    print(f"{n} s1: tau {r.tau:.2f} +- {r.tau_stderr:.2f}", flush=True)
for i in range(3):
    print(
        f"ratio {names[i]} {reps[i].tau / reps[3].tau:.2f} +- {tau_ratio_stderr(reps[i], reps[3]):.2f}"
    )
