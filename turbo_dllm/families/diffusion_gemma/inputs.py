"""The family's input rules: a data artifact must hold one example per row, tokenized with the
model folder's tokenizer (torch-free).

DiffusionGemma's stream is one example per row (`CanvasLayout`: a prompt, then its response as
the canvas). The loader numbers each document of a row and each padding run as a segment, and the
family's attention refuses a row of several; `diffusiongemma_sft` takes a row's first document
as its example and the rest as padding (`example_ends`). Found here from the document index
before training starts, not at the first such batch.

Data prepared with another tokenizer than the one saved in the model folder (`model.path`) would
be other text to the model: refused too (`model_tokenizer_problems`).
"""

from __future__ import annotations

from typing import Any

from turbo_dllm.errors import DllmError
from turbo_dllm.families.decoder.inputs import model_tokenizer_problems

__all__ = ["input_problems"]

_HINTS = {
    "diffusiongemma_sft": "prepare the data with packing.block_size equal to packing.seq_len and "
    "overflow: truncate (each document then starts its own row)",
    "block_diffusion": "train with objective.name: diffusiongemma_sft (which takes padding "
    "after a row's example), or prepare documents that each fill a whole row",
}


def input_problems(spec: Any) -> list[tuple[str, str]]:
    """Rows of `spec.data.artifact` that the objective cannot take as one example each, and data
    of another tokenizer than the model folder's."""
    if spec.data.artifact is None:
        return []
    import numpy as np

    from turbo_dllm.data.artifact import DataArtifact

    found = model_tokenizer_problems(spec)
    try:
        artifact = DataArtifact(spec.data.artifact)
    except DllmError:  # the data checks report an unreadable artifact
        return found
    seq_len = artifact.manifest.seq_len
    documents = np.asarray(artifact.documents)
    starts, ends = documents[:, 0], documents[:, 0] + documents[:, 1]
    if spec.objective.name == "diffusiongemma_sft":  # padding after a row's example is fine
        inside = starts % seq_len != 0
        what = "a document that starts after another one in its row (packed data)"
    else:  # block_diffusion: its document ids mark padding too, which the attention refuses
        inside = (starts % seq_len != 0) | (ends % seq_len != 0)
        what = "a document boundary inside the row (several documents, or padding after one)"
    rows = np.unique(np.concatenate([starts[inside], np.maximum(ends[inside] - 1, 0)]) // seq_len)
    if not len(rows):
        return found
    return found + [
        (
            "data.artifact",
            f"{len(rows)} of its {artifact.manifest.num_sequences} rows (row {int(rows[0])} "
            f"first) hold {what}; DiffusionGemma trains one example per row under "
            f"{spec.objective.name}: {_HINTS.get(spec.objective.name, _HINTS['block_diffusion'])}",
        )
    ]
