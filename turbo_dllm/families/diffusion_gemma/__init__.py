"""DiffusionGemma (family `diffusion_gemma`): the MoE block-diffusion Gemma of transformers'
`DiffusionGemmaForBlockDiffusion`.

Torch-free: the descriptor the registry lists. The torch half is `runtime` (model.py,
experts.py, attention.py); the config reader and presets are `config`.
"""

from __future__ import annotations

from typing import Any

from turbo_dllm.families.base import Family
from turbo_dllm.families.diffusion_gemma.config import CONFIG_KEYS, PRESETS, DiffusionGemmaConfig

__all__ = ["DIFFUSION_GEMMA"]


def _rules(spec: Any, config: DiffusionGemmaConfig) -> list[tuple[str, str]]:
    found = []  # (synthetic vocabulary and mask token against vocab_size: config.validate)
    ep = spec.topology.ep
    if ep > 1 and config.num_experts % ep:
        found.append(
            ("topology.ep", f"num_experts = {config.num_experts} is not divisible by ep = {ep}")
        )
    if spec.objective.name == "diffusiongemma_sft" and spec.objective.loss_weighting == "inverse_t":
        found.append(
            (
                "objective.loss_weighting",
                "diffusiongemma_sft weighs every label by its block (unit); inverse_t is for "
                "absorbing-mask objectives",
            )
        )
    if spec.objective.name == "diffusiongemma_sft" and spec.objective.mask_token_id is not None:
        found.append(
            (
                "objective.mask_token_id",
                "diffusiongemma_sft noises with uniform random ids and never masks: the mask "
                "token would be ignored (leave it out)",
            )
        )
    block, canvas = spec.objective.block_size, config.canvas_length
    if spec.model.path is not None and block != canvas:
        # (a preset's canvas_length is a placeholder: its runs choose their block size)
        found.append(
            (
                "objective.block_size",
                f"{block} is not the model folder's canvas_length ({canvas}): transformers' "
                "DiffusionGemma generates canvases of canvas_length tokens, so its export "
                f"would denoise blocks of {canvas} after training on blocks of {block}; set "
                f"objective.block_size: {canvas}, or model.config_overrides: "
                f"{{canvas_length: {block}}} to train and export the model at {block}",
            )
        )
    if spec.model.attention == "turbo":
        found.append(
            (
                "model.attention",
                "the turbo kernel has no DiffusionGemma pattern (token-causal clean stream, "
                "sliding windows)",
            )
        )
    # (cp and data.seq_len: the generic rule asks for whole blocks in each of 2*cp chunks)
    cp = spec.topology.cp
    if cp > 1 and spec.objective.block_size % (2 * cp):
        found.append(
            (
                "objective.block_size",
                f"{spec.objective.block_size} is not divisible by 2*cp = {2 * cp} (cp splits the "
                "response canvas, which starts anywhere, into 2*cp equal chunks)",
            )
        )
    if cp > 1 and spec.topology.bp > 1:
        found.append(
            (
                "topology.bp",
                "diffusion_gemma does not combine cp and bp (bp holds the whole clean stream on "
                "every rank; sharding it too is not implemented): use one of them",
            )
        )
    return found


DIFFUSION_GEMMA = Family(
    name="diffusion_gemma",
    summary="DiffusionGemma: MoE Gemma-4 transformer, clean encoder stream + noisy canvas",
    model_types=("diffusion_gemma",),
    objectives=("diffusiongemma_sft", "block_diffusion"),
    axes=frozenset({"fsdp", "ep", "cp", "bp"}),
    presets=PRESETS,
    read_config=DiffusionGemmaConfig.from_hf_dict,
    runtime_module="turbo_dllm.families.diffusion_gemma.runtime",
    rules=_rules,
    input_rules="turbo_dllm.families.diffusion_gemma.inputs:input_problems",
    axis_reasons={
        "tp": "tensor parallelism is not implemented for this family (its attention heads, "
        "dense MLP and experts would all need splitting; use ep for the experts, cp for long "
        "sequences)",
        "sp": "sequence parallelism needs tensor parallelism",
    },
    config_keys=CONFIG_KEYS,
)
