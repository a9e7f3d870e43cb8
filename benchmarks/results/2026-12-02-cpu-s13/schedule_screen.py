"""CPU screen (session 13): cosine decay (to 0.1x) for both drafters at equal steps (DFlash
350, AR 523) against the constant lr the H200 benchmark uses, seed 1, on session 12's 300-step
target. The constant seed-1 pair was trained by the same script with the scheduler line left
out (work folder /tmp/study13/const1); all six drafters (session 12's constant pair, seed not
recorded, too) were evaluated together on the same 48 held-out prompts x 64 new tokens:
schedule_screen.txt."""

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
work = Path("/tmp/study13/cos")
work.mkdir(parents=True, exist_ok=True)
if not (work / "dflash-drafter").exists():
    doc = S.decoder_spec(
        train_data,
        work / "dflash-run",
        shape,
        seconds=None,
        steps=350,
        seq_len=SEQ,
        micro=MICRO,
        lr=1e-3,
        gpu=False,
        every=100,
    )
    doc["launch"]["seed"] = 1
    doc["scheduler"] = {"name": "cosine", "warmup_steps": 20, "min_lr_ratio": 0.1}
    doc["model"] = {
        "family": "dflash",
        "from_config": "target",
        "dflash": {"target": str(target), "num_layers": 2, "block_size": 8, "mask_token_id": 259},
    }
    doc["objective"] = {
        "name": "dflash_distillation",
        "block_size": 8,
        "max_anchors": 64,
        "anchor_sampling": "locality",
        "decay_gamma": 7.0,
        "dflash_loss": "greedy_ce",
        "greedy_path": True,
    }
    S.train_and_export(doc, work / "dflash-run", work / "dflash-drafter", "dflash-cos")
if not (work / "ar-drafter").exists():
    h, _, heads, kv, hd, inter = shape
    doc = S.decoder_spec(
        train_data,
        work / "ar-run",
        (h, 2, heads, kv, hd, inter),
        seconds=None,
        steps=523,
        seq_len=SEQ,
        micro=MICRO,
        lr=1e-3,
        gpu=False,
        every=100,
    )
    doc["launch"]["seed"] = 1
    doc["scheduler"] = {"name": "cosine", "warmup_steps": 20, "min_lr_ratio": 0.1}
    S.train_and_export(doc, work / "ar-run", work / "ar-drafter", "ar-cos")
names = ["dflash-const", "dflash-cos", "ar-const", "ar-cos"]
reps = compare(
    str(target),
    [
        str(base / "dflash-drafter"),
        str(work / "dflash-drafter"),
        str(base / "ar-drafter"),
        str(work / "ar-drafter"),
    ],
    str(eval_data),
    block_size=8,
    max_new_tokens=64,
    num_prompts=48,
    prompt_len=64,
    strict=False,
)
for n, r in zip(names, reps, strict=True):
    print(f"{n}: tau {r.tau:.2f} +- {r.tau_stderr:.2f}", flush=True)
print(
    f"ratio const {reps[0].tau / reps[2].tau:.2f} +- {tau_ratio_stderr(reps[0], reps[2]):.2f}; cos {reps[1].tau / reps[3].tau:.2f} +- {tau_ratio_stderr(reps[1], reps[3]):.2f}"
)
