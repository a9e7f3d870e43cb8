"""When CSBP on GPUs would run the slow pure-torch merge: one rule for `dllm launch` (through
doctor's `attention merge` check) and the trainer's startup line. Torch-free."""

from __future__ import annotations

__all__ = ["slow_merge_warning"]


def slow_merge_warning(bp: int, kernels: str, device: str) -> str | None:
    """Why this run should use the native merge op, or None when it does not matter.

    Block parallelism (bp > 1) merges two attention partials per layer; `kernels: reference`
    merges them in pure torch, which on GPUs keeps float32 copies of both partials until the
    backward and runs far slower than the native op. On CPU the reference is the only choice.
    """
    if device != "cuda" or bp <= 1 or kernels != "reference":
        return None
    return (
        "bp > 1 with `kernels: reference` on GPUs: the pure-torch merge keeps float32 copies of "
        "both attention partials until the backward (4.3 GB per GPU at 524K tokens, Qwen3-1.7B) "
        "and runs ~8x slower than the native op"
    )
