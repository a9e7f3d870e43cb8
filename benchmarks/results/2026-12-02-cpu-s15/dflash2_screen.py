"""CPU screen (session 15): DFlash2 drafters on the target's greedy path at equal steps (350,
seed 1, constant lr), now that greedy_path relabels DFlash2's hard labels with the target's
greedy tokens: `dflash` (slot decay) and `dpace` weights, the candidate selector on from the
first step, against session 13's seed-1 DFlash drafter (`greedy_ce` + `greedy_path`,
/tmp/study13/const1) and its seed-1 AR drafter, on session 12's 300-step target; the same 48
held-out prompts x 64 new tokens: dflash2_screen.txt. The selector drafts left to right
(each slot re-ranks its top-k by the token before it): the dependence between slots a DFlash
drafter lacks, where its tau trails off after 3-4 slots on the H200."""

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
work = Path("/tmp/study15/dflash2")
work.mkdir(parents=True, exist_ok=True)


def train_dflash2(loss: str) -> Path:
    run, out = work / f"dflash2-{loss}-run", work / f"dflash2-{loss}-drafter"
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
            "target": str(target),
            "num_layers": 2,
            "block_size": 8,
            "mask_token_id": 259,
            "architecture": "DFlash2DraftModel",
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
    S.train_and_export(doc, run, out, f"dflash2-{loss}")
    return out


c13 = Path("/tmp/study13/const1")
losses = sys.argv[1:] or ["dflash", "dpace"]
drafters = [c13 / "dflash-drafter", *(train_dflash2(loss) for loss in losses), c13 / "ar-drafter"]
names = ["dflash-greedy-ce", *(f"dflash2-{loss}" for loss in losses), "ar-const"]
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
    print(f"{n} s1: tau {r.tau:.2f} +- {r.tau_stderr:.2f}  lossless {r.lossless}", flush=True)
for i in range(len(names) - 1):
    print(
        f"ratio {names[i]} {reps[i].tau / reps[-1].tau:.2f} +- {tau_ratio_stderr(reps[i], reps[-1]):.2f}"
    )
