"""CPU study (session 12): does a better-trained target move the DFlash / AR tau ratio?

On the H200 the benchmark's target trains 400 steps (loss ~0.96) while the AR drafter trains
~14x as many tokens; the weak target's greedy output repeats itself, and both drafters accept
whole blocks there. Here: the session-11 scaled-down world (4-layer hidden-128 target; 2-layer
drafters, block 8, DFlash `greedy_ce` + `greedy_path` 350 steps, AR 523 steps), the target
trained for each of TARGET_STEPS, the drafters evaluated on the same 48 held-out prompts.

    python target_strength_study.py SEED STEPS...     # work folder /tmp/study12/s<STEPS>
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import speculative as S  # noqa: E402

from turbo_dllm.families.dflash.speculative import compare, tau_ratio_stderr  # noqa: E402

seed = int(sys.argv[1])
SEQ, MICRO = 256, 16
shape = (128, 4, 4, 2, 32, 384)
files = S.stdlib_files(None)
held = files[::10]
train_files = [f for f in files if f not in set(held)][:400]
data_dir = Path("/tmp/study12/data")
data_dir.mkdir(parents=True, exist_ok=True)
if not (data_dir / "train-data").exists():
    S.prepare(train_files, data_dir / "train-data", SEQ)
    S.prepare(held[:60], data_dir / "heldout-data", SEQ)
train_data, eval_data = data_dir / "train-data", data_dir / "heldout-data"


def decoder(work, name, data, layer_shape, steps):
    doc = S.decoder_spec(
        data, work / f"{name}-run", layer_shape, seconds=None, steps=steps, seq_len=SEQ,
        micro=MICRO, lr=1e-3, gpu=False, every=100,
    )  # fmt: skip
    doc["launch"]["seed"] = seed
    return doc


for target_steps in (int(s) for s in sys.argv[2:]):
    work = Path(f"/tmp/study12/s{target_steps}")
    work.mkdir(parents=True, exist_ok=True)
    if not (work / "target").exists():
        doc = decoder(work, "target", train_data, shape, target_steps)
        doc["launch"]["seed"] = 0
        S.train_and_export(doc, work / "target-run", work / "target", "target")
    target = work / "target"
    if not (work / "dflash-drafter").exists():
        doc = decoder(work, "dflash", train_data, shape, 350)
        doc["model"] = {
            "family": "dflash",
            "from_config": "target",
            "dflash": {
                "target": str(target),
                "num_layers": 2,
                "block_size": 8,
                "mask_token_id": 259,
            },
        }
        doc["objective"] = {
            "name": "dflash_distillation", "block_size": 8, "max_anchors": 64,
            "anchor_sampling": "locality", "decay_gamma": 7.0, "dflash_loss": "greedy_ce",
            "greedy_path": True,
        }  # fmt: skip
        S.train_and_export(doc, work / "dflash-run", work / "dflash-drafter", "dflash")
    if not (work / "ar-drafter").exists():
        h, _, heads, kv, hd, inter = shape
        doc = decoder(work, "ar", train_data, (h, 2, heads, kv, hd, inter), 523)
        S.train_and_export(doc, work / "ar-run", work / "ar-drafter", "ar-drafter")
    d, a = compare(
        str(target), [str(work / "dflash-drafter"), str(work / "ar-drafter")], str(eval_data),
        block_size=8, max_new_tokens=64, num_prompts=48, prompt_len=64, strict=False,
    )  # fmt: skip
    print(
        f"target {target_steps} steps: dflash tau {d.tau:.2f} +- {d.tau_stderr:.2f}, "
        f"ar tau {a.tau:.2f} +- {a.tau_stderr:.2f}, ratio {d.tau / a.tau:.2f} +- "
        f"{tau_ratio_stderr(d, a):.2f}, lossless {d.lossless and a.lossless}",
        flush=True,
    )
