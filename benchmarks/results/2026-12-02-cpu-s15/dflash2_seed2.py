"""CPU screen (session 15), a second seed: dflash2_screen.py's DFlash2 `dpace` drafter and a
DFlash `greedy_ce` drafter, both on the greedy path, both at seed 2 (350 steps, constant lr), on
session 12's 300-step target, against the same seed-1 AR drafter (session 13), the same 48
held-out prompts x 64 new tokens: dflash2_seed2.txt."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import speculative as S  # noqa: E402

from turbo_dllm.families.dflash.speculative import compare, tau_ratio_stderr  # noqa: E402

SEQ, MICRO, SEED = 256, 16, 2
shape = (128, 4, 4, 2, 32, 384)
target = Path("/tmp/study12/s300/target")
train_data, eval_data = Path("/tmp/study12/data/train-data"), Path("/tmp/study12/data/heldout-data")
work = Path("/tmp/study15/seed2")
work.mkdir(parents=True, exist_ok=True)


def train(name: str, architecture: str, loss: str) -> Path:
    run, out = work / f"{name}-run", work / f"{name}-drafter"
    if out.exists():
        return out
    doc = S.decoder_spec(
        train_data, run, shape, seconds=None, steps=350, seq_len=SEQ, micro=MICRO, lr=1e-3,
        gpu=False, every=100,
    )  # fmt: skip
    doc["launch"]["seed"] = SEED
    doc["model"] = {
        "family": "dflash",
        "from_config": "target",
        "dflash": {
            "target": str(target),
            "num_layers": 2,
            "block_size": 8,
            "mask_token_id": 259,
            "architecture": architecture,
        },
    }
    doc["objective"] = {
        "name": "dflash_distillation",
        "block_size": 8,
        "max_anchors": 64,
        "anchor_sampling": "locality",
        "decay_gamma": 7.0,
        "dflash_loss": loss,
        "greedy_path": True,
    }
    S.train_and_export(doc, run, out, name)
    return out


drafters = [
    train("dflash-greedy-ce", "DFlashDraftModel", "greedy_ce"),
    train("dflash2-dpace", "DFlash2DraftModel", "dpace"),
    Path("/tmp/study13/const1/ar-drafter"),
]
names = ["dflash-greedy-ce", "dflash2-dpace", "ar-const-s1"]
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
    print(f"{n} s{SEED}: tau {r.tau:.2f} +- {r.tau_stderr:.2f}  lossless {r.lossless}", flush=True)
for i in range(2):
    print(
        f"ratio {names[i]} {reps[i].tau / reps[-1].tau:.2f} +- {tau_ratio_stderr(reps[i], reps[-1]):.2f}"
    )
print(
    f"dflash2 / dflash {reps[1].tau / reps[0].tau:.2f} +- {tau_ratio_stderr(reps[1], reps[0]):.2f}"
)
