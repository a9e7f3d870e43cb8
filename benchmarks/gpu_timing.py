"""Timing of GPU work for the benchmarks: the median of CUDA-event-timed calls."""

from __future__ import annotations

import torch


def median_ms(fn, repeats: int, warmup: int = 3, pipelined: bool = True) -> float:
    """Median milliseconds of `repeats` calls of `fn` after `warmup` untimed ones.

    pipelined (as `triton.testing.do_bench` times): the calls are queued back to back, each
    between its own pair of CUDA events, with one synchronisation at the end, so the host's
    work for a call (Python, the op's dispatch, the launch) runs while the GPU runs the one
    before, as in a training step: the time is the GPU's. Otherwise the host waits for each call
    before queueing the next, so the GPU sits idle through the host's work before the call's
    first kernel and that counts too (what a lone call on an idle GPU costs)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    events = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        events.append((start, end))
        if not pipelined:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    times = sorted(start.elapsed_time(end) for start, end in events)
    return times[len(times) // 2]
