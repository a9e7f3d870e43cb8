"""Nemotron-Labs-Diffusion: the decoder with its attention variants.

Everything but the attention is the decoder's (`families/decoder/model.py`: embeddings, RMSNorm,
RoPE, the gated MLP, the LM head and its output hook). The attention adds, as the config asks,
per-head RMSNorms on q/k (`qk_norm`) and on v (`v_norm`), and a sigmoid output gate per head
(`attn_output_gate`: `self_attn.g_proj`, hidden -> num_heads, scales each head's output before
o_proj). A `self_conditioning` module some checkpoints carry gets zero input in training, so it
is not built (its weights are not read).
"""

from __future__ import annotations

from dataclasses import dataclass
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
    cos_sin,
    rope_frequencies,
)
from turbo_dllm.families.nemotron_diffusion.config import NemotronConfig

__all__ = ["NemotronAttention", "NemotronLM"]


@dataclass(frozen=True)
class Rotary:
    """What every attention layer gets in place of the decoder's cos table: cos/sin (YaRN's
    attention factor applied) and the per-position query scale of llama-4 scaling (or None)."""

    cos: torch.Tensor
    sin: torch.Tensor
    q_scale: torch.Tensor | None


def rotary(config: NemotronConfig, positions: torch.Tensor, dtype: torch.dtype) -> Rotary:
    inv_freq, attention = rope_frequencies(
        config.head_dim, config.rope_theta, config.rope_scaling, positions.device
    )
    cos, sin = cos_sin(inv_freq, attention, positions, dtype)
    scaling = config.rope_scaling or {}
    q_scale = None
    beta = scaling.get("llama_4_scaling_beta")
    if beta is not None:  # 1 + beta log(1 + floor(pos / original)), per position
        original = float(scaling["original_max_position_embeddings"])
        q_scale = (1 + beta * torch.log1p(torch.floor(positions.float() / original))).to(dtype)
    return Rotary(cos, sin, q_scale)


class NemotronBody(DecoderBody):
    """The decoder body with Nemotron's RoPE (YaRN, llama-4 query scaling) handed to the layers."""

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, mask: Any) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        autocast = torch.is_autocast_enabled(x.device.type)
        dtype = torch.get_autocast_dtype(x.device.type) if autocast else x.dtype
        tables = rotary(self.config, positions, dtype)
        return self.norm(self.run_layers(x, tables, None, mask))


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
        self,
        x: torch.Tensor,
        tables: Rotary,
        _unused: Any,
        mask: Any,
        queries: int | None = None,
    ) -> torch.Tensor:
        """Attention over x (B, S, H); `queries`: only the first rows attend (keys: all S)."""
        batch, seq, _ = x.shape
        rows = seq if queries is None else queries
        x_q = x[:, :rows]
        q = self.q_proj(x_q).view(batch, rows, -1, self.head_dim)
        k = self.k_proj(x).view(batch, seq, -1, self.head_dim)
        v = self.v_proj(x).view(batch, seq, -1, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.v_norm is not None:
            v = self.v_norm(v)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        cos, sin = tables.cos[..., :rows, :], tables.sin[..., :rows, :]
        q, k = _apply_rope(q, cos, sin), _apply_rope(k, tables.cos, tables.sin)
        if tables.q_scale is not None:  # (S,) or (B, S) over (B, H, S, D)
            scale = tables.q_scale[..., :rows]
            q = q * (scale[:, None, :, None] if scale.dim() == 2 else scale[:, None])
        q, k = q.to(v.dtype), k.to(v.dtype)
        out = self.backend(q, k, v, mask).transpose(1, 2)  # (B, rows, heads, D)
        if self.g_proj is not None:
            out = out * torch.sigmoid(self.g_proj(x_q))[..., None].to(out.dtype)
        return self.o_proj(out.reshape(batch, rows, -1))


class NemotronLM(DecoderLM):
    """The decoder LM whose layers attend through `NemotronAttention`."""

    def __init__(self, config: NemotronConfig, backend: AttentionBackend) -> None:
        nn.Module.__init__(self)
        self.config = config
        self.model = NemotronBody(config, backend)
        for layer in self.model.layers:
            layer.self_attn = NemotronAttention(config, backend)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()

    # The published layout (its remote code's NemotronLabsDiffusionModel: `self.encoder`, a
    # Ministral3 decoder, and `self.diffusion_head`): `encoder.*` and `diffusion_head.weight`.
    @staticmethod
    def checkpoint_names(name: str) -> tuple[str, ...]:
        """Where a tensor sits in a folder: the published layout, or ours (`model.*`,
        `lm_head.weight`: exports before they took the published one), or `model.encoder.*`."""
        if name == "lm_head.weight":
            return (name, "diffusion_head.weight")
        if name.startswith("model."):
            rest = name.removeprefix("model.")
            return (name, "encoder." + rest, "model.encoder." + rest)
        return (name,)

    def hf_export_state(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The published layout, which its remote code loads. A tied head (the published
        configs untie it; that code ties nothing) is written too, as a copy."""
        out = {
            ("encoder." + name.removeprefix("model.") if name.startswith("model.") else name): t
            for name, t in state.items()
        }
        head = out.pop("lm_head.weight", None)
        if head is None:  # tied: the state names the shared tensor as the embeddings only
            head = out["encoder.embed_tokens.weight"].clone()
        out["diffusion_head.weight"] = head
        return out

    @staticmethod
    def hf_export_config(hf: dict[str, Any]) -> dict[str, Any]:
        """The paradigm the published folders name, which their code infers with: under
        `block_diff` it builds its training attention (a block-diffusion mask over the input's
        two halves), at inference too. Checkpoints keep `block_diff` (what it trained as)."""
        return {**hf, "dlm_paradigm": "bidirectional"}
