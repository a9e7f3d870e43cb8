"""Llama / Qwen2 / Qwen3 decoders: families `causal_lm` (any of the three) and `qwen3`.

Torch-free: the descriptors the registry lists. The torch half is `runtime` (model.py,
parallelize.py); the config reader and presets are `config`.
"""

from __future__ import annotations

from typing import Any

from turbo_dllm.families.base import Family
from turbo_dllm.families.decoder.config import (
    CONFIG_KEYS,
    PRESETS,
    DecoderConfig,
    tensor_parallel_problems,
)

__all__ = ["CAUSAL_LM", "QWEN3"]


def _rules(spec: Any, config: DecoderConfig) -> list[tuple[str, str]]:
    return [("topology.tp", m) for m in tensor_parallel_problems(config, spec.topology.tp)]


_COMMON = {
    "objectives": ("block_diffusion", "fast_dllm_v2", "autoregressive"),
    "axes": frozenset({"fsdp", "cp", "bp", "tp", "sp"}),
    "presets": PRESETS,
    "read_config": DecoderConfig.from_hf_dict,
    "runtime_module": "turbo_dllm.families.decoder.runtime",
    "rules": _rules,
    "input_rules": "turbo_dllm.families.decoder.inputs:input_problems",
    "axis_reasons": {"ep": "expert parallelism needs a mixture-of-experts family"},
    "config_keys": CONFIG_KEYS,
}

CAUSAL_LM = Family(
    name="causal_lm",
    summary="a Hugging Face Llama, Qwen2 or Qwen3 causal LM adapted to block diffusion",
    model_types=("llama", "qwen2", "qwen3"),
    **_COMMON,
)
QWEN3 = Family(
    name="qwen3",
    summary="Qwen3 (q/k norms) adapted to block diffusion",
    model_types=("qwen3",),
    **_COMMON,
)
