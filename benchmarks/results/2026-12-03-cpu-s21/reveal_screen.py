"""CPU screen (session 21): a DFlash drafter trained with shown slots (`objective.reveal_blocks`)
and decoded in several forwards per block (`--draft-steps`), against the plain DFlash drafter and
the AR drafter of world.py, at equal steps (350 / 523), on 48 held-out prompts x 64 new tokens.
Usage: reveal_screen.py NAME REVEAL [STEPS...]: trains dflash NAME with reveal_blocks REVEAL."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import world as W  # noqa: E402

from turbo_dllm.families.dflash.speculative import compare, tau_ratio_stderr  # noqa: E402

name, reveal = sys.argv[1], float(sys.argv[2])
steps = [int(s) for s in sys.argv[3:]] or [1, 2, 3]
W.data()
W.target()
ar, base = W.ar(), W.dflash("base")
shown = W.dflash(name, reveal_blocks=reveal)
common = dict(block_size=8, max_new_tokens=64, num_prompts=48, prompt_len=64, strict=False)
ar_report, base_report = compare(str(W.TARGET), [str(ar), str(base)], str(W.HELD), **common)
print(f"ar: tau {ar_report.tau:.2f} +- {ar_report.tau_stderr:.2f}", flush=True)
print(f"base, 1 step: tau {base_report.tau:.2f} +- {base_report.tau_stderr:.2f}  ratio "
      f"{base_report.tau / ar_report.tau:.2f} +- {tau_ratio_stderr(base_report, ar_report):.2f}",
      flush=True)  # fmt: skip
for s in steps:
    (r,) = compare(str(W.TARGET), [str(shown)], str(W.HELD), draft_steps=s, **common)
    print(f"{name} (reveal {reveal}), {s} steps: tau {r.tau:.2f} +- {r.tau_stderr:.2f}  ratio "
          f"{r.tau / ar_report.tau:.2f} +- {tau_ratio_stderr(r, ar_report):.2f}  lossless "
          f"{r.lossless}  hist {dict(sorted(r.accepted_histogram.items()))}", flush=True)  # fmt: skip
