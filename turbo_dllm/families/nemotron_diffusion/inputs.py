"""The family's input rules: a data artifact's tokenizer and mask token against the checkpoint's.

- The tokenizer: data prepared with another tokenizer than the one saved in the model folder
  would be other text to the model (`model_tokenizer_problems`).
- The mask token: with `objective.mask_token_id` unset the trainer masks with the artifact's
  mask token (`train/data.py`), which the torch-free rules cannot see.

`dllm train` and `dllm launch` run these before the run starts (`Family.input_rules`), `dllm data
validate --config` and `dllm doctor` say them beforehand.
"""

from __future__ import annotations

from typing import Any

from turbo_dllm.errors import DllmError
from turbo_dllm.families.base import artifact_mask_problems
from turbo_dllm.families.decoder.inputs import model_tokenizer_problems

__all__ = ["input_problems"]


def input_problems(spec: Any) -> list[tuple[str, str]]:
    artifact = spec.data.artifact
    if artifact is None:
        return []
    found = model_tokenizer_problems(spec)
    if spec.objective.mask_token_id is not None:
        return found  # a set mask token: the family rules check it, the data the artifact's
    from turbo_dllm.data.artifact import read_manifest
    from turbo_dllm.registry import resolve_model_config

    try:
        mask = resolve_model_config(spec.model).mask_token_id
        data_mask = read_manifest(artifact).special_tokens.get("mask")
    except DllmError:
        return found  # reported by the model and data checks
    return found + artifact_mask_problems(spec, mask, data_mask)
