"""CPU world (session 21), session 12/13's scaled-down speculative setting rebuilt: stdlib text,
byte tokens, seq 256; a (128, 4 layers) target trained 300 steps; a 2-layer AR drafter 523 steps
and a 2-layer DFlash drafter 350 steps (`greedy_ce` + `greedy_path`, locality anchors, 64 per row,
decay 7), constant lr 1e-3, seed 1. Folders under /tmp/study21."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import speculative as S  # noqa: E402

SEQ, MICRO = 256, 16
SHAPE = (128, 4, 4, 2, 32, 384)
W = Path("/tmp/study21")
TRAIN, HELD = W / "data/train-data", W / "data/heldout-data"
TARGET = W / "target"


def data() -> None:
    if TRAIN.exists():
        return
    (W / "data").mkdir(parents=True, exist_ok=True)
    files = S.stdlib_files(None)
    held = files[::10]
    S.prepare([f for f in files if f not in set(held)], TRAIN, SEQ)
    S.prepare(held, HELD, SEQ)


def target() -> None:
    if TARGET.exists():
        return
    doc = S.decoder_spec(TRAIN, W / "target-run", SHAPE, seconds=None, steps=300, seq_len=SEQ,
                         micro=MICRO, lr=1e-3, gpu=False, every=50)  # fmt: skip
    S.train_and_export(doc, W / "target-run", TARGET, "target")


def ar(layers: int = 2, steps: int = 523) -> Path:
    out = W / f"ar{layers}-drafter"
    if not out.exists():
        h, _, heads, kv, hd, inter = SHAPE
        doc = S.decoder_spec(TRAIN, W / f"ar{layers}-run", (h, layers, heads, kv, hd, inter),
                             seconds=None, steps=steps, seq_len=SEQ, micro=MICRO, lr=1e-3,
                             gpu=False, every=100)  # fmt: skip
        doc["launch"]["seed"] = 1
        S.train_and_export(doc, W / f"ar{layers}-run", out, f"ar-{layers}l")
    return out


def dflash(name: str, steps: int = 350, layers: int = 2, **objective) -> Path:
    out = W / f"{name}-drafter"
    if out.exists():
        return out
    run = W / f"{name}-run"
    doc = S.decoder_spec(TRAIN, run, SHAPE, seconds=None, steps=steps, seq_len=SEQ, micro=MICRO,
                         lr=1e-3, gpu=False, every=100)  # fmt: skip
    doc["launch"]["seed"] = 1
    doc["model"] = {
        "family": "dflash",
        "from_config": "target",
        "dflash": {"target": str(TARGET), "num_layers": layers, "block_size": 8,
                   "mask_token_id": 259},
    }  # fmt: skip
    doc["objective"] = {
        "name": "dflash_distillation", "block_size": 8, "max_anchors": 64,
        "anchor_sampling": "locality", "decay_gamma": 7.0, "dflash_loss": "greedy_ce",
        "greedy_path": True, **objective,
    }  # fmt: skip
    S.train_and_export(doc, run, out, f"dflash-{name}")
    return out


if __name__ == "__main__":
    data()
    target()
    ar()
    dflash("base")
