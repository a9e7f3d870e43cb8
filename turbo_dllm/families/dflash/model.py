"""The DFlash drafter (arXiv 2602.06036): a few decoder layers that draft one block at a time.

Every layer's queries are the block's tokens [anchor, mask x (B-1)]; its keys and values are the
block's own (bidirectional inside the block) followed by the target's context before the anchor:
the concatenated hidden states of `target_layer_ids`, projected by `fc` + `hidden_norm` once,
then turned into keys/values by each layer's own k_proj/k_norm/v_proj. RoPE: the block at
positions anchor + 0..B-1, the context at its own positions. Embeddings and LM head are the
target's, frozen (`requires_grad=False`; `external_weights` tells loading and saving to leave
them to the target's folder).

Parameter names are the drafter checkpoint's (`layers.0.self_attn.q_proj.weight`, `fc.weight`,
`hidden_norm.weight`, `norm.weight`), so a state dict is the exported layout. Nothing here knows
about training: the `mask` argument is a `DraftContext` built by the training plan or the
speculative decoder.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from turbo_dllm.families.decoder.model import MLP, RMSNorm, _apply_rope, rope_cos_sin
from turbo_dllm.families.dflash.config import DFlashConfig

__all__ = [
    "EXTERNAL_WEIGHTS",
    "DFlashAttention",
    "DFlashDrafter",
    "DFlashLayer",
    "DraftContext",
    "masked_attention",
]

# The target's tensors the drafter uses but never owns (loaded from the target, never saved).
EXTERNAL_WEIGHTS = ("embed_tokens.weight", "lm_head.weight")


def masked_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """SDPA over an explicit boolean mask, grouped K/V heads expanded to the query heads first.

    With a mask and `enable_gqa`, CUDA's memory-efficient kernel took only equal head counts
    until recent torch versions, and SDPA then falls back to its math path: float32 score
    matrices (R, H, Q, K) written and read several times, forward and backward (the drafter's
    are 16 x 16 x 2048 x 3072 in the speculative benchmark). Expanded heads keep a fused kernel
    on every version; the repeated K/V are small next to the scores."""
    if mask is not None and k.shape[1] != q.shape[1]:
        repeat = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1]
    )


@dataclass
class DraftContext:
    """What the draft blocks of one batch attend to besides themselves.

    features (R, C, n_layers x H_t): the target's hidden states; positions (R, C) or (C,);
    attn_mask (R, 1, Q, C + Q) bool, True = may attend: columns [0, C) are context rows,
    [C, C + Q) the draft tokens (only their own block is visible).
    """

    features: torch.Tensor
    positions: torch.Tensor
    attn_mask: torch.Tensor | None


class DFlashAttention(nn.Module):
    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.head_dim = d
        self.q_proj = nn.Linear(h, config.num_attention_heads * d, bias=False)
        self.k_proj = nn.Linear(h, config.num_key_value_heads * d, bias=False)
        self.v_proj = nn.Linear(h, config.num_key_value_heads * d, bias=False)
        self.o_proj = nn.Linear(config.num_attention_heads * d, h, bias=False)
        self.q_norm = RMSNorm(d, config.rms_norm_eps)
        self.k_norm = RMSNorm(d, config.rms_norm_eps)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(*x.shape[:2], x.shape[-1] // self.head_dim, self.head_dim)

    def context_kv(
        self, context: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """This layer's keys/values of the projected target context, (R, Hkv, C, D)."""
        k = self.k_norm(self._heads(self.k_proj(context))).transpose(1, 2)
        v = self._heads(self.v_proj(context)).transpose(1, 2)
        return _apply_rope(k, cos, sin).to(v.dtype), v

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        context_kv: tuple[torch.Tensor, torch.Tensor],
        attn_mask: torch.Tensor | None,
    ) -> torch.Tensor:
        batch, seq, _ = x.shape
        q = self.q_norm(self._heads(self.q_proj(x))).transpose(1, 2)
        k = self.k_norm(self._heads(self.k_proj(x))).transpose(1, 2)
        v = self._heads(self.v_proj(x)).transpose(1, 2)
        q, k = _apply_rope(q, cos, sin).to(v.dtype), _apply_rope(k, cos, sin).to(v.dtype)
        context_k, context_v = context_kv
        k = torch.cat([context_k.to(v.dtype), k], dim=2)
        v = torch.cat([context_v.to(v.dtype), v], dim=2)
        out = masked_attention(q, k, v, attn_mask)
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))


class DFlashLayer(nn.Module):
    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = DFlashAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin, context, context_cos, context_sin, attn_mask):
        kv = self.self_attn.context_kv(context, context_cos, context_sin)
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv, attn_mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDrafter(nn.Module):
    """The drafter. `forward(input_ids, positions, context, output=fn)` hands (final hidden
    states of the draft tokens, the frozen head weight) to `fn`; without it, full logits."""

    external_weights = EXTERNAL_WEIGHTS

    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.fc = nn.Linear(config.feature_size, config.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share the head with the embeddings when the target ties them; both stay frozen."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.embed_tokens.weight.requires_grad_(False)
        self.lm_head.weight.requires_grad_(False)

    def project_context(self, features: torch.Tensor) -> torch.Tensor:
        """fc + hidden_norm over the target features: the context every layer reads."""
        return self.hidden_norm(self.fc(features))

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        context: DraftContext,
        output=None,
    ) -> torch.Tensor:
        hidden = self.hidden_states(input_ids, positions, context)
        if output is None:
            return self.lm_head(hidden)
        return output(hidden, self.lm_head.weight)

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        context: DraftContext,
        projected: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Final-normed hidden states (R, Q, H) of the draft tokens. `projected`: the context
        already through `project_context` (the speculative decoder keeps it across steps)."""
        x = self.embed_tokens(input_ids)
        dtype = torch.get_autocast_dtype(x.device.type) if _autocast_on(x) else x.dtype
        if projected is None:
            projected = self.project_context(context.features.to(self.fc.weight.dtype))
        cos, sin = rope_cos_sin(self.config, positions, dtype)
        context_cos, context_sin = rope_cos_sin(self.config, context.positions, dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, projected, context_cos, context_sin, context.attn_mask)
        return self.norm(x)


def _autocast_on(x: torch.Tensor) -> bool:
    return torch.is_autocast_enabled(x.device.type)
