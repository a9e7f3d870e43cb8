"""DiffusionGemma: one Gemma-4-style MoE transformer over the stream [noisy canvas ; clean].

Parameter names are transformers' (`model.decoder.layers.3.experts.gate_up_proj`, tied
`lm_head.weight`), so a state dict is the HF layout. transformers keeps two copies of the text
transformer (`model.encoder.language_model`, `model.decoder`) with tied weights; here the one
transformer runs both streams in one pass: the clean stream is the encoder (token-causal), the
canvas the decoder (its own block plus the clean prefix), as `CanvasLayout` defines. The canvas
alone goes through the self-conditioning module first (`post_norm(embed + mlp(pre_norm(soft)))`,
soft = 0 without self-conditioning), exactly as HF's decoder does.

Each layer: x += post_attn_norm(attn(input_norm(x))); then
x += post_ff_norm(post_ff_norm_1(mlp(pre_ff_norm(x))) + post_ff_norm_2(experts(pre_ff_norm_2(x),
router(x)))); x *= layer_scalar. Attention has q/k norms and an unscaled v norm, scale 1 (the
backends apply 1/sqrt(d), so q is multiplied by sqrt(d) first); full layers have no v_proj and
use the keys' projection as values. Logits are soft-capped: c * tanh(z / c).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from turbo_dllm.families.decoder.model import MLP, RMSNorm, _apply_rope
from turbo_dllm.families.diffusion_gemma.config import DiffusionGemmaConfig
from turbo_dllm.families.diffusion_gemma.experts import GroupedExperts, Router, plain_rms_norm
from turbo_dllm.train.losses import default_chunk_size

__all__ = ["DiffusionGemmaLM", "GemmaLayer", "StreamMasks", "rope_tables", "soft_embeddings"]


@dataclass(frozen=True)
class StreamMasks:
    """The family's mask object: one prepared mask per layer type, and the canvas length."""

    masks: dict[str, Any]
    canvas_len: int


def _act(name: str):
    if name == "silu":
        return F.silu
    return lambda x: F.gelu(x, approximate="tanh")


def rope_inv_freq(config: DiffusionGemmaConfig, kind: str, device=None) -> torch.Tensor:
    """HF's inverse frequencies: default, or proportional (the first rotated fraction of the
    head's frequency pairs, the rest zero, exponents over the whole head)."""
    params = config.rope_parameters[kind]
    dim = config.layer_head_dim(kind)
    theta = float(params["rope_theta"])
    if params.get("rope_type", "default") == "default":
        exps = torch.arange(0, dim, 2, dtype=torch.float, device=device) / dim
        return 1.0 / theta**exps
    angles = int(float(params.get("partial_rotary_factor", 1.0)) * dim // 2)
    exps = torch.arange(0, 2 * angles, 2, dtype=torch.int64, device=device).float() / dim
    rotated = 1.0 / theta**exps
    zeros = torch.zeros(dim // 2 - angles, dtype=torch.float32, device=device)
    return torch.cat([rotated, zeros]) / float(params.get("factor", 1.0))


def rope_tables(
    config: DiffusionGemmaConfig, positions: torch.Tensor, dtype: torch.dtype
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    out = {}
    for kind in set(config.layer_types):
        freqs = positions.float()[..., None] * rope_inv_freq(config, kind, positions.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        out[kind] = (emb.cos().to(dtype), emb.sin().to(dtype))
    return out


class GemmaAttention(nn.Module):
    def __init__(self, config: DiffusionGemmaConfig, kind: str, backend: Any) -> None:
        super().__init__()
        h, d = config.hidden_size, config.layer_head_dim(kind)
        heads, kv = config.num_attention_heads, config.layer_kv_heads(kind)
        self.kind, self.head_dim, self.eps = kind, d, config.rms_norm_eps
        self.q_proj = nn.Linear(h, heads * d, bias=False)
        self.k_proj = nn.Linear(h, kv * d, bias=False)
        self.v_proj = nn.Linear(h, kv * d, bias=False) if kind == "sliding_attention" else None
        self.o_proj = nn.Linear(heads * d, h, bias=False)
        self.q_norm = RMSNorm(d, config.rms_norm_eps)
        self.k_norm = RMSNorm(d, config.rms_norm_eps)
        self.backend = backend

    def forward(self, x: torch.Tensor, rope: tuple, mask: Any) -> torch.Tensor:
        batch, seq, _ = x.shape
        q = self.q_proj(x).view(batch, seq, -1, self.head_dim)
        k = self.k_proj(x).view(batch, seq, -1, self.head_dim)
        v = self.v_proj(x).view(batch, seq, -1, self.head_dim) if self.v_proj is not None else k
        q, k, v = self.q_norm(q), self.k_norm(k), plain_rms_norm(v, self.eps)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        cos, sin = rope
        q, k = _apply_rope(q, cos, sin), _apply_rope(k, cos, sin)
        # Gemma attends with scale 1 (its q/k are normalised); the backends scale by 1/sqrt(d).
        q = q * self.head_dim**0.5
        q, k = q.to(v.dtype), k.to(v.dtype)
        out = self.backend(q, k, v, mask)
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))


class GemmaLayer(nn.Module):
    def __init__(self, config: DiffusionGemmaConfig, kind: str, backend: Any) -> None:
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.kind = kind
        self.input_layernorm = RMSNorm(h, eps)
        self.self_attn = GemmaAttention(config, kind, backend)
        self.post_attention_layernorm = RMSNorm(h, eps)
        self.pre_feedforward_layernorm = RMSNorm(h, eps)
        self.mlp = MLP(config)  # the dense branch (a shared expert), `chunks` as everywhere
        self.post_feedforward_layernorm_1 = RMSNorm(h, eps)
        self.router = Router(h, config.num_experts, config.top_k_experts, eps)
        self.pre_feedforward_layernorm_2 = RMSNorm(h, eps)
        self.experts = GroupedExperts(
            config.num_experts, h, config.moe_intermediate_size, _act(config.hidden_activation)
        )
        self.post_feedforward_layernorm_2 = RMSNorm(h, eps)
        self.post_feedforward_layernorm = RMSNorm(h, eps)
        # A buffer in transformers (never trained): a frozen parameter here, so it loads, saves
        # and shards like the weights.
        self.layer_scalar = nn.Parameter(torch.ones(1), requires_grad=False)

    def forward(self, x: torch.Tensor, rope: dict, masks: StreamMasks) -> torch.Tensor:
        attn = self.self_attn(self.input_layernorm(x), rope[self.kind], masks.masks[self.kind])
        x = x + self.post_attention_layernorm(attn)
        dense = self.post_feedforward_layernorm_1(self.mlp(self.pre_feedforward_layernorm(x)))
        flat = x.reshape(-1, x.shape[-1])
        weights, index = self.router(flat)
        routed = self.experts(self.pre_feedforward_layernorm_2(flat), weights, index)
        routed = self.post_feedforward_layernorm_2(routed.view_as(x))
        x = x + self.post_feedforward_layernorm(dense + routed)
        return x * self.layer_scalar.to(x.dtype)


class SelfConditioning(nn.Module):
    """post_norm(embeds + down(act(gate(n)) * up(n))), n = pre_norm(soft embeddings)."""

    def __init__(self, config: DiffusionGemmaConfig) -> None:
        super().__init__()
        h, i = config.hidden_size, config.intermediate_size
        self.eps = config.rms_norm_eps
        self.pre_norm = RMSNorm(h, config.rms_norm_eps)
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)
        self.act = _act(config.hidden_activation)

    def forward(self, embeds: torch.Tensor, soft: torch.Tensor) -> torch.Tensor:
        n = self.pre_norm(soft)
        signal = self.down_proj(self.act(self.gate_proj(n)) * self.up_proj(n))
        return plain_rms_norm(embeds + signal, self.eps)


class GemmaDecoder(nn.Module):
    """HF's `model.decoder`: embeddings, layers, final norm, self-conditioning."""

    def __init__(self, config: DiffusionGemmaConfig, backend: Any) -> None:
        super().__init__()
        self.config = config
        # transformers' padding_idx: the pad row gets no gradient through the lookup (HF
        # initialises it to zero, and a zero row's RMSNorms would give it a gradient of ~1e7,
        # which the clip then divides every other gradient by).
        pad = config.pad_token_id
        padding_idx = pad if isinstance(pad, int) and 0 <= pad < config.vocab_size else None
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx)
        self.layers = nn.ModuleList(
            GemmaLayer(config, kind, backend) for kind in config.layer_types
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_conditioning = SelfConditioning(config)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        weight = self.embed_tokens.weight
        # rounded to the weights' dtype as HF does; a fill, not a copy that would wait for the queue
        scale = torch.full(
            (), self.config.hidden_size**0.5, dtype=weight.dtype, device=weight.device
        )
        return self.embed_tokens(input_ids) * scale

    def body(self, x: torch.Tensor, positions: torch.Tensor, masks: StreamMasks) -> torch.Tensor:
        autocast = torch.is_autocast_enabled(x.device.type)
        dtype = torch.get_autocast_dtype(x.device.type) if autocast else x.dtype
        rope = rope_tables(self.config, positions, dtype)
        for layer in self.layers:
            x = layer(x, rope, masks)
        return self.norm(x)


class _Inner(nn.Module):
    """HF's `model.` level (only the decoder: the encoder's text weights are the same tensors)."""

    def __init__(self, config: DiffusionGemmaConfig, backend: Any) -> None:
        super().__init__()
        self.decoder = GemmaDecoder(config, backend)


def soft_embeddings(
    hidden: torch.Tensor, weight: torch.Tensor, softcap: float | None, scale: float, rows: int
) -> torch.Tensor:
    """softmax(softcap(hidden @ W.T)) @ W * scale, `rows` hidden rows at a time (no [N, V])."""
    flat = hidden.reshape(-1, hidden.shape[-1])
    pieces = []
    for start in range(0, flat.shape[0], rows):
        logits = (flat[start : start + rows] @ weight.t()).float()
        if softcap is not None:
            logits = torch.tanh(logits / softcap) * softcap
        probs = logits.softmax(-1).to(weight.dtype)
        pieces.append(probs @ weight)
    scale_t = torch.full((), scale, dtype=weight.dtype, device=weight.device)
    return torch.cat(pieces).view(*hidden.shape[:-1], weight.shape[1]) * scale_t


class DiffusionGemmaLM(nn.Module):
    """The transformer + tied, soft-capped head; `forward(..., output=fn)` as every family.

    `self_conditioning` (R,) bool: rows that get a no-grad first pass whose soft embeddings
    condition the second (the rest condition on zeros, like a first denoising step).
    """

    # Parameters HF initialises to one.
    _ONES = ("router.scale", "router.per_expert_scale", "layer_scalar")
    # HF tensors this model neither reads nor trains (the vision tower): export copies them from
    # the model.path folder unchanged, so an exported DiffusionGemma keeps its vision.
    hf_source_prefixes = ("model.encoder.vision_tower.", "model.encoder.embed_vision.")

    def initial_value(self, name: str, shape, generator) -> torch.Tensor | None:
        """weights.init_weights' hook: HF's ones for the router scales and layer scalars."""
        return torch.ones(shape) if name.endswith(self._ONES) else None

    def __init__(self, config: DiffusionGemmaConfig, backend: Any) -> None:
        super().__init__()
        self.config = config
        self.model = _Inner(config, backend)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.lm_head.weight = self.model.decoder.embed_tokens.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        mask: StreamMasks,
        output=None,
        self_conditioning: torch.Tensor | None = None,
    ) -> torch.Tensor:
        decoder = self.model.decoder
        canvas = mask.canvas_len
        embeds = decoder.embed(input_ids)
        noisy, clean = embeds[:, :canvas], embeds[:, canvas:]
        soft = torch.zeros_like(noisy)
        # Under expert parallelism every rank must run the same passes (all-to-all inside).
        if self_conditioning is not None and (self._dispatching() or bool(self_conditioning.any())):
            with torch.no_grad():
                first = decoder.body(
                    torch.cat([decoder.self_conditioning(noisy, soft), clean], 1), positions, mask
                )
                soft = soft_embeddings(
                    first[:, :canvas],
                    self.lm_head.weight,
                    self.config.final_logit_softcapping,
                    self.config.hidden_size**0.5,
                    rows=default_chunk_size(self.config.vocab_size),  # ~1 GB of logits
                ).to(noisy.dtype)
                soft = soft * self_conditioning.to(soft.dtype)[:, None, None]
        x = torch.cat([decoder.self_conditioning(noisy, soft), clean], 1)
        hidden = decoder.body(x, positions, mask)
        cap = self.config.final_logit_softcapping
        if output is not None:
            return output(hidden, self.lm_head.weight, softcap=cap)
        logits = self.lm_head(hidden).float()
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def _dispatching(self) -> bool:
        return self.model.decoder.layers[0].experts.dispatch is not None

    def tie_weights(self) -> None:
        self.lm_head.weight = self.model.decoder.embed_tokens.weight

    def hf_export_state(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """HF keeps a second (encoder) copy of the layer scalars, which are buffers there."""
        out = dict(state)
        for name, tensor in state.items():
            if name.startswith("model.decoder.layers.") and name.endswith(".layer_scalar"):
                out[name.replace("model.decoder.", "model.encoder.language_model.", 1)] = (
                    tensor.clone()
                )
        return out

    def set_attention(self, backend: Any) -> None:
        for module in self.modules():
            if isinstance(module, GemmaAttention):
                module.backend = backend
