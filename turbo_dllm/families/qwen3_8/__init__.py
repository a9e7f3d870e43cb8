"""Qwen3.8 (transformers' `qwen3_5`): the Gated DeltaNet / full-attention hybrid, family `qwen3_8`.

Torch-free: the descriptor the registry lists and its RunSpec rules. The torch half is `runtime`
(model.py, gated_delta.py, parallelize.py); the config reader and presets are `config`.
"""

from __future__ import annotations

from typing import Any

from turbo_dllm.families.base import Family, checkpoint_mask_problems
from turbo_dllm.families.qwen3_8.config import (
    CONFIG_KEYS,
    GDN_CHUNK,
    MODEL_TYPES,
    PRESETS,
    Qwen38Config,
    tensor_parallel_problems,
)

__all__ = ["QWEN3_8"]

_CSBP_SHARDED = (
    "block parallelism with a sharded clean stream (bp > 1 and cp > 1) would need each rank's "
    "noisy blocks to get their clean states from the ranks holding those clean chunks, which this "
    "version does not have; use bp with cp 1 (the clean prefix whole on each rank) or cp alone "
    "(the clean state handed from rank to rank)"
)
_CP_RECOMPUTE = (
    "activation checkpointing would re-run the linear layers' cross-rank state hand-off inside "
    "the backward, out of the order the other ranks run it; turn it off with topology.cp > 1"
)


def _rules(spec: Any, config: Qwen38Config) -> list[tuple[str, str]]:
    found = [("topology.tp", m) for m in tensor_parallel_problems(config, spec.topology.tp)]
    topology, objective = spec.topology, spec.objective
    if topology.cp > 1 and topology.bp > 1:
        found.append(("topology.bp", _CSBP_SHARDED))
    if topology.cp > 1 and spec.training.activation_checkpointing:
        found.append(("training.activation_checkpointing", _CP_RECOMPUTE))
    if "linear_attention" not in config.layer_types or "full_attention" not in config.layer_types:
        found.append(
            (
                "model.config_overrides",
                "layer_types must hold both linear_attention and "
                "full_attention layers (Qwen3.8 is the hybrid)",
            )
        )
    if spec.model.linear_attention == "fla" and objective.block_size % GDN_CHUNK:
        found.append(
            (
                "objective.block_size",
                f"{objective.block_size} is not a multiple of fla's chunk ({GDN_CHUNK}): the "
                "clean stream's state is captured at block boundaries, which must be chunk "
                "boundaries",
            )
        )
    found += checkpoint_mask_problems(spec, config.mask_token_id)
    if objective.name == "fast_dllm_v2":
        if objective.loss_weighting not in (None, "unit"):
            found.append(("objective.loss_weighting", "fast_dllm_v2 on qwen3_8 uses unit weights"))
        if not objective.antithetic:
            found.append(("objective.antithetic", "fast_dllm_v2 on qwen3_8 samples antithetic t"))
    return found


QWEN3_8 = Family(
    name="qwen3_8",
    summary="Qwen3.8 / Qwen3.5 hybrid (Gated DeltaNet + gated full attention) for block diffusion",
    model_types=MODEL_TYPES,
    objectives=("fast_dllm_v2", "block_diffusion"),
    axes=frozenset({"fsdp", "cp", "tp", "bp", "sp"}),
    presets=PRESETS,
    read_config=Qwen38Config.from_hf_dict,
    runtime_module="turbo_dllm.families.qwen3_8.runtime",
    input_rules="turbo_dllm.families.qwen3_8.inputs:input_problems",
    rules=_rules,
    axis_reasons={
        "ep": "Qwen3.8 is dense (no experts)",
    },
    model_options=("linear_attention",),
    config_keys=CONFIG_KEYS,
)
