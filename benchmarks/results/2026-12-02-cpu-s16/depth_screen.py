"""CPU screen (session 16): drafter depth. On the H200 4-layer drafters moved the tau ratio from
~1.3x (2 layers) to 1.07x: depth helped the AR drafter (4.1-4.8 -> 5.01) and not the DFlash one.
Does the scaled-down CPU world show the same, and does 1 layer move it the other way? Both
drafters at 1, 2 (session 13's seed-1 pair, /tmp/study13/const1) and 4 layers, equal steps
(DFlash 350 with `greedy_ce` + `greedy_path`, AR 523, constant lr, seed 1), on session 12's
300-step target; the same 48 held-out prompts x 64 new tokens: depth_screen.txt."""

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
work = Path("/tmp/study16/depth")
work.mkdir(parents=True, exist_ok=True)


def dflash(layers: int) -> Path:
    run, out = work / f"dflash{layers}-run", work / f"dflash{layers}-drafter"
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
        "dflash": {
            "target": str(target), "num_layers": layers, "block_size": 8, "mask_token_id": 259,
        },
    }  # fmt: skip
    doc["objective"] = {
        "name": "dflash_distillation",
        "block_size": 8,
        "max_anchors": 64,
        "anchor_sampling": "locality",
        "decay_gamma": 7.0,
        "dflash_loss": "greedy_ce",
        "greedy_path": True,
    }
    S.train_and_export(doc, run, out, f"dflash-{layers}l")
    return out


def ar(layers: int) -> Path:
    run, out = work / f"ar{layers}-run", work / f"ar{layers}-drafter"
    if out.exists():
        return out
    h, _, heads, kv, hd, inter = shape
    doc = S.decoder_spec(
        train_data, run, (h, layers, heads, kv, hd, inter), seconds=None, steps=523,
        seq_len=SEQ, micro=MICRO, lr=1e-3, gpu=False, every=100,
    )  # fmt: skip
    doc["launch"]["seed"] = 1
    S.train_and_export(doc, run, out, f"ar-{layers}l")
    return out


c13 = Path("/tmp/study13/const1")
pairs = {
    1: (dflash(1), ar(1)),
    2: (c13 / "dflash-drafter", c13 / "ar-drafter"),
    4: (dflash(4), ar(4)),
}
drafters = [d for pair in pairs.values() for d in pair]
names = [f"{kind}-{layers}l" for layers in pairs for kind in ("dflash", "ar")]
reps = compare(
    str(target), [str(d) for d in drafters], str(eval_data), block_size=8, max_new_tokens=64,
    num_prompts=48, prompt_len=64, strict=False,
)  # fmt: skip
for n, r in zip(names, reps, strict=True):
    print(f"{n}: tau {r.tau:.2f} +- {r.tau_stderr:.2f}  lossless {r.lossless}", flush=True)
for i in range(0, len(names), 2):
    ratio, se = reps[i].tau / reps[i + 1].tau, tau_ratio_stderr(reps[i], reps[i + 1])
    print(f"ratio {names[i]} / {names[i + 1]}: {ratio:.2f} +- {se:.2f}")
