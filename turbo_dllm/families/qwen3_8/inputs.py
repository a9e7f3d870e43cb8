"""The family's input rules (`Family.input_rules`): what `dllm train` and `dllm launch` check in
the data artifact before the run starts, which the torch-free rules cannot read.

- The tokenizer: data prepared with another tokenizer than the one saved in the model folder
  would be other text to the model (`model_tokenizer_problems`; a folder migrated by `dllm model
  add-mask-token` matches data of its migrated tokenizer, and of the one before).
- The mask token: with `objective.mask_token_id` unset the trainer masks with the artifact's
  (`train/data.py`), which must be the checkpoint's (its mask-token migration's).
- One document per row: the linear layers' recurrent state would run from one document (or a
  padding run) into the next, so `runtime.model_mask` refuses a micro-batch holding a document
  boundary. An artifact with such rows would stop the run at the first step that draws one (step
  50 or step 5000: rows are drawn at random), so it is refused here.
"""

from __future__ import annotations

from typing import Any

from turbo_dllm.errors import DllmError
from turbo_dllm.families.base import artifact_mask_problems
from turbo_dllm.families.decoder.inputs import model_tokenizer_problems

__all__ = ["input_problems", "rows_with_boundaries"]


def rows_with_boundaries(documents: Any, seq_len: int, num_sequences: int) -> tuple[int, int]:
    """(how many rows hold a segment boundary, the first of them; -1 if none), from the
    artifact's document index (start, length): a document's start or end strictly inside a row
    splits it (segments as `DataArtifact.doc_ids` counts them)."""
    import numpy as np

    index = np.asarray(documents, dtype=np.int64).reshape(-1, 2)
    edges = np.concatenate([index[:, 0], index[:, 0] + index[:, 1]])
    edges = edges[(edges % seq_len != 0) & (edges > 0) & (edges < seq_len * num_sequences)]
    rows = np.unique(edges // seq_len)
    return len(rows), int(rows[0]) if len(rows) else -1


def input_problems(spec: Any) -> list[tuple[str, str]]:
    artifact = spec.data.artifact
    if artifact is None:
        return []
    from turbo_dllm.data.artifact import DataArtifact
    from turbo_dllm.registry import resolve_model_config

    found = model_tokenizer_problems(spec)
    try:
        data = DataArtifact(artifact)
        mask = resolve_model_config(spec.model).mask_token_id
    except DllmError:
        return found  # reported by the model and data checks
    manifest = data.manifest
    found += artifact_mask_problems(spec, mask, manifest.special_tokens.get("mask"))
    count, first = rows_with_boundaries(data.documents, manifest.seq_len, manifest.num_sequences)
    if count:
        found.append(
            (
                "data.artifact",
                f"{count} of its {manifest.num_sequences} rows hold more than one document or "
                f"padding run (row {first} first), which qwen3_8 cannot train on: the linear "
                "layers' recurrent state would run from one into the next, and the run would stop "
                "at the first step that draws such a row. Prepare rows of one document each: "
                "packing.overflow: truncate, from documents of at least packing.seq_len tokens",
            )
        )
    return found
