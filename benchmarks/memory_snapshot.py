"""Where the GPU memory is: summarise a CUDA allocator snapshot by allocation site.

`benchmarks/context_parallel.py --memory-snapshot DIR` dumps rank 0's snapshot when a trial
ends (or runs out of memory). This groups the live blocks by the line of our code that allocated
them (the innermost frame under `turbo_dllm/`, else the innermost frame at all) and, after an
out-of-memory error, shows the request that failed:

    python benchmarks/memory_snapshot.py DIR/csbp-x2-524288.pickle --top 25

Reading it on a machine without a GPU is fine: the snapshot is a plain pickle of dicts.
"""

from __future__ import annotations

import argparse
import pickle
from collections import Counter
from pathlib import Path
from typing import Any

GB = 1e9


def site(frames: list[dict[str, Any]]) -> str:
    """`file:line function` of the allocating code: ours first, else the innermost frame."""
    ours = [f for f in frames if "turbo_dllm/" in f.get("filename", "")]
    frame = (ours or frames or [{}])[0]
    if not frame:
        return "(no Python frame: C++ / autograd engine)"
    path = frame["filename"]
    short = path[path.index("turbo_dllm/") :] if "turbo_dllm/" in path else Path(path).name
    return f"{short}:{frame.get('line')} {frame.get('name')}"


def summarise(snapshot: dict[str, Any], top: int = 20) -> dict[str, Any]:
    """Live bytes by allocation site, reserved vs allocated, and the failed request (if any)."""
    sites: Counter = Counter()
    counts: Counter = Counter()
    reserved = allocated = 0
    for segment in snapshot.get("segments", []):
        reserved += segment["total_size"]
        for block in segment.get("blocks", []):
            if block["state"] != "active_allocated":
                continue
            allocated += block["size"]
            where = site(block.get("frames", []))
            sites[where] += block["size"]
            counts[where] += 1
    oom = None
    for trace in snapshot.get("device_traces", []):
        for event in trace:
            if event.get("action") == "oom":
                oom = {"request_gb": event["size"] / GB, "site": site(event.get("frames", []))}
    return {
        "reserved_gb": reserved / GB,
        "allocated_gb": allocated / GB,
        "sites": [
            {"site": where, "gb": size / GB, "blocks": counts[where]}
            for where, size in sites.most_common(top)
        ],
        "oom": oom,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("snapshot", type=Path)
    p.add_argument("--top", type=int, default=20)
    args = p.parse_args(argv)
    with args.snapshot.open("rb") as handle:
        report = summarise(pickle.load(handle), args.top)
    print(f"reserved {report['reserved_gb']:.2f} GB, allocated {report['allocated_gb']:.2f} GB")
    if report["oom"]:
        print(f"failed request: {report['oom']['request_gb']:.2f} GB at {report['oom']['site']}")
    for row in report["sites"]:
        print(f"{row['gb']:9.3f} GB {row['blocks']:6d} blocks  {row['site']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
