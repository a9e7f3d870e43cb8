"""Nemotron-Labs-Diffusion: the decoder with its attention variants.

Everything but the attention is the decoder's (`families/decoder/model.py`: embeddings, RMSNorm,
RoPE, the gated MLP, the LM head and its output hook). The attention adds, as the config asks,
per-head RMSNorms on q/k (`qk_norm`) and on v (`v_norm`), and a sigmoid output gate per head
(`attn_output_gate`: `self_attn.g_proj`, hidden -> num_heads, scales each head's output before
o_proj). A `self_conditioning` module some checkpoints carry gets zero input in training, so it
is not built (its weights are not read).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from turbo_dllm.families.decoder.model import (
    Attention,
    AttentionBackend,
    DecoderBody,
    DecoderLM,
    RMSNorm,
    _apply_rope,
)
from turbo_dllm.families.nemotron_diffusion.config import NemotronConfig

__all__ = ["NemotronAttention", "NemotronLM"]


class NemotronAttention(Attention):
    def __init__(self, config: NemotronConfig, backend: AttentionBackend) -> None:
        super().__init__(config, backend)
        self.v_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if config.v_norm else None
        self.g_proj = (
            nn.Linear(config.hidden_size, config.num_attention_heads, bias=False)
            if config.attn_output_gate
            else None
        )

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: Any
    ) -> torch.Tensor:
        batch, seq, _ = x.shape
        q = self.q_proj(x).view(batch, seq, -1, self.head_dim)
        k = self.k_proj(x).view(batch, seq, -1, self.head_dim)
        v = self.v_proj(x).view(batch, seq, -1, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.v_norm is not None:
            v = self.v_norm(v)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q, k = _apply_rope(q, cos, sin), _apply_rope(k, cos, sin)
        q, k = q.to(v.dtype), k.to(v.dtype)
        out = self.backend(q, k, v, mask).transpose(1, 2)  # (B, S, heads, D)
        if self.g_proj is not None:
            out = out * torch.sigmoid(self.g_proj(x))[..., None].to(out.dtype)
        return self.o_proj(out.reshape(batch, seq, -1))


class NemotronLM(DecoderLM):
    """The decoder LM whose layers attend through `NemotronAttention`."""

    def __init__(self, config: NemotronConfig, backend: AttentionBackend) -> None:
        nn.Module.__init__(self)
        self.config = config
        self.model = DecoderBody(config, backend)
        for layer in self.model.layers:
            layer.self_attn = NemotronAttention(config, backend)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()

    @staticmethod
    def checkpoint_names(name: str) -> tuple[str, ...]:
        """Published checkpoints keep the decoder under `model.encoder.` as well."""
        if name.startswith("model."):
            return (name, "model.encoder." + name.removeprefix("model."))
        return (name,)
