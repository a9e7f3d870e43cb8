"""GPU memory when it runs out: a user error with the fixes, and where the bytes went.

`profiler.memory_snapshot: true` records every CUDA allocation with its Python stack from the
first step. The recorder dumps the allocator snapshot (`profile/memory_rank<R>.pickle`, viewable
at https://pytorch.org/memory_viz) and a summary by allocating line (`.txt`) after the profiler
window's last step, and when a step runs out of memory. `summarise` reads any such snapshot;
`benchmarks/memory_snapshot.py` is its command line.
"""

from __future__ import annotations

import pickle
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from turbo_dllm.errors import DllmError

__all__ = ["MemoryRecorder", "out_of_memory", "site", "summarise", "summary_text"]

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


def summary_text(report: dict[str, Any]) -> str:
    lines = [f"reserved {report['reserved_gb']:.2f} GB, allocated {report['allocated_gb']:.2f} GB"]
    if report["oom"]:
        oom = report["oom"]
        lines.append(f"failed request: {oom['request_gb']:.2f} GB at {oom['site']}")
    lines += [f"{r['gb']:9.3f} GB {r['blocks']:6d} blocks  {r['site']}" for r in report["sites"]]
    return "\n".join(lines) + "\n"


class MemoryRecorder:
    """Allocation history for one rank (CUDA only; a no-op elsewhere or when not asked for)."""

    def __init__(self, spec, out_dir: Path, rank: int, device: torch.device) -> None:
        self.enabled = bool(spec.memory_snapshot) and device.type == "cuda"
        self.dump_after = spec.start_step + spec.num_steps - 1
        self.path = Path(out_dir) / f"memory_rank{rank}.pickle"
        if self.enabled:
            torch.cuda.memory._record_memory_history(max_entries=200_000, stacks="python")

    def after_step(self, step: int) -> Path | None:
        return self.dump() if step == self.dump_after else None

    def dump(self) -> Path | None:
        """Write the snapshot and its summary; returns the summary's path."""
        if not self.enabled:
            return None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        snapshot = torch.cuda.memory._snapshot()
        self.path.write_bytes(pickle.dumps(snapshot))
        text = self.path.with_suffix(".txt")
        text.write_text(summary_text(summarise(snapshot, top=30)))
        return text


def out_of_memory(step: int, device: torch.device, summary: Path | None) -> DllmError:
    """The user error for a step that ran out of GPU memory, with what to change."""
    where = ""
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory / GB
        peak = torch.cuda.max_memory_allocated(device) / GB
        where = f" ({peak:.1f} of {total:.1f} GB allocated at the peak)"
    seen = (
        f"where the memory went: {summary}"
        if summary
        else "set profiler.memory_snapshot: true to see where the memory goes"
    )
    return DllmError(
        f"out of GPU memory in step {step + 1}{where}",
        hint="lower data.seq_len or training.micro_batch_size; set "
        "training.activation_checkpointing: true; raise training.mlp_chunks; or spread the "
        f"sequence over more GPUs (topology.cp/bp, docs/parallelism.md). {seen}",
    )
