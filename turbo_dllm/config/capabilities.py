"""What this version of turbo-dllm can run.

The RunSpec names every family, objective and parallel mode of the product; the ones whose code
has not landed yet are listed here as unavailable, and validation rejects them with
"not available in this version". Landing a capability means adding it here with its code.
"""

from __future__ import annotations

__all__ = [
    "AVAILABLE_FAMILIES",
    "AVAILABLE_OBJECTIVES",
    "AVAILABLE_PARALLEL",
    "MOE_FAMILIES",
    "OBJECTIVES_FOR_FAMILY",
]

AVAILABLE_FAMILIES: frozenset[str] = frozenset({"causal_lm", "qwen3"})
AVAILABLE_OBJECTIVES: frozenset[str] = frozenset({"block_diffusion", "fast_dllm_v2"})
# Topology axes (besides plain data parallelism) whose code has landed.
AVAILABLE_PARALLEL: frozenset[str] = frozenset({"dp", "fsdp", "cp", "bp", "tp", "sp"})

MOE_FAMILIES: frozenset[str] = frozenset({"diffusion_gemma"})

OBJECTIVES_FOR_FAMILY: dict[str, frozenset[str]] = {
    "causal_lm": frozenset({"block_diffusion", "fast_dllm_v2"}),
    "qwen3": frozenset({"block_diffusion", "fast_dllm_v2"}),
    "nemotron_diffusion": frozenset({"block_diffusion"}),
    "dflash": frozenset({"dflash_distillation"}),
    "diffusion_gemma": frozenset({"diffusiongemma_sft"}),
}
