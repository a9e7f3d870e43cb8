"""CPU study (session 11): does training the DFlash drafter on the target's own greedy
continuations (regenerated data) lift its tau relative to the AR drafter?

    python regenerated_data_study.py SEED [PROMPTS]    # work folder /tmp/study/w<SEED>

Seed 1 reused seed 0's target, data and regenerated data (symlinks into /tmp/study/w1), so
only the drafters' seeds differ. Results: regenerated_data_study.txt, docs/benchmarks.md.
"""

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import speculative as S  # noqa: E402
import torch  # noqa: E402

from turbo_dllm.families.dflash.speculative import (  # noqa: E402
    compare,
    held_out_prompts,
    tau_ratio_stderr,
)

seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
work = Path(f"/tmp/study/w{seed}")
fresh = not (work / "target").exists()
work.mkdir(parents=True, exist_ok=True)
SEQ, MICRO = 256, 16
shape = (128, 4, 4, 2, 32, 384)
files = S.stdlib_files(None)
held = files[::10]
train_files = [f for f in files if f not in set(held)][:400]
if fresh:
    train_data = S.prepare(train_files, work / "train-data", SEQ)
    eval_data = S.prepare(held[:60], work / "heldout-data", SEQ)
    doc = S.decoder_spec(
        train_data,
        work / "target-run",
        shape,
        seconds=None,
        steps=300,
        seq_len=SEQ,
        micro=MICRO,
        lr=1e-3,
        gpu=False,
        every=100,
    )
    S.train_and_export(doc, work / "target-run", work / "target", "target")
train_data, eval_data, target = work / "train-data", work / "heldout-data", work / "target"

# regenerate: prompts from the training text, greedy continuations by the target
regen_dir = work / "regen-text"
if not regen_dir.exists():
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
    prompts = held_out_prompts(
        str(train_data), count=int(sys.argv[2]) if len(sys.argv) > 2 else 1024, length=64
    )
    regen_dir.mkdir()
    t = time.perf_counter()
    batch = torch.stack([p.view(-1) for p in prompts])
    outs = []
    with torch.inference_mode():
        for i in range(0, len(batch), 128):
            out = model.generate(
                batch[i : i + 128],
                max_new_tokens=192,
                do_sample=False,
                pad_token_id=258,
                eos_token_id=None,
            )
            outs.append(out)
    out = torch.cat(outs)
    print("regenerated", out.shape, f"{time.perf_counter() - t:.1f}s", file=sys.stderr)
    for i, row in enumerate(out.tolist()):
        data = bytes(x for x in row if x < 256)
        (regen_dir / f"r{i:05d}.py").write_text(data.decode("utf-8", errors="replace"))
    S.prepare(sorted(regen_dir.glob("*.py")), work / "regen-data", SEQ)
regen_data = work / "regen-data"


def dflash(name, data, steps):
    if (work / f"{name}-drafter").exists():
        return work / f"{name}-drafter"
    doc = S.decoder_spec(
        data,
        work / f"{name}-run",
        shape,
        seconds=None,
        steps=steps,
        seq_len=SEQ,
        micro=MICRO,
        lr=1e-3,
        gpu=False,
        every=100,
    )
    doc["launch"]["seed"] = seed
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
    return S.train_and_export(doc, work / f"{name}-run", work / f"{name}-drafter", name)[0]


def ar(name, data, steps):
    if (work / f"{name}-drafter").exists():
        return work / f"{name}-drafter"
    h, _, heads, kv, hd, inter = shape
    doc = S.decoder_spec(
        data,
        work / f"{name}-run",
        (h, 2, heads, kv, hd, inter),
        seconds=None,
        steps=steps,
        seq_len=SEQ,
        micro=MICRO,
        lr=1e-3,
        gpu=False,
        every=100,
    )
    doc["launch"]["seed"] = seed
    return S.train_and_export(doc, work / f"{name}-run", work / f"{name}-drafter", "ar-drafter")[0]


arms = {
    "dflash-real": dflash("dflash-real", train_data, 350),
    "dflash-regen": dflash("dflash-regen", regen_data, 350),
    "ar-real": ar("ar-real", train_data, 523),
    "ar-regen": ar("ar-regen", regen_data, 523),
}
reports = compare(
    str(target),
    [str(p) for p in arms.values()],
    str(eval_data),
    block_size=8,
    max_new_tokens=64,
    num_prompts=48,
    prompt_len=64,
    strict=False,
)
R = dict(zip(arms, reports, strict=True))
for name, r in R.items():
    print(f"seed {seed} {name:14s} tau {r.tau:.2f} +- {r.tau_stderr:.2f} lossless {r.lossless}")
for d in ("dflash-real", "dflash-regen"):
    for a in ("ar-real", "ar-regen"):
        print(
            f"seed {seed} {d}/{a}: {R[d].tau / R[a].tau:.2f} +- {tau_ratio_stderr(R[d], R[a]):.2f}"
        )
