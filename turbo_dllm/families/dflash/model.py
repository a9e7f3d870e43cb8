"""The DFlash drafter (arXiv 2602.06036): a few decoder layers that draft one block at a time.

Every layer's queries are the block's tokens [anchor, mask x (B-1)]; its keys and values are the
block's own (bidirectional inside the block) followed by the target's context before the anchor:
the concatenated hidden states of `target_layer_ids`, projected by `fc` + `hidden_norm` once,
then turned into keys/values by each layer's own k_proj/k_norm/v_proj. RoPE: the block at
positions anchor + 0..B-1, the context at its own positions. Embeddings and LM head are the
target's, frozen (`requires_grad=False`; `external_weights` tells loading and saving to leave
them to the target's folder).

A DFlash2 drafter (`DFlash2Drafter`) wraps each layer's attention and MLP in a block-local
dynamic grouped convolution (`DFlashGroupedConv`: h += conv1(mixer(conv0(norm(h))))) and ranks
the top-k candidates of every slot with a low-rank `CandidateSelector` (unary logit plus a
(predecessor token, candidate) pair score).

Under context parallelism (`DraftContext.group`), the context features are this rank's
contiguous shard of the sequence; every layer all-gathers its context keys/values over the group
(the backward reduce-scatters their gradients back to the owner).

Parameter names are the drafter checkpoint's (`layers.0.self_attn.q_proj.weight`, `fc.weight`,
`hidden_norm.weight`, `norm.weight`), so a state dict is the exported layout. Nothing here knows
about training: the `mask` argument is a `DraftContext` built by the training plan or the
speculative decoder.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from turbo_dllm.families.decoder.model import MLP, RMSNorm, _apply_rope, rope_cos_sin
from turbo_dllm.families.dflash.attention import draft_attention, masked_attention
from turbo_dllm.families.dflash.config import DFlashConfig

__all__ = [
    "EXTERNAL_WEIGHTS",
    "CandidateSelector",
    "DFlash2Drafter",
    "DFlash2Layer",
    "DFlashAttention",
    "DFlashDrafter",
    "DFlashGroupedConv",
    "DFlashLayer",
    "DraftContext",
    "drafter_class",
    "masked_attention",
]

# The target's tensors the drafter uses but never owns (loaded from the target, never saved).
EXTERNAL_WEIGHTS = ("embed_tokens.weight", "lm_head.weight")


@dataclass
class DraftContext:
    """What the draft blocks of one batch attend to besides themselves.

    features (R, C, n_layers x H_t): the target's hidden states; positions (R, C) or (C,);
    attn_mask (R, 1, Q, C + Q) bool, True = may attend: columns [0, C) are context rows,
    [C, C + Q) the draft tokens (only their own block is visible).
    group: context parallelism's process group; `features` / `positions` are then this rank's
    contiguous shard of the context, and C in `attn_mask` is the whole (gathered) context.
    """

    features: torch.Tensor
    positions: torch.Tensor
    attn_mask: torch.Tensor | None
    group: object | None = None


def _gather_context(
    kv: tuple[torch.Tensor, torch.Tensor], group
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank's context K/V shard, in rank (= sequence) order; gradients go back summed."""
    if group is None:
        return kv
    from turbo_dllm.train.parallel.collectives import start_all_gather
    from turbo_dllm.train.parallel.csbp import pack_kv, unpack_kv

    return unpack_kv(start_all_gather(pack_kv(*kv), group).wait())


class DFlashAttention(nn.Module):
    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.head_dim = d
        self.block_size = config.block_size
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
        out = draft_attention(
            q, context_k.to(v.dtype), context_v.to(v.dtype), k, v, attn_mask, self.block_size
        )
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))


class DFlashLayer(nn.Module):
    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = DFlashAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin, context, context_cos, context_sin, attn_mask, group=None):
        kv = _gather_context(self.self_attn.context_kv(context, context_cos, context_sin), group)
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv, attn_mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashGroupedConv(nn.Module):
    """DFlash2's block-local dynamic grouped convolution around one mixer (attention or MLP).

    Two sides (0: the mixer's input, 1: its output), each a causal depthwise convolution of
    `taps` taps that never reads before its block's first token:
        out[t, c] = sum_j (base[s, j, c] + dyn[t, s, j, c // group]) * x[t - j, c].
    `base_kernel` [2, taps, H] starts as the identity (tap 0 = 1); the dynamic coefficients
    `kernel_projection(normed)` (H -> 2 x taps x H/group, zero init; rows ordered side, tap,
    group) come from the normalized input of the mixer, one set per token.
    """

    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        h = config.hidden_size
        self.taps, self.group_size = config.conv_kernel_size, config.conv_group_size
        self.block_size = config.block_size
        self.base_kernel = nn.Parameter(torch.empty(2, self.taps, h))
        self.kernel_projection = nn.Linear(h, 2 * self.taps * (h // self.group_size), bias=False)

    def coefficients(self, normed: torch.Tensor) -> torch.Tensor:
        """(R, Q, H) normalized mixer input -> (R, Q, 2, taps, H / group) dynamic coefficients."""
        rows, length, h = normed.shape
        return self.kernel_projection(normed).view(rows, length, 2, self.taps, h // self.group_size)

    def convolve(self, x: torch.Tensor, coefficients: torch.Tensor, side: int) -> torch.Tensor:
        """x (R, Q, H), Q whole blocks; `coefficients` from `coefficients()`. The dynamic part
        is added to the base per group (never expanded to a [Q, taps, H] kernel, which would be
        the layer's largest activation); each block is padded once with taps - 1 zeros in
        front, so tap j reads a view (x[t - j], zero before the block's first token)."""
        rows, length, h = x.shape
        b, groups, taps = self.block_size, h // self.group_size, min(self.taps, self.block_size)
        if length % b:
            raise ValueError(f"{length} draft tokens are not whole blocks of {b}")
        n = length // b
        dynamic = coefficients[:, :, side].reshape(rows, n, b, self.taps, groups, 1)
        base = self.base_kernel[side].view(self.taps, groups, self.group_size)
        padded = nn.functional.pad(x.view(rows, n, b, h), (0, 0, taps - 1, 0))
        padded = padded.view(rows, n, b + taps - 1, groups, self.group_size)
        out = None
        for j in range(taps):
            shifted = padded[:, :, taps - 1 - j : taps - 1 - j + b]
            term = (base[j] + dynamic[:, :, :, j]) * shifted
            out = term if out is None else out + term
        return out.reshape(rows, length, h)


class DFlash2Layer(DFlashLayer):
    """A DFlash layer whose attention and MLP sit inside `DFlashGroupedConv`s:
    h += conv1(attn(conv0(norm(h)))); h += conv1(mlp(conv0(norm(h))))."""

    def __init__(self, config: DFlashConfig) -> None:
        super().__init__(config)
        self.attention_conv = DFlashGroupedConv(config)
        self.mlp_conv = DFlashGroupedConv(config)

    def forward(self, x, cos, sin, context, context_cos, context_sin, attn_mask, group=None):
        kv = _gather_context(self.self_attn.context_kv(context, context_cos, context_sin), group)
        normed = self.input_layernorm(x)
        conv = self.attention_conv
        kernels = conv.coefficients(normed)
        mixed = self.self_attn(conv.convolve(normed, kernels, 0), cos, sin, kv, attn_mask)
        x = x + conv.convolve(mixed, kernels, 1)
        normed = self.post_attention_layernorm(x)
        conv = self.mlp_conv
        kernels = conv.coefficients(normed)
        return x + conv.convolve(self.mlp(conv.convolve(normed, kernels, 0)), kernels, 1)


class CandidateSelector(nn.Module):
    """DFlash2's low-rank re-ranker of a slot's top-k candidates: candidate c after token p
    scores unary(c) + <E_pred[p] * W h, E_succ[c]> (E_succ starts at zero: the unary order)."""

    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        v, r = config.vocab_size, config.selector_rank
        self.predecessor_codebook = nn.Parameter(torch.empty(v, r))
        self.successor_codebook = nn.Parameter(torch.empty(v, r))
        self.hidden_projection = nn.Linear(config.hidden_size, r, bias=False)

    def pair_scores(
        self, hidden: torch.Tensor, predecessors: torch.Tensor, candidates: torch.Tensor
    ) -> torch.Tensor:
        """hidden (n, H), predecessors (n,), candidates (n, k) -> (n, k) pair scores.

        The codebook rows are looked up with `embedding`, not indexing: a batch reads each
        vocabulary row thousands of times, and indexing's backward on CUDA sums a row's
        repeats serially (~19 ms a step at the speculative benchmark's shape, a quarter of the
        DFlash2 step), where embedding's backward splits them across threads."""
        embed = nn.functional.embedding
        query = embed(predecessors, self.predecessor_codebook) * self.hidden_projection(hidden)
        successors = embed(candidates, self.successor_codebook)
        return torch.einsum("nr,nkr->nk", query.float(), successors.float())


class DFlashDrafter(nn.Module):
    """The drafter. `forward(input_ids, positions, context, output=fn)` hands (final hidden
    states of the draft tokens, the frozen head weight) to `fn`; without it, full logits."""

    external_weights = EXTERNAL_WEIGHTS
    layer_class = DFlashLayer

    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.fc = nn.Linear(config.feature_size, config.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.layers = nn.ModuleList(
            self.layer_class(config) for _ in range(config.num_hidden_layers)
        )
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
            x = layer(
                x, cos, sin, projected, context_cos, context_sin, context.attn_mask, context.group
            )
        return self.norm(x)

    def greedy_draft(self, hidden: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
        """The greedy tokens (n,) of drafted slots' hidden states (n, H): the head's argmax."""
        return self.lm_head(hidden).argmax(-1)


class DFlash2Drafter(DFlashDrafter):
    """The DFlash2 drafter: grouped-convolution layers and a `candidate_selector`. Its output
    hook gets the drafter too (`output(hidden, head, self)`), for the unary logits' scale and
    cap and the selector."""

    layer_class = DFlash2Layer

    def __init__(self, config: DFlashConfig) -> None:
        super().__init__(config)
        self.candidate_selector = CandidateSelector(config)

    def initial_value(self, name: str, shape, generator: torch.Generator) -> torch.Tensor | None:
        """Identity base kernels, zero dynamic projections and successor codebook (so a fresh
        DFlash2 drafter computes what a DFlash drafter of its other weights does)."""
        if name.endswith("base_kernel"):
            value = torch.zeros(shape)
            value[:, 0] = 1.0
            return value
        if name.endswith(("kernel_projection.weight", "successor_codebook")):
            return torch.zeros(shape)
        return None

    def forward(self, input_ids, positions, context: DraftContext, output=None) -> torch.Tensor:
        hidden = self.hidden_states(input_ids, positions, context)
        if output is None:
            return self.unary_logits(hidden)
        return output(hidden, self.lm_head.weight, self)

    def scale_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden states whose head logits are the unary logits before the cap."""
        multiplier = self.config.output_multiplier
        return hidden if multiplier == 1.0 else hidden * multiplier

    def unary_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """softcap(output_multiplier * hidden @ head^T)."""
        logits = self.lm_head(self.scale_hidden(hidden))
        cap = self.config.final_logit_softcapping
        return logits if cap is None else cap * torch.tanh(logits / cap)

    @torch.no_grad()
    def greedy_draft(self, hidden: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
        """Left to right: slot i's pick among its top-k unary candidates maximizes unary + pair
        score after the previous pick (`anchor` (1,), the anchor's token, before the first
        slot). Tokens (n,) on the device, no host sync."""
        unary = self.unary_logits(hidden).float()
        values, candidates = unary.topk(self.config.selector_top_k, dim=-1)
        previous, picked = anchor.reshape(1), []
        for i in range(hidden.shape[0]):
            pair = self.candidate_selector.pair_scores(
                hidden[i : i + 1], previous, candidates[i : i + 1]
            )
            choice = (values[i] + pair[0]).argmax()
            previous = candidates[i].gather(0, choice.reshape(1))
            picked.append(previous)
        return torch.cat(picked)


def drafter_class(config: DFlashConfig) -> type[DFlashDrafter]:
    return DFlash2Drafter if config.is_dflash2 else DFlashDrafter


def _autocast_on(x: torch.Tensor) -> bool:
    return torch.is_autocast_enabled(x.device.type)
