"""A Llama / Qwen2 / Qwen3 decoder with a pluggable attention backend.

Module names and parameter names mirror Hugging Face's (`model.layers.3.self_attn.q_proj.weight`),
so a state dict *is* the HF layout and loading/saving needs no renaming table. The model knows
nothing about parallelism, checkpointing or compilation (torchtitan style): those are applied
from outside by `turbo_dllm.train.parallel`. Attention is a backend object called as
`backend(q, k, v, mask)` with q (B, Hq, S, D) and k/v (B, Hkv, S, D), so the block-diffusion
mask (or a context-parallel strategy) is chosen without touching this file.

Positions are explicit: the block-diffusion stream [x_t ; x_0] reuses positions 0..L-1 twice.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from turbo_dllm.families.decoder.config import DecoderConfig
from turbo_dllm.train.attention.trim import LastLayerQueries

__all__ = [
    "Attention",
    "AttentionBackend",
    "DecoderLM",
    "DecoderLayer",
    "RMSNorm",
    "cos_sin",
    "rope_cos_sin",
    "rope_frequencies",
]


class AttentionBackend(Protocol):
    """What a layer calls: `backend(q, k, v, mask) -> out` (out shaped like q)."""

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any
    ) -> torch.Tensor: ...


class _RMSNorm(torch.autograd.Function):
    """weight * (x * rstd).to(x.dtype) with rstd = rsqrt(mean(x^2) + eps) in float32.

    Saves only x and rstd. Eager autograd would keep a float32 copy of x and the normalised
    bf16 tensor as well, per norm: at long context that is most of a recomputed layer's memory
    (a 2 GB bf16 input brings 6 GB more per norm). The backward recomputes them instead.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        xf = x.float()
        rstd = torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return weight * (xf * rstd).to(x.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight, rstd = ctx.saved_tensors
        normed = x.float() * rstd
        # A sum over the leading dims, not a reshape: under TP the q/k-norm inputs are DTensors
        # sharded on the heads dim, which a flatten cannot cross without a redistribution.
        leading = tuple(range(x.dim() - 1))
        grad_weight = (grad * normed.to(x.dtype)).sum(leading)
        # Rounded to x's dtype on the way, as autograd through the eager graph does.
        grad_normed = (grad * weight).to(x.dtype).float()
        mean = (grad_normed * normed).mean(-1, keepdim=True)
        grad_x = rstd * (grad_normed - normed * mean)
        return grad_x.to(x.dtype), grad_weight.to(weight.dtype), None


class RMSNorm(nn.Module):
    """RMSNorm computed in float32, like transformers (weight applied in the input dtype)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _RMSNorm.apply(x, self.weight, self.eps)


def rope_frequencies(
    dim: int, theta: float, scaling: Mapping[str, Any] | None = None, device=None
) -> tuple[torch.Tensor, float]:
    """RoPE's inverse frequencies for `dim` rotated dims, and the factor cos/sin are multiplied
    by (YaRN's attention factor; 1 for the others), as transformers' `ROPE_INIT_FUNCTIONS`
    compute them for `scaling`'s rope_type: default, linear, llama3 or yarn."""
    exponent = torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim
    wavelength = theta**exponent  # (over 2 pi)
    inv_freq = 1.0 / wavelength
    scaling = scaling or {}
    kind = scaling.get("rope_type", "default")
    if kind == "linear":
        return inv_freq / float(scaling["factor"]), 1.0
    if kind == "llama3":
        factor = float(scaling["factor"])
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_len = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        return torch.where(medium, smoothed, scaled), 1.0
    if kind == "yarn":
        return _yarn(wavelength, dim, theta, scaling)
    return inv_freq, 1.0


def _yarn(
    wavelength: torch.Tensor, dim: int, theta: float, scaling: Mapping[str, Any]
) -> tuple[torch.Tensor, float]:
    """YaRN (arXiv 2309.00071): the frequencies blended between interpolation (divided by
    `factor`) and extrapolation by a linear ramp over the dims, and the attention factor."""
    factor = float(scaling["factor"])
    original = float(scaling["original_max_position_embeddings"])

    def mscale(m: float = 1.0) -> float:
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

    attention = scaling.get("attention_factor")
    if attention is None:
        m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        attention = mscale(m) / mscale(m_all) if m and m_all else mscale()

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    # (a missing, null or zero beta is the paper's default, as transformers reads it)
    low = correction_dim(float(scaling.get("beta_fast") or 32))
    high = correction_dim(float(scaling.get("beta_slow") or 1))
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    device = wavelength.device
    ramp = (torch.arange(dim // 2, dtype=torch.float32, device=device) - low) / (high - low)
    extrapolate = 1 - ramp.clamp(0, 1)
    interpolated, extrapolated = 1.0 / (factor * wavelength), 1.0 / wavelength
    return interpolated * (1 - extrapolate) + extrapolated * extrapolate, float(attention)


def rope_cos_sin(
    config: DecoderConfig, positions: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables (..., S, D) for integer `positions` (S,) or (B, S); float32 math, YaRN's
    attention factor applied."""
    inv_freq, attention = rope_frequencies(
        config.head_dim, config.rope_theta, config.rope_scaling, positions.device
    )
    return cos_sin(inv_freq, attention, positions, dtype)


def cos_sin(
    inv_freq: torch.Tensor, attention: float, positions: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin (..., S, 2 x len(inv_freq)) of `positions`, times `attention` (float32 math)."""
    freqs = positions.float()[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    if attention != 1.0:
        cos, sin = cos * attention, sin * attention
    return cos.to(dtype), sin.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: (B, H, S, D); cos/sin: (S, D) or (B, S, D) -> broadcast over heads.
    if cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]
    return x * cos + _rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, config: DecoderConfig, backend: AttentionBackend) -> None:
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = d
        self.q_proj = nn.Linear(h, self.num_heads * d, bias=config.qkv_bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * d, bias=config.qkv_bias)
        self.v_proj = nn.Linear(h, self.num_kv_heads * d, bias=config.qkv_bias)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=config.o_bias)
        if config.qk_norm:
            self.q_norm = RMSNorm(d, config.rms_norm_eps)
            self.k_norm = RMSNorm(d, config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None
        self.backend = backend

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: Any,
        queries: int | None = None,
    ) -> torch.Tensor:
        """Attention over x (B, S, H); `queries`: only the first rows attend (keys: all S)."""
        batch, seq, _ = x.shape
        rows = seq if queries is None else queries
        # Head counts come from the projections' widths: under tensor parallelism each rank
        # holds num_heads / tp query heads and num_kv_heads / tp key/value heads (same GQA ratio).
        q = self.q_proj(x[:, :rows]).view(batch, rows, -1, self.head_dim)
        k = self.k_proj(x).view(batch, seq, -1, self.head_dim)
        v = self.v_proj(x).view(batch, seq, -1, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q = _apply_rope(q, cos[..., :rows, :], sin[..., :rows, :])
        k = _apply_rope(k, cos, sin)
        # Under autocast an fp32 norm weight promotes q/k back to fp32; kernels want one dtype.
        q, k = q.to(v.dtype), k.to(v.dtype)
        out = self.backend(q, k, v, mask)
        return self.o_proj(out.transpose(1, 2).reshape(batch, rows, -1))


class _SwiGLU(torch.autograd.Function):
    """silu(gate) * up, saving gate and up only: silu(gate) is recomputed in the backward.

    Eager autograd would also keep silu(gate), one more intermediate-sized tensor per layer (the
    largest activations of a recomputed layer: 3x the hidden size per token). Gradients are the
    eager graph's, op for op.
    """

    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        gate, up = ctx.saved_tensors
        # In place where the kernels allow it: no temporary beyond the two gradients.
        grad_gate = grad * up
        torch.ops.aten.silu_backward.grad_input(grad_gate, gate, grad_input=grad_gate)
        return grad_gate, F.silu(gate).mul_(grad)


# hidden_act -> the gate's activation (names as transformers' ACT2FN); silu runs as _SwiGLU.
_GATE_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor] | None] = {
    "silu": None,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


class MLP(nn.Module):
    """A gated MLP (SwiGLU for silu). With `chunks` > 1 (set from outside, `training.mlp_chunks`) and autograd on, the
    tokens go through in `chunks` pieces, each checkpointed: the backward recomputes one piece at
    a time, so the intermediate-sized activations never exist for the whole sequence at once."""

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        h, i, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = nn.Linear(h, i, bias=bias)
        self.up_proj = nn.Linear(h, i, bias=bias)
        self.down_proj = nn.Linear(i, h, bias=bias)
        self.chunks = 1
        self.act = _GATE_ACTIVATIONS[config.hidden_act]  # None: silu, the fused _SwiGLU
        # Where the tokens enter the projections: a no-op here, the point where sequence
        # parallelism gathers each piece's tokens from the tp ranks (parallelize.py).
        self.gather_tokens = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.chunks == 1 or not torch.is_grad_enabled():
            return self._swiglu(x)
        from torch.utils.checkpoint import checkpoint

        pieces = x.chunk(self.chunks, dim=1)
        return torch.cat([checkpoint(self._swiglu, p, use_reentrant=False) for p in pieces], 1)

    def _swiglu(self, x: torch.Tensor) -> torch.Tensor:
        x = self.gather_tokens(x)
        if self.act is None:
            return self.down_proj(_SwiGLU.apply(self.gate_proj(x), self.up_proj(x)))
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: DecoderConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, backend)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: Any,
        queries: int | None = None,
    ) -> torch.Tensor:
        """The layer over x (B, S, H); `queries`: outputs for the first rows only (the last
        layer, where no loss reads the others: `train.attention.trim`)."""
        attended = self.self_attn(self.input_layernorm(x), cos, sin, mask, queries=queries)
        if queries is not None:
            x = x[:, :queries]
        x = x + attended
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderBody(nn.Module):
    """Hugging Face's `model.` submodule: embeddings, layers, final norm."""

    def __init__(self, config: DecoderConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(config, backend) for _ in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, mask: Any) -> torch.Tensor:
        """Final hidden states (B, S, H); with a `LastLayerQueries` mask, of its first rows."""
        x = self.embed_tokens(input_ids)
        # Under autocast the layers compute in bf16; RoPE tables follow the compute dtype.
        dtype = torch.get_autocast_dtype(x.device.type) if _autocast_on(x) else x.dtype
        cos, sin = rope_cos_sin(self.config, positions, dtype)
        return self.norm(self.run_layers(x, cos, sin, mask))

    def run_layers(self, x: torch.Tensor, cos: Any, sin: Any, mask: Any) -> torch.Tensor:
        """The layers over x; under a `LastLayerQueries` mask the last one computes the first
        `queries` rows only (the rest of its output is read by nothing)."""
        trim = mask if isinstance(mask, LastLayerQueries) else None
        if trim is None:
            for layer in self.layers:
                x = layer(x, cos, sin, mask)
            return x
        for layer in self.layers[:-1]:
            x = layer(x, cos, sin, trim.every)
        return self.layers[-1](x, cos, sin, trim.last, queries=trim.queries)


def _autocast_on(x: torch.Tensor) -> bool:
    return torch.is_autocast_enabled(x.device.type)


OutputFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class DecoderLM(nn.Module):
    """Decoder + LM head. `forward(..., output=fn)` hands (hidden, head weight) to `fn`.

    The output hook lets an objective compute a chunked cross-entropy straight from the final
    hidden states without materialising logits, *inside* this module's forward (so FSDP2 has the
    head weight unsharded while it is used). Without a hook, forward returns full logits.
    """

    def __init__(self, config: DecoderConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.config = config
        self.model = DecoderBody(config, backend)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        mask: Any = None,
        output: OutputFn | None = None,
    ) -> torch.Tensor:
        hidden = self.model(input_ids, positions, mask)
        if output is None:
            return self.lm_head(hidden)
        return output(hidden, self.lm_head.weight)

    def tie_weights(self) -> None:
        """Share the head with the embeddings when the config ties them (after `to_empty`)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def set_attention(self, backend: AttentionBackend) -> None:
        """Swap the attention backend of every layer (e.g. reference -> flex, or CSBP)."""
        for module in self.modules():
            if isinstance(module, Attention):
                module.backend = backend
