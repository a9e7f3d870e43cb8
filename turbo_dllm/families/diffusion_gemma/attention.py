"""The family's attention: the trainer's backend, given one mask per layer type.

The objectives build a block-diffusion layout; this wrapper turns it into DiffusionGemma's
pattern (`CanvasLayout`: token-causal clean stream, the canvas's clean prefix) and prepares one
mask per layer type, the sliding layers' with the config's window. The layers then call the
wrapped backend with their own mask (`StreamMasks`). Packed documents are refused: a diffusion
gemma row is one example (its prompt and response).
"""

from __future__ import annotations

from typing import Any

import torch

from turbo_dllm.errors import DllmError
from turbo_dllm.families.diffusion_gemma.config import DiffusionGemmaConfig
from turbo_dllm.families.diffusion_gemma.model import StreamMasks
from turbo_dllm.train.attention.canvas import CanvasLayout
from turbo_dllm.train.attention.layout import one_document_per_row

__all__ = ["StreamAttention", "canvas_of"]


def canvas_of(layout: Any) -> CanvasLayout:
    """The family's pattern for an objective's layout (a BD3 layout: every block noisy)."""
    if isinstance(layout, CanvasLayout):
        return layout
    return CanvasLayout.whole(layout.seq_len, layout.block_size)


class StreamAttention:
    def __init__(self, base: Any, config: DiffusionGemmaConfig) -> None:
        self.base = base
        self.name = base.name
        self.windows = {kind: config.window(kind) for kind in set(config.layer_types)}
        # The same StreamMasks object for the same layout: compiled layers guard on their inputs,
        # and a fresh wrapper every step could make them recompile.
        self._cache: dict[tuple, StreamMasks] = {}

    def prepare(
        self, layout: Any, doc_ids: torch.Tensor | None, device: torch.device
    ) -> StreamMasks:
        if not one_document_per_row(doc_ids):
            raise DllmError(
                "DiffusionGemma trains one example per row; the batch packs several documents",
                hint="prepare the data without packing (one prompt/response per sequence)",
            )
        canvas = canvas_of(layout)
        key = (canvas, str(device))
        if key not in self._cache:
            if len(self._cache) >= 4:
                self._cache.clear()
            masks = {
                kind: self.base.prepare(canvas.with_window(window), None, device)
                for kind, window in self.windows.items()
            }
            self._cache[key] = StreamMasks(masks=masks, canvas_len=canvas.canvas_len)
        return self._cache[key]

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any):
        return self.base(q, k, v, mask)
