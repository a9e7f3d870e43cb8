"""The frozen target inside the drafter's training process: its hidden states at the drafter's
`target_layer_ids` (and, for the KL loss, its final-normed last hidden states).

Feature i is entry `target_layer_ids[i] + 1` of transformers' hidden-state tuple
(`output_hidden_states`): layer `id`'s output, and for the target's last layer that output
after the final norm (the tuple's last entry), as the original's HF paths read it (z-lab's
`extract_context_feature`, SpecForge's HF target backend). docs/dflash.md says why.

Only the layers needed are built and loaded (up to the deepest feature layer; all of them when
the teacher's distribution is needed). bf16 on CUDA, float32 on CPU, no grad, eval mode.
Token-causal attention inside each packed document, as the target saw text when it was trained.
With `compile` (the run's `training.compile`) on CUDA each layer is compiled as the trainer
compiles its own (eager, the frozen target's norms, RoPE and masks are one small kernel each: in
the speculative benchmark's drafter step they were most of the GPU's time).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from turbo_dllm.families.dflash.attention import masked_attention
from turbo_dllm.families.dflash.config import DFlashConfig

__all__ = ["TargetFeatures", "causal_document_mask"]


def causal_document_mask(doc_ids: torch.Tensor | None, length: int, device) -> torch.Tensor:
    """(R or 1, 1, L, L) bool: query i sees keys j <= i of its own document."""
    idx = torch.arange(length, device=device)
    causal = (idx[None, :] <= idx[:, None])[None, None]
    if doc_ids is None:
        return causal
    docs = doc_ids.to(device)
    return causal & (docs[:, None, :, None] == docs[:, None, None, :])


def _attend(q, k, v, mask):
    return masked_attention(q, k, v, mask)


class TargetFeatures:
    """`features(input_ids, doc_ids) -> (features (R, L, n x H), teacher hidden (R, L, H) or None)`."""

    def __init__(
        self,
        target_path: str,
        config: DFlashConfig,
        *,
        teacher: bool,
        device: torch.device,
        dtype: torch.dtype | None = None,
        compile: bool = False,
    ) -> None:
        from turbo_dllm.families.decoder.runtime import build_model
        from turbo_dllm.families.dflash import read_target_config
        from turbo_dllm.train.weights import materialize

        target = read_target_config(target_path)
        self.layer_ids = tuple(config.target_layer_ids)
        self.teacher = teacher
        self.last = target.num_hidden_layers - 1  # its feature is after the final norm
        needed = target.num_hidden_layers if teacher else max(self.layer_ids) + 1
        self.target_config = dataclasses.replace(target, num_hidden_layers=needed)
        if dtype is None:
            dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        from turbo_dllm.families.dflash.runtime import readable_weights

        model = build_model(self.target_config, _attend, dtype)
        with readable_weights("the target", target_path):
            self.model = materialize(model, device, seed=0, weights_from=target_path)
        self.model.requires_grad_(False).eval()
        if compile and device.type == "cuda":
            from turbo_dllm.train.distributed import apply_compile

            apply_compile(self.model.model.layers)
        self.device = device

    @torch.no_grad()
    def __call__(
        self, input_ids: torch.Tensor, doc_ids: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        # All rows in one forward: one row at a time cost a GPU step 16 x (layers x ~50) kernel
        # launches (most of a drafter step at the benchmark's shapes). Row i's numbers equal
        # the one-row forward's on CPU (tests/dflash/test_features.py trains the offline
        # artifact's trace exactly); CUDA's bf16 kernels may round a row differently with the
        # batch it comes in.
        return self._rows(input_ids, doc_ids)

    def _rows(self, input_ids: torch.Tensor, doc_ids: torch.Tensor | None):
        from turbo_dllm.families.decoder.model import rope_cos_sin

        body = self.model.model
        input_ids = input_ids.to(self.device)
        length = input_ids.shape[1]
        x = body.embed_tokens(input_ids)
        cos, sin = rope_cos_sin(
            self.target_config, torch.arange(length, device=self.device), x.dtype
        )
        mask = causal_document_mask(doc_ids, length, self.device)
        wanted: dict[int, Any] = {}
        for index, layer in enumerate(body.layers):
            x = layer(x, cos, sin, mask)
            if index in self.layer_ids:
                wanted[index] = x
        normed = body.norm(x) if self.teacher or self.last in wanted else None
        if self.last in wanted:
            wanted[self.last] = normed
        features = torch.cat([wanted[i] for i in self.layer_ids], dim=-1)
        return features, normed if self.teacher else None
