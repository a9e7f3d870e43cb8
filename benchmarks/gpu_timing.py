"""Timing of GPU work for the benchmarks: the median of CUDA-event-timed calls."""

from __future__ import annotations

import torch


def median_ms(fn, repeats: int, warmup: int = 3) -> float:
    """Median milliseconds of `repeats` calls of `fn` after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]
