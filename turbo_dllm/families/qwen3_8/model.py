"""The Qwen3.8 hybrid (transformers' `qwen3_5` text model) on the block-diffusion stream.

Parameter names mirror `Qwen3_5ForCausalLM`'s (`model.layers.0.linear_attn.in_proj_qkv.weight`).
Two token mixers, by `layer_types`:

* full attention (`self_attn`): q_proj emits each head's query and an output gate side by side
  (2 x head_dim per head), zero-centred RMSNorms on q and k, RoPE on the first
  head_dim x partial_rotary_factor dims, out = attention * sigmoid(gate) -> o_proj. It attends
  through the trainer's backend with the block-diffusion mask, like the decoder.
* Gated DeltaNet (`linear_attn`): in_proj_qkv -> causal depthwise conv (+ SiLU) -> q, k, v;
  beta = sigmoid(in_proj_b); log decay g = -exp(A_log) softplus(in_proj_a + dt_bias); the gated
  delta rule (`gated_delta`); a gated RMSNorm with z = in_proj_z -> out_proj.

A recurrent mixer cannot take the block-diffusion mask, so the stream [x_t ; x_0] is run the
way the mask says (docs/architecture.md, "Block-diffusion semantics"): the clean half x_0 once,
causally, capturing the recurrent state and the convolution's input window at every block
boundary; every noisy block then restarts from the clean prefix before it (state and conv window),
all blocks as one batch, so no noisy block sees another's tokens. Gradients flow through the
captured states. A forward without a layout (`HybridMask.layout is None`) is one causal sequence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, Partial
from torch.utils.checkpoint import checkpoint

from turbo_dllm.errors import DllmError
from turbo_dllm.families.decoder.model import MLP, cos_sin, rope_frequencies
from turbo_dllm.families.qwen3_8.config import Qwen38Config
from turbo_dllm.families.qwen3_8.gated_delta import KERNELS, gated_delta_rule
from turbo_dllm.families.qwen3_8.norms import gated_rms_norm, zero_centered_rms_norm
from turbo_dllm.train.attention.layout import BlockDiffusionLayout

__all__ = [
    "GatedAttention",
    "GatedDeltaNet",
    "HybridLM",
    "HybridMask",
    "ZeroCenteredRMSNorm",
]


@dataclass(frozen=True)
class HybridMask:
    """What the hybrid's layers need of a micro-batch: the attention mask and the stream layout.

    `attention` goes to the full-attention backend unchanged; `layout` tells the linear layers
    where the noisy and clean halves and the blocks are (None: one plain causal sequence).
    """

    attention: Any
    layout: BlockDiffusionLayout | None = None
    # Block parallelism (CSBP with cp = 1): this rank's noisy blocks (global ids, stream order,
    # an int64 tensor on the model's device, put there once a step: a copy per layer would wait
    # for the queue); the stream is [those blocks ; the clean prefix up to the last of them].
    # None: all blocks.
    noisy_blocks: torch.Tensor | None = None
    # Context parallelism (the CP baseline): this rank's place in the clean stream's state
    # hand-off (`context.StateHandOff`); the stream is [its noisy chunks ; its clean chunks].
    hand_off: Any = None


def local_part(param: torch.Tensor) -> torch.Tensor:
    """A tensor-parallel parameter's (or gathered output's) local part; a plain tensor passes.

    A replicated one (the conv weight, the gated norm's weight) is used on this rank's heads
    only, so its gradient comes back as a pending sum over tp (`Partial`), which FSDP2 or
    `replicate_partial_grads` reduces; a head-sharded one (dt_bias, A_log) is this rank's heads.
    """
    if not isinstance(param, DTensor):
        return param
    if all(p.is_replicate() for p in param.placements):
        return param.to_local(grad_placements=[Partial()] * len(param.placements))
    return param.to_local()


class ZeroCenteredRMSNorm(nn.Module):
    """Qwen3.5's RMSNorm: x * rsqrt(mean(x^2) + eps) * (1 + weight), in float32; weight starts at 0."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return zero_centered_rms_norm(x, self.weight, self.eps)  # (keeps x, not float32 copies)


class GatedRMSNorm(nn.Module):
    """RMSNorm of the mixer output, then times silu(z) (weight starts at 1)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return gated_rms_norm(x, gate, local_part(self.weight), self.eps)


def rope_cos_sin(
    config: Qwen38Config, positions: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin (S, rotary_dim) of the rotated dims. Text positions are equal in all three mRoPE
    streams, so the interleaved sections collapse to plain RoPE on those dims (a scaled RoPE's
    frequencies and attention factor as the decoder computes them, as transformers does)."""
    inv_freq, attention = rope_frequencies(
        config.rotary_dim, config.rope_theta, config.rope_scaling, positions.device
    )
    return cos_sin(inv_freq, attention, positions, dtype)


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, H, S, D): rotate the first cos.shape[-1] dims, pass the rest through."""
    dim = cos.shape[-1]
    rot, rest = x[..., :dim], x[..., dim:]
    half = dim // 2
    rotated = torch.cat((-rot[..., half:], rot[..., :half]), dim=-1)
    return torch.cat((rot * cos + rotated * sin, rest), dim=-1)


class GatedAttention(nn.Module):
    def __init__(self, config: Qwen38Config, backend: Any) -> None:
        super().__init__()
        h, d, bias = config.hidden_size, config.head_dim, config.attention_bias
        self.head_dim = d
        self.q_proj = nn.Linear(h, config.num_attention_heads * d * 2, bias=bias)
        self.k_proj = nn.Linear(h, config.num_key_value_heads * d, bias=bias)
        self.v_proj = nn.Linear(h, config.num_key_value_heads * d, bias=bias)
        self.o_proj = nn.Linear(config.num_attention_heads * d, h, bias=bias)
        self.q_norm = ZeroCenteredRMSNorm(d, config.rms_norm_eps)
        self.k_norm = ZeroCenteredRMSNorm(d, config.rms_norm_eps)
        self.backend = backend

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: HybridMask
    ) -> torch.Tensor:
        batch, seq, _ = x.shape
        d = self.head_dim
        # Per head: [query (d) | gate (d)], so tensor parallelism's row split keeps heads whole.
        query, gate = self.q_proj(x).view(batch, seq, -1, 2 * d).chunk(2, dim=-1)
        gate = gate.reshape(batch, seq, -1)
        q = self.q_norm(query).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(batch, seq, -1, d)).transpose(1, 2)
        v = self.v_proj(x).view(batch, seq, -1, d).transpose(1, 2)
        q, k = _apply_rope(q, cos, sin), _apply_rope(k, cos, sin)
        q, k = q.to(v.dtype), k.to(v.dtype)
        out = self.backend(q, k, v, mask.attention).transpose(1, 2).reshape(batch, seq, -1)
        return self.o_proj(out * torch.sigmoid(gate))


class GatedDeltaNet(nn.Module):
    def __init__(self, config: Qwen38Config, kernel: str = "torch") -> None:
        super().__init__()
        h = config.hidden_size
        self.key_heads, self.value_heads = (
            config.linear_num_key_heads,
            config.linear_num_value_heads,
        )
        self.key_dim, self.value_dim = config.linear_key_dim, config.linear_value_dim
        self.head_k_dim, self.head_v_dim = config.linear_key_head_dim, config.linear_value_head_dim
        self.conv_kernel = config.linear_conv_kernel_dim
        conv_dim = 2 * self.key_dim + self.value_dim
        self.conv1d = nn.Conv1d(
            conv_dim,
            conv_dim,
            kernel_size=self.conv_kernel,
            groups=conv_dim,
            bias=False,
            padding=self.conv_kernel - 1,
        )
        self.dt_bias = nn.Parameter(torch.ones(self.value_heads))
        self.A_log = nn.Parameter(torch.zeros(self.value_heads))
        self.norm = GatedRMSNorm(self.head_v_dim, config.rms_norm_eps)
        self.out_proj = nn.Linear(self.value_dim, h, bias=False)
        self.in_proj_qkv = nn.Linear(h, conv_dim, bias=False)
        self.in_proj_z = nn.Linear(h, self.value_dim, bias=False)
        self.in_proj_b = nn.Linear(h, self.value_heads, bias=False)
        self.in_proj_a = nn.Linear(h, self.value_heads, bias=False)
        self.kernel = kernel
        # Tensor parallelism (parallelize.py) runs heads [rank * H / size, (rank + 1) * H / size)
        # of every kind here: the packed q | k | v channels and the conv are cut to them locally.
        self.tp_rank, self.tp_size = 0, 1

    def _local_channels(self, packed: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """This rank's heads of a whole q | k | v packing (the projection's output, the conv
        weight's channels); everything with one tensor-parallel rank."""
        if self.tp_size == 1:
            return packed
        r, size = self.tp_rank, self.tp_size
        parts = packed.split([self.key_dim, self.key_dim, self.value_dim], dim=dim)
        return torch.cat([part.chunk(size, dim=dim)[r] for part in parts], dim=dim)

    # --- the causal depthwise convolution ---------------------------------------------------
    def _conv(self, x: torch.Tensor, padded: bool = True) -> torch.Tensor:
        """x (N, T, C) -> silu(causal depthwise conv) (N, T', C); unpadded: T' = T - (K - 1)."""
        weight = self._local_channels(local_part(self.conv1d.weight), dim=0)
        out = F.conv1d(
            x.transpose(1, 2).to(weight.dtype),
            weight,
            padding=self.conv_kernel - 1 if padded else 0,
            groups=weight.shape[0],
        )
        if padded:
            out = out[..., : x.shape[1]]
        return F.silu(out).transpose(1, 2).to(x.dtype)

    def _noisy_conv(
        self,
        noisy: torch.Tensor,
        clean: torch.Tensor,
        block: int,
        which: torch.Tensor | None = None,
        tail: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Each noisy block convolved after the K-1 clean inputs before it: (R * n, B, C).
        `which`: the global ids of the noisy blocks (default: 0, 1, ..., every block); `tail`:
        the K-1 clean inputs before `clean` (default zeros: `clean` starts the stream)."""
        rows, length, channels = noisy.shape
        n, window = length // block, self.conv_kernel - 1
        blocks = noisy.reshape(rows, n, block, channels)
        if window:
            # The clean inputs just before block b: clean[b*B - (K-1) : b*B] (zeros before 0).
            prefix = (
                F.pad(clean, (0, 0, window, 0)) if tail is None else torch.cat([tail, clean], 1)
            )
            tails = prefix.unfold(1, window, block).transpose(-1, -2)  # (R, blocks + 1, K-1, C)
            tails = tails[:, :n] if which is None else tails.index_select(1, which)
            blocks = torch.cat([tails, blocks], dim=2)
        out = self._conv(blocks.reshape(rows * n, block + window, channels), padded=False)
        return out

    def _stream(self, noisy_in, clean_in, noisy_ba, clean_ba, block, which=None, start=None):
        """Noisy blocks and the clean stretch they follow: (noisy out, clean out, final state).

        The clean stretch runs once, its state captured before every block; every noisy block
        (`which`, default all) then restarts from the clean state before it, all as one batch.
        `start`: the (recurrent state, K-1 conv inputs) before the stretch; None: its start.
        """
        rows, window = noisy_in.shape[0], self.conv_kernel - 1
        state, tail = start if start is not None else (None, None)
        if tail is None:
            conv = self._conv(clean_in)
        else:
            conv = self._conv(torch.cat([tail, clean_in], 1), padded=False)
        clean, states, final = self._mix(conv, *clean_ba, capture_every=block, initial_state=state)
        if which is not None:
            states = states.index_select(1, which)
        n = noisy_in.shape[1] // block
        b, a = (x.reshape(rows * n, block, -1) for x in noisy_ba)
        noisy, _, _ = self._mix(
            self._noisy_conv(noisy_in, clean_in, block, which, tail if window else None),
            b,
            a,
            initial_state=states.reshape(rows * n, *states.shape[2:]),
        )
        return noisy.reshape(rows, n * block, *noisy.shape[2:]), clean, final

    def _handed_on(self, mixed, b, a, block: int, hand_off: Any) -> torch.Tensor:
        """Context parallelism: this rank's two chunks of both halves, each clean chunk started
        from the state and conv window the rank before it in stream order hands over."""
        rows, seq, channels = mixed.shape
        N, window = seq // 2, self.conv_kernel - 1
        half = N // 2
        if half < window:
            raise ValueError(f"a context chunk of {half} tokens is shorter than the conv window")
        heads = self.value_heads // self.tp_size
        state_shape = (rows, heads, self.head_k_dim, self.head_v_dim)
        state_dtype = torch.promote_types(mixed.dtype, torch.float32)
        noisy_parts, clean_parts, kept = [], [], None
        for j, chunk in enumerate(hand_off.chunks):
            noisy, clean = slice(j * half, (j + 1) * half), slice(N + j * half, N + (j + 1) * half)
            clean_in = mixed[:, clean]
            start = hand_off.receive(
                chunk, kept, clean_in, state_shape, state_dtype, (rows, window, channels)
            )
            noisy_out, clean_out, final = self._recomputed(
                self._stream,
                mixed[:, noisy],
                clean_in,
                (b[:, noisy], a[:, noisy]),
                (b[:, clean], a[:, clean]),
                block,
                None,
                start,
            )
            inputs = torch.cat([start[1], clean_in], 1)
            clean_out, kept = hand_off.send(chunk, clean_out, final, inputs[:, half:])
            noisy_parts.append(noisy_out)
            clean_parts.append(clean_out)
        return torch.cat(noisy_parts + clean_parts, dim=1)

    def _recomputed(self, mixing: Callable, *args):
        """Run the token mixing (conv, gated delta rule, noisy restarts) keeping only its inputs
        for the backward, which runs it again. The torch chunked form's per-chunk intermediates
        (float32 q/k repeated to the value heads, [C, C] matrices and their inverse's powers, a
        [Dk, Dv] state per chunk, kept again for every noisy block) were most of what the model
        saved (docs/benchmarks.md, "What a qwen3_8 training forward keeps"); their FLOPs are
        small next to the projections'. Outputs and gradients are unchanged: the same ops run
        again on the same inputs. fla's Functions choose what they keep themselves, and so does
        a compiled layer's partitioner: both run plainly."""
        if self.kernel != "torch" or not torch.is_grad_enabled() or torch.compiler.is_compiling():
            return mixing(*args)
        return checkpoint(mixing, *args, use_reentrant=False, preserve_rng_state=False)

    def _mix(self, mixed: torch.Tensor, b: torch.Tensor, a: torch.Tensor, **kwargs):
        key_dim, value_dim = self.key_dim // self.tp_size, self.value_dim // self.tp_size
        q, k, v = torch.split(mixed, [key_dim, key_dim, value_dim], dim=-1)
        rows, seq = mixed.shape[:2]
        q = q.reshape(rows, seq, -1, self.head_k_dim)
        k = k.reshape(rows, seq, -1, self.head_k_dim)
        v = v.reshape(rows, seq, -1, self.head_v_dim)
        beta = b.sigmoid()
        A_log, dt_bias = local_part(self.A_log), local_part(self.dt_bias)
        g = -A_log.float().exp() * F.softplus(a.float() + dt_bias.float())
        return gated_delta_rule(q, k, v, g, beta, kernel=self.kernel, **kwargs)

    def forward(self, x: torch.Tensor, mask: HybridMask) -> torch.Tensor:
        rows, seq, _ = x.shape
        # Under tp: in_proj_qkv's output is gathered whole and cut to this rank's heads; z, b, a
        # come column-wise as this rank's value heads already.
        # (The gathered output's gradient is then a pending sum over tp: each rank used its heads.)
        mixed = self._local_channels(local_part(self.in_proj_qkv(x)))
        z = self.in_proj_z(x)
        b, a = self.in_proj_b(x), self.in_proj_a(x)
        layout = mask.layout
        if layout is None:
            out, _, _ = self._recomputed(
                lambda m, b, a: self._mix(self._conv(m), b, a), mixed, b, a
            )
        elif mask.hand_off is not None:
            out = self._handed_on(mixed, b, a, layout.block_size, mask.hand_off)
        else:
            block = layout.block_size
            if mask.noisy_blocks is None:  # the whole stream: every block, the whole clean half
                N, which = layout.seq_len, None
                if seq != 2 * N:
                    raise ValueError(f"the stream has {seq} positions, the layout {2 * N}")
            else:  # this rank's blocks, then the clean prefix they need
                N, which = mask.noisy_blocks.numel() * block, mask.noisy_blocks
            noisy, clean, _ = self._recomputed(
                self._stream,
                mixed[:, :N],
                mixed[:, N:],
                (b[:, :N], a[:, :N]),
                (b[:, N:], a[:, N:]),
                block,
                which,
            )
            out = torch.cat([noisy, clean], dim=1)
        out = self.norm(out, z.reshape(rows, seq, -1, self.head_v_dim))
        return self.out_proj(out.reshape(rows, seq, -1))


class HybridLayer(nn.Module):
    def __init__(self, config: Qwen38Config, kind: str, backend: Any, kernel: str) -> None:
        super().__init__()
        self.kind = kind
        self.input_layernorm = ZeroCenteredRMSNorm(config.hidden_size, config.rms_norm_eps)
        if kind == "linear_attention":
            self.linear_attn = GatedDeltaNet(config, kernel)
        else:
            self.self_attn = GatedAttention(config, backend)
        self.post_attention_layernorm = ZeroCenteredRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)  # the decoder's gated MLP: SwiGLU, chunkable, SP gather point

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: HybridMask
    ) -> torch.Tensor:
        normed = self.input_layernorm(x)
        if self.kind == "linear_attention":
            x = x + self.linear_attn(normed, mask)
        else:
            x = x + self.self_attn(normed, cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class HybridBody(nn.Module):
    """transformers' `model.` submodule: embeddings, layers, final norm."""

    def __init__(self, config: Qwen38Config, backend: Any, kernel: str) -> None:
        super().__init__()
        self.config = config
        # transformers' padding_idx (Qwen3_5TextModel passes pad_token_id): the pad row starts at
        # zero in a random init and gets no gradient through the lookup. Without it, a zero pad
        # row (a random HF folder's, also when it is the mask token) got its true gradient
        # through the first zero-centred RMSNorm, ~1/sqrt(eps) = 1000x the others' (a grad norm
        # of thousands), which the clip then divided every other gradient by.
        pad = config.pad_token_id
        padding_idx = pad if isinstance(pad, int) and 0 <= pad < config.vocab_size else None
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx)
        self.layers = nn.ModuleList(
            HybridLayer(config, kind, backend, kernel) for kind in config.layer_types
        )
        self.norm = ZeroCenteredRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, mask: HybridMask
    ) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        autocast = torch.is_autocast_enabled(x.device.type)
        dtype = torch.get_autocast_dtype(x.device.type) if autocast else x.dtype
        cos, sin = rope_cos_sin(self.config, positions, dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.norm(x)


OutputFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class HybridLM(nn.Module):
    """Hybrid body + LM head; `forward(..., output=fn)` hands (hidden, head weight) to `fn`."""

    def __init__(self, config: Qwen38Config, backend: Any, kernel: str = "torch") -> None:
        super().__init__()
        if kernel not in KERNELS:
            raise DllmError(f"unknown linear-attention kernel {kernel!r}", hint="use torch or fla")
        self.config = config
        self.model = HybridBody(config, backend, kernel)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        mask: Any = None,
        output: OutputFn | None = None,
    ) -> torch.Tensor:
        if not isinstance(mask, HybridMask):
            mask = HybridMask(mask)  # a bare attention mask: one causal sequence
        hidden = self.model(input_ids, positions, mask)
        if output is None:
            return self.lm_head(hidden)
        return output(hidden, self.lm_head.weight)

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def set_attention(self, backend: Any) -> None:
        for module in self.modules():
            if isinstance(module, GatedAttention):
                module.backend = backend

    def set_linear_attention(self, kernel: str) -> None:
        """Swap the gated-delta kernel of every linear layer (torch, fla, recurrent)."""
        if kernel not in KERNELS:
            raise DllmError(f"unknown linear-attention kernel {kernel!r}", hint="use torch or fla")
        for module in self.modules():
            if isinstance(module, GatedDeltaNet):
                module.kernel = kernel

    # --- the weight contract (turbo_dllm.train.weights) -------------------------------------
    @staticmethod
    def checkpoint_names(name: str) -> tuple[str, ...]:
        """Where a parameter may sit in a checkpoint: the multimodal `qwen3_5` folders keep the
        text model under `model.language_model.` (their vision tower is not read)."""
        if name.startswith("model."):
            return (name, "model.language_model." + name.removeprefix("model."))
        return (name,)

    @staticmethod
    def initial_value(
        name: str, shape: torch.Size, generator: torch.Generator
    ) -> torch.Tensor | None:
        """Random-init values transformers' `_init_weights` gives differently from the default
        (normal weights, unit norms, zero biases); None for the default."""
        if name.endswith("linear_attn.norm.weight"):
            return torch.ones(shape)
        if name.endswith("norm.weight"):  # zero-centred: (1 + weight) starts at 1
            return torch.zeros(shape)
        if name.endswith("dt_bias"):
            return torch.ones(shape)
        if name.endswith("A_log"):
            return torch.empty(shape).uniform_(0.01, 16.0, generator=generator).log_()
        return None
