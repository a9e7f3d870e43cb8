"""CPU screen (session 13): DFlash drafter settings at equal steps (350) on session 12's 300-step
target (`2026-12-02-cpu-s12/target_strength_study.py`, /tmp/study12/s300): twice the anchors,
3x the learning rate, three or two target feature layers instead of one. Same 48 held-out
prompts x 64 new tokens, the same AR drafter (523 steps) as the baseline."""

import sys
import time
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
variants = {  # run in two batches: a128 + lr3, then f3 + f2 (each evaluated with base and the AR drafter)
    "a128": dict(anchors=128, lr=1e-3, ids=None),
    "lr3": dict(anchors=64, lr=3e-3, ids=None),
    "f3": dict(anchors=64, lr=1e-3, ids=[0, 1, 2]),
    "f2": dict(anchors=64, lr=1e-3, ids=[1, 2]),
}
done = {}
for name, v in variants.items():
    work = Path(f"/tmp/study13/{name}")
    if not (work / "dflash-drafter").exists():
        doc = S.decoder_spec(
            train_data,
            work / "dflash-run",
            shape,
            seconds=None,
            steps=350,
            seq_len=SEQ,
            micro=MICRO,
            lr=v["lr"],
            gpu=False,
            every=100,
        )
        doc["launch"]["seed"] = 1
        doc["model"] = {
            "family": "dflash",
            "from_config": "target",
            "dflash": {
                "target": str(target),
                "num_layers": 2,
                "block_size": 8,
                "mask_token_id": 259,
                **({"target_layer_ids": v["ids"]} if v["ids"] else {}),
            },
        }
        doc["objective"] = {
            "name": "dflash_distillation",
            "block_size": 8,
            "max_anchors": v["anchors"],
            "anchor_sampling": "locality",
            "decay_gamma": 7.0,
            "dflash_loss": "greedy_ce",
            "greedy_path": True,
        }
        t = time.time()
        S.train_and_export(doc, work / "dflash-run", work / "dflash-drafter", name)
        print(name, "trained in", round(time.time() - t), "s", flush=True)
    done[name] = work / "dflash-drafter"
names = ["base"] + list(done)
reports = compare(
    str(target),
    [str(base / "dflash-drafter"), *map(str, done.values()), str(base / "ar-drafter")],
    str(eval_data),
    block_size=8,
    max_new_tokens=64,
    num_prompts=48,
    prompt_len=64,
    strict=False,
)
a = reports[-1]
for n, r in zip(names, reports, strict=True):
    print(
        f"{n}: tau {r.tau:.2f} +- {r.tau_stderr:.2f}, ratio {r.tau / a.tau:.2f} +- {tau_ratio_stderr(r, a):.2f}",
        flush=True,
    )
print(f"ar: tau {a.tau:.2f}")
