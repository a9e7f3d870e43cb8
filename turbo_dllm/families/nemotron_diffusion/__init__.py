"""Nemotron-Labs-Diffusion (dense decoder with attention variants), family `nemotron_diffusion`.

Torch-free: the descriptor and its RunSpec rules. The torch half is `runtime` (model.py,
parallelize.py, both built on the decoder's); the config reader and presets are `config`.
"""

from __future__ import annotations

from typing import Any

from turbo_dllm.families.base import Family, checkpoint_mask_problems
from turbo_dllm.families.decoder.config import tensor_parallel_problems
from turbo_dllm.families.nemotron_diffusion.config import (
    CONFIG_KEYS,
    MODEL_TYPES,
    PRESETS,
    NemotronConfig,
)

__all__ = ["NEMOTRON_DIFFUSION"]


def _rules(spec: Any, config: NemotronConfig) -> list[tuple[str, str]]:
    found = [("topology.tp", m) for m in tensor_parallel_problems(config, spec.topology.tp)]
    objective = spec.objective
    if config.block_size is not None and objective.block_size != config.block_size:
        found.append(
            (
                "objective.block_size",
                f"{objective.block_size} differs from the checkpoint's block_size "
                f"({config.block_size}); set it to {config.block_size} or override block_size",
            )
        )
    found += checkpoint_mask_problems(spec, config.mask_token_id)
    return found


NEMOTRON_DIFFUSION = Family(
    name="nemotron_diffusion",
    summary="Nemotron-Labs-Diffusion: a dense decoder (optional q/k/v norms, output gate) "
    "trained by block diffusion",
    model_types=MODEL_TYPES,
    objectives=("block_diffusion",),
    axes=frozenset({"fsdp", "cp", "bp", "tp", "sp"}),
    presets=PRESETS,
    read_config=NemotronConfig.from_hf_dict,
    runtime_module="turbo_dllm.families.nemotron_diffusion.runtime",
    input_rules="turbo_dllm.families.nemotron_diffusion.inputs:input_problems",
    rules=_rules,
    axis_reasons={"ep": "Nemotron-Labs-Diffusion is dense (no experts)"},
    config_keys=CONFIG_KEYS,
)
