"""The family's input rule: a data artifact's mask token against the checkpoint's.

With `objective.mask_token_id` unset the trainer masks with the artifact's mask token
(`train/data.py`), which the torch-free rules cannot see; `dllm train` and `dllm launch` run this
before the run starts (`Family.input_rules`).
"""

from __future__ import annotations

from typing import Any

from turbo_dllm.errors import DllmError
from turbo_dllm.families.base import artifact_mask_problems

__all__ = ["input_problems"]


def input_problems(spec: Any) -> list[tuple[str, str]]:
    artifact = spec.data.artifact
    if artifact is None or spec.objective.mask_token_id is not None:
        return []  # a set mask token: the family rules check it, the data checks the artifact's
    from turbo_dllm.data.artifact import read_manifest
    from turbo_dllm.registry import resolve_model_config

    try:
        mask = resolve_model_config(spec.model).mask_token_id
        data_mask = read_manifest(artifact).special_tokens.get("mask")
    except DllmError:
        return []  # reported by the model and data checks
    return artifact_mask_problems(spec, mask, data_mask)
