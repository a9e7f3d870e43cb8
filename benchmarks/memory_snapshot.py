"""Where the GPU memory is: summarise a CUDA allocator snapshot by allocation site.

`benchmarks/context_parallel.py --memory-snapshot DIR` dumps rank 0's snapshot when a trial
ends (or runs out of memory) into `DIR/<trial>/`; a training run with
`profiler.memory_snapshot: true` writes `profile/memory_rank<R>.pickle`. Both also write this
summary next to the snapshot (`.txt`). This groups the live blocks by the line of our code that
allocated them (the innermost frame under `turbo_dllm/`, else the innermost frame at all) and,
after an out-of-memory error, shows the request that failed:

    python benchmarks/memory_snapshot.py DIR/csbp-x2-524288/memory_rank0.pickle --top 25

Reading it on a machine without a GPU is fine: the snapshot is a plain pickle of dicts.
"""

from __future__ import annotations

import argparse
import pickle
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from turbo_dllm.train.memory import summarise, summary_text  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("snapshot", type=Path)
    p.add_argument("--top", type=int, default=20)
    args = p.parse_args(argv)
    with args.snapshot.open("rb") as handle:
        print(summary_text(summarise(pickle.load(handle), args.top)), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
