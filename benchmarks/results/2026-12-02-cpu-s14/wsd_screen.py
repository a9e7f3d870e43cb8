"""CPU screen (session 14): warmup-stable-decay (`wsd`: peak lr, then linear to 0.1x over the
last 20 % of the steps) for both drafters at equal steps (DFlash 350, AR 523), seed 1, on
session 12's 300-step target, evaluated beside session 13's constant and cosine seed-1 pairs
(/tmp/study13/const1 and /tmp/study13/cos, made by ../2026-12-02-cpu-s13/schedule_screen.py) on
the same 48 held-out prompts x 64 new tokens: wsd_screen.txt."""

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
work = Path("/tmp/study14/wsd")
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
    doc["scheduler"] = {"name": "wsd", "warmup_steps": 20, "min_lr_ratio": 0.1}
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
    S.train_and_export(doc, work / "dflash-run", work / "dflash-drafter", "dflash-wsd")
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
    doc["scheduler"] = {"name": "wsd", "warmup_steps": 20, "min_lr_ratio": 0.1}
    S.train_and_export(doc, work / "ar-run", work / "ar-drafter", "ar-wsd")
c13 = Path("/tmp/study13")
names = ["dflash-const", "dflash-cos", "dflash-wsd", "ar-const", "ar-cos", "ar-wsd"]
runs = [c13 / "const1", c13 / "cos", work]
reps = compare(
    str(target),
    [str(r / "dflash-drafter") for r in runs] + [str(r / "ar-drafter") for r in runs],
    str(eval_data),
    block_size=8,
    max_new_tokens=64,
    num_prompts=48,
    prompt_len=64,
    strict=False,
)
for n, r in zip(names, reps, strict=True):
    print(f"{n} s1: tau {r.tau:.2f} +- {r.tau_stderr:.2f}", flush=True)
for i, sched in enumerate(["const", "cos", "wsd"]):
    d, a = reps[i], reps[i + 3]
    print(f"ratio {sched} {d.tau / a.tau:.2f} +- {tau_ratio_stderr(d, a):.2f}")
best_ar = max(reps[3:], key=lambda r: r.tau)
best_d = max(reps[:3], key=lambda r: r.tau)
print(f"best vs best {best_d.tau / best_ar.tau:.2f} +- {tau_ratio_stderr(best_d, best_ar):.2f}")
