"""After `speculative` with --dflash-variants greedy-ce-reveal (its drafters in
/tmp/dllm-speculative): the same shown-slot drafter decoded in 1, 2 and 3 forwards per block,
against the same AR drafter, on the first --num-prompts held-out prompts. $STEPS picks the
forwards (default 1,2,3), $BLOCK the block size (default 8; session 22 ran block 16)."""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.getcwd())
from turbo_dllm.families.dflash.speculative import compare, tau_ratio_stderr  # noqa: E402

work = Path("/tmp/dllm-speculative")
prompts = int(sys.argv[1]) if len(sys.argv) > 1 else 16
steps = [int(s) for s in os.environ.get("STEPS", "1,2,3").split(",")]
drafters = [str(work / "dflash-drafter")] * len(steps) + [str(work / "ar-drafter")]
reports = compare(
    str(work / "target"), drafters, str(work / "heldout-data"),
    block_size=int(os.environ.get("BLOCK", "8")),
    max_new_tokens=128, num_prompts=prompts, prompt_len=64, strict=False,
    draft_steps=steps + [1], progress=print,
)  # fmt: skip
ar = reports[-1]
rows = []
for s, r in zip(steps, reports, strict=False):
    ratio, se = r.tau / ar.tau, tau_ratio_stderr(r, ar)
    print(f"reveal drafter, {s} forwards: tau {r.tau:.2f} +- {r.tau_stderr:.2f}, "
          f"{r.speedup:.2f}x, ratio {ratio:.2f} +- {se:.2f}, lossless {r.lossless}, "
          f"hist {dict(sorted(r.accepted_histogram.items()))}")  # fmt: skip
    rows.append({"draft_steps": s, **r.to_dict(), "ratio": ratio, "ratio_stderr": se})
print(f"ar: tau {ar.tau:.2f} +- {ar.tau_stderr:.2f}, {ar.speedup:.2f}x")
out = Path(os.environ.get("OUT", ".")) / "draft_steps.json"
out.write_text(json.dumps({"rows": rows, "ar": ar.to_dict()}, indent=1))
