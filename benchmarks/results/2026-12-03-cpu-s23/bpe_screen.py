"""CPU screen (session 23): the speculative benchmark's world scaled down, on BPE tokens
(`train_bpe`, 2,048 tokens) instead of bytes. A (128, 4 layers) target trained 300 steps; the
2-layer AR drafter at several step counts (does a shorter run draft held-out text better?);
the 2-layer DFlash drafter (`greedy_ce` + `greedy_path` + `reveal_blocks: 0.5`, three draft
forwards) at 350 steps. seq 256, micro 16, lr 1e-3 constant, seed 1; 48 held-out prompts of 32
tokens, 32 new tokens. Folders under /tmp/study23."""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import speculative as S  # noqa: E402

SEQ, MICRO, VOCAB = 256, 16, 2048
SHAPE = (128, 4, 4, 2, 32, 384)
W = Path("/tmp/study23")
TOK, TRAIN, HELD = W / "tokenizer", W / "data/train-data", W / "data/heldout-data"
TARGET = W / "target"


def data() -> int:
    files = S.stdlib_files(None)
    held = files[::10]
    training = [f for f in files if f not in set(held)]
    if not TOK.exists():
        S.train_bpe(training, TOK, VOCAB)
    if not TRAIN.exists():
        (W / "data").mkdir(parents=True, exist_ok=True)
        S.prepare(training, TRAIN, SEQ, TOK)
        S.prepare(held, HELD, SEQ, TOK)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TOK), local_files_only=True).mask_token_id


def spec(run, shape, steps):
    doc = S.decoder_spec(TRAIN, run, shape, seconds=None, steps=steps, seq_len=SEQ, micro=MICRO,
                         lr=1e-3, gpu=False, every=100, vocab=VOCAB)  # fmt: skip
    doc["launch"]["seed"] = 1
    return doc


def target() -> None:
    if not TARGET.exists():
        S.train_and_export(spec(W / "target-run", SHAPE, 300), W / "target-run", TARGET, "target")


def ar(steps: int) -> Path:
    out = W / f"ar-{steps}"
    if not out.exists():
        h, _, heads, kv, hd, inter = SHAPE
        run = W / f"ar-{steps}-run"
        S.train_and_export(spec(run, (h, 2, heads, kv, hd, inter), steps), run, out, f"ar-{steps}")
    return out


def dflash(mask: int, steps: int = 350) -> Path:
    out = W / "dflash"
    if not out.exists():
        run = W / "dflash-run"
        doc = spec(run, SHAPE, steps)
        doc["model"] = {
            "family": "dflash", "from_config": "target",
            "dflash": {"target": str(TARGET), "num_layers": 2, "block_size": 8, "mask_token_id": mask},
        }  # fmt: skip
        doc["objective"] = {
            "name": "dflash_distillation", "block_size": 8, "max_anchors": 64,
            "anchor_sampling": "locality", "decay_gamma": 7.0, "dflash_loss": "greedy_ce",
            "greedy_path": True, "reveal_blocks": 0.5,
        }  # fmt: skip
        S.train_and_export(doc, run, out, "dflash")
    return out


if __name__ == "__main__":
    from turbo_dllm.families.dflash.speculative import compare, tau_ratio_stderr

    mask = data()
    target()
    ars = {steps: ar(steps) for steps in (130, 260, 523)}
    drafter = dflash(mask)
    reports = compare(
        str(TARGET), [str(drafter)] + [str(f) for f in ars.values()], str(HELD), block_size=8,
        draft_steps=[3] + [1] * len(ars), max_new_tokens=32, num_prompts=48, prompt_len=32,
        strict=True,
    )  # fmt: skip
    d = reports[0]
    rows = {
        "dflash (350 steps, 3 forwards)": d,
        **{f"ar {s} steps": r for s, r in zip(ars, reports[1:], strict=True)},
    }
    for name, r in rows.items():
        ratio = (
            "" if r is d else f"  dflash / this {d.tau / r.tau:.2f} +- {tau_ratio_stderr(d, r):.2f}"
        )
        print(
            f"{name:32s} tau {r.tau:.2f} +- {r.tau_stderr:.2f}  hist {dict(sorted(r.accepted_histogram.items()))}{ratio}"
        )
    losses = {p.name: json.loads((p / "metrics.jsonl").read_text().splitlines()[-1])["loss"]
              for p in sorted(W.glob("*-run"))}  # fmt: skip
    print("last training losses:", {k: round(v, 3) for k, v in losses.items()})
