"""Say when torch.compile could not trace the compiled layers in one piece.

A graph break splits a compiled layer into several graphs (less fusion); inside an activation-
checkpointed layer it is worse: dynamo cannot put a broken body into the checkpoint's graph and
runs the whole layer eagerly, every norm and RoPE a kernel of its own. Nothing fails, the step is
just slower (0.8x at 32K on the H200 when our attention op broke the graph), so the trainer
reports the breaks of its first step, when the layers compile.
"""

from __future__ import annotations

from collections import Counter

__all__ = ["graph_break_counts", "graph_break_warning"]


def graph_break_counts() -> Counter:
    """Dynamo's graph breaks so far in this process, by reason (a copy)."""
    from torch._dynamo.utils import counters

    return Counter(counters["graph_break"])


def graph_break_warning(before: Counter, after: Counter, *, checkpointing: bool) -> str | None:
    """The warning for the breaks counted between two `graph_break_counts()`, or None."""
    new = after - before
    if not new:
        return None
    total = sum(new.values())
    reason, _ = new.most_common(1)[0]
    first_line = next((line.strip() for line in reason.splitlines() if line.strip()), reason)
    consequence = (
        "with activation checkpointing a break inside a layer runs that whole layer eagerly"
        if checkpointing
        else "each break splits a compiled graph (less fusion)"
    )
    return (
        f"torch.compile hit {total} graph break{'s' if total > 1 else ''} in the first step "
        f"({len(new)} reason{'s' if len(new) > 1 else ''}; most frequent: {first_line}): "
        f"{consequence}. TORCH_LOGS=graph_breaks shows where."
    )
