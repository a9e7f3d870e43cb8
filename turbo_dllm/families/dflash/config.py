"""The DFlash drafter's shape, read from (and written to) its Hugging Face `config.json`.

A drafter is a few Qwen3-style decoder layers that draft a block [anchor, mask x (B-1)] while
attending to the target's hidden states (docs/dflash.md). Its config.json is the one SGLang
(`--speculative-algorithm DFLASH`) and vLLM (`"method": "dflash"`) load: a `qwen3` model_type,
`architectures: ["DFlashDraftModel"]`, the layer keys at the root and a `dflash_config` holding
the target layer ids and the mask token; `block_size` sits at the root and in `dflash_config`.

A DFlash2 drafter (`architectures: ["DFlash2DraftModel"]`) adds, per layer, two block-local
dynamic grouped convolutions (`attention_conv`, `mlp_conv`) and, once, a low-rank candidate
selector; their shape lives in `dflash_config` (conv_kernel_size, conv_group_size,
selector_rank, selector_top_k, plus final_logit_softcapping, output_multiplier, causal and
attention_mode), the keys SGLang's DFlash2 loader reads.

`target_layer_ids` are 0-based target layer indices: feature i is the output of target layer
`target_layer_ids[i]` (the Hugging Face hidden-state tuple's entry `id + 1`, which is how a root
`target_layer_ids` / `aux_hidden_state_layer_ids` is spelled, so those are read minus one; the
target's last layer as that tuple holds it, after the final norm: docs/dflash.md).

Torch-free: validation and the registry import it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from turbo_dllm.errors import DllmError
from turbo_dllm.families.base import (
    FamilyMismatch,
    decoder_shape_problems,
    head_dim_for,
    hf_config_errors,
    json_type_problems,
    nonpositive_fields,
    raise_if_unusable,
    raise_on_json_types,
)
from turbo_dllm.families.decoder.config import JSON_KINDS as DECODER_KINDS

# The JSON type of each key `from_hf_dict` reads (`json_type_problems`): the layer's (in
# `transformer_layer_config` or at the root), the root's and `dflash_config`'s.
_LAYER_KINDS = {**DECODER_KINDS, "rope_scaling": "object?"}  # a Qwen3 decoder layer's keys
_ROOT_KINDS = {
    **dict.fromkeys(("target_hidden_size", "num_target_layers", "block_size"), "int?"),
    "mask_token_id": "int?",
    **dict.fromkeys(("aux_hidden_state_layer_ids", "target_layer_ids"), "ints"),
    **dict.fromkeys(("sample_from_anchor", "tie_word_embeddings"), "flag"),
    "transformer_layer_config": "object?",
    "dflash_config": "object?",
}
_DFLASH_KINDS = {
    "target_layer_ids": "ints",
    "block_size": "int?",
    "mask_token_id": "int?",
    **dict.fromkeys(
        ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"), "int"
    ),
    **dict.fromkeys(("final_logit_softcapping", "output_multiplier"), "real?"),
}

__all__ = [
    "ARCHITECTURES",
    "DFlashConfig",
    "default_target_layer_ids",
    "drafter_problems",
    "needs_teacher",
]

ARCHITECTURES = ("DFlashDraftModel", "DFlash2DraftModel")
DFLASH2 = "DFlash2DraftModel"
# The speculators library's wrapper format: named by the original, not read by this version.
PLANNED_ARCHITECTURES = ("DFlashSpeculator",)
# The loss kinds each architecture trains with (the original's split: DFlash2's selector needs
# hard labels).
V1_LOSSES = ("paper_ce", "speculators_kl", "greedy_ce")
# The RunSpec's model.dflash fields that shape a fresh DFlash2 drafter (dflash_config keys).
DFLASH2_FIELDS = (
    "conv_kernel_size",
    "conv_group_size",
    "selector_rank",
    "selector_top_k",
    "final_logit_softcapping",
    "output_multiplier",
)
HARD_LABEL_LOSSES = (
    "dflash",
    "dpace",
    "dpace-cumulative-confidence-only",
    "dpace-continuation-value-only",
)
# The DFlash losses made from the target's own outputs at the drafted positions (the target runs
# all its layers, or the feature artifact carries its last hidden states).
TEACHER_LOSSES = ("speculators_kl", "greedy_ce")


def needs_teacher(loss: str, greedy_path: bool) -> bool:
    """Whether a DFlash objective reads the target's last hidden states: its teacher losses do,
    and `greedy_path` does with any loss (the target's greedy tokens decide the path, and a
    hard-label loss then takes them as its labels)."""
    return loss in TEACHER_LOSSES or greedy_path


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """As z-lab's DFlash: one middle layer for a one-layer drafter, else an even spread over
    layers 1 .. n-3 (one feature layer per draft layer; fewer, each once, where the range holds
    fewer layers than the drafter has: z-lab's spread would repeat them)."""
    if num_draft_layers == 1 or num_target_layers < 4:
        return (num_target_layers // 2,)
    start, end = 1, num_target_layers - 3
    span = end - start
    spread = (round(start + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers))
    return tuple(dict.fromkeys(spread))


@dataclasses.dataclass(frozen=True)
class DFlashConfig:
    """Everything the drafter needs; names follow the drafter's config.json."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    target_hidden_size: int
    num_target_layers: int
    target_layer_ids: tuple[int, ...]
    block_size: int
    mask_token_id: int
    sample_from_anchor: bool = False
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    hidden_act: str = "silu"
    initializer_range: float = 0.02
    architecture: str = "DFlashDraftModel"
    model_type: str = "qwen3"
    # --- DFlash2 only (dflash_config); ignored by a DFlashDraftModel ---------------------
    conv_kernel_size: int = 4  # taps of each block-local causal convolution
    conv_group_size: int = 16  # channels sharing one dynamic coefficient
    selector_rank: int = 64  # rank of the candidate selector's pair score
    selector_top_k: int = 8  # candidates (top-k of the unary logits) the selector ranks
    final_logit_softcapping: float | None = None  # unary logits: c * tanh(z / c)
    output_multiplier: float = 1.0  # unary logits: softcap(multiplier * hidden @ head)
    # Where the frozen embeddings and head (and online features) come from: the target's folder.
    # Not part of config.json (a path); set from the RunSpec's `model.dflash.target`.
    target_path: str | None = dataclasses.field(default=None, compare=False)
    # Whether config.json recorded num_target_layers (our exports and z-lab's do): only then is
    # it compared with the target's depth; without it, num_target_layers is max(ids) + 1.
    target_layers_recorded: bool = dataclasses.field(default=True, compare=False, repr=False)

    # Attributes the shared decoder parts (MLP, RoPE) read.
    rope_scaling = None
    mlp_bias = False
    qk_norm = True

    def __post_init__(self) -> None:
        problems = []
        problems += decoder_shape_problems(
            self, ("target_hidden_size", "num_target_layers", "block_size")
        )
        if self.block_size < 2:
            problems.append(f"block_size must be at least 2 (got {self.block_size})")
        if self.head_dim % 2:
            problems.append(f"head_dim must be even for RoPE (got {self.head_dim})")
        if not self.target_layer_ids:
            problems.append("target_layer_ids is empty")
        bad = [i for i in self.target_layer_ids if not 0 <= i < self.num_target_layers]
        if bad:
            problems.append(
                f"target_layer_ids {list(bad)} are not layers of a "
                f"{self.num_target_layers}-layer target (0 .. {self.num_target_layers - 1})"
            )
        if len(set(self.target_layer_ids)) != len(self.target_layer_ids):
            problems.append(f"target_layer_ids {list(self.target_layer_ids)} repeat a layer")
        if not 0 <= self.mask_token_id < self.vocab_size:
            problems.append(
                f"mask_token_id {self.mask_token_id} is outside the vocabulary ({self.vocab_size})"
            )
        if self.hidden_act != "silu":
            problems.append(f"hidden_act {self.hidden_act!r} is not supported (silu)")
        if self.architecture not in ARCHITECTURES:
            problems.append(f"architecture {self.architecture!r} is not supported")
        if self.is_dflash2:
            problems += nonpositive_fields(
                self, ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
            )
            if self.conv_group_size > 0 and self.hidden_size % self.conv_group_size:
                problems.append(
                    f"conv_group_size ({self.conv_group_size}) must divide hidden_size "
                    f"({self.hidden_size})"
                )
            if self.selector_top_k > self.vocab_size:
                problems.append(
                    f"selector_top_k ({self.selector_top_k}) exceeds the vocabulary "
                    f"({self.vocab_size})"
                )
            if self.final_logit_softcapping is not None and self.final_logit_softcapping <= 0:
                problems.append(
                    f"final_logit_softcapping must be positive or null "
                    f"(got {self.final_logit_softcapping})"
                )
            if self.output_multiplier <= 0:
                problems.append(
                    f"output_multiplier must be positive (got {self.output_multiplier})"
                )
        raise_if_unusable(
            problems, what="drafter config", hint="fix the drafter's config.json or model.dflash"
        )

    # --- Hugging Face config.json ---------------------------------------------------------
    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any]) -> DFlashConfig:
        architectures = hf.get("architectures") or []
        architecture = architectures[0] if architectures else None
        if architecture in PLANNED_ARCHITECTURES:
            raise DllmError(
                f"{architecture} drafters are not available in this version",
                hint=f"this version reads {', '.join(ARCHITECTURES)}",
            )
        if architecture not in ARCHITECTURES:  # (a FamilyMismatch: dflash does not train it)
            raise FamilyMismatch(
                f"config.json is not a DFlash drafter (architectures: {architectures!r})",
                hint="model.family dflash reads DFlashDraftModel folders; a target model is "
                "named by model.dflash.target",
                model_type=hf.get("model_type"),
            )
        problems = json_type_problems(hf, _ROOT_KINDS)
        nested = isinstance(hf.get("transformer_layer_config"), dict)
        layer_prefix = "transformer_layer_config." if nested else ""
        problems += json_type_problems(
            hf.get("transformer_layer_config") if nested else hf, _LAYER_KINDS, prefix=layer_prefix
        )
        if isinstance(hf.get("dflash_config"), dict):
            problems += json_type_problems(
                hf["dflash_config"], _DFLASH_KINDS, prefix="dflash_config."
            )
        raise_on_json_types(problems, what="drafter config.json")
        layer = dict(hf.get("transformer_layer_config") or hf)
        dflash = dict(hf.get("dflash_config") or {})
        with hf_config_errors(
            missing_hint="a DFlash drafter config has the layer keys, block_size and dflash_config",
            what="drafter config.json",
            fix="fix that value in the drafter's config.json (model.family dflash takes no "
            "model.config_overrides)",
        ):
            if "aux_hidden_state_layer_ids" in hf:
                ids = [int(i) - 1 for i in hf["aux_hidden_state_layer_ids"]]
            elif "target_layer_ids" in hf:
                ids = [int(i) - 1 for i in hf["target_layer_ids"]]
            else:
                ids = [int(i) for i in dflash["target_layer_ids"]]
            heads = int(layer["num_attention_heads"])
            hidden = int(layer["hidden_size"])
            rope = dict(layer.get("rope_parameters") or layer.get("rope_scaling") or {})
            if rope.get("rope_type", "default") != "default":
                raise DllmError(
                    f"drafter rope type {rope['rope_type']!r} is not supported (default only)"
                )
            return cls(
                vocab_size=int(layer["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(layer["intermediate_size"]),
                num_hidden_layers=int(layer["num_hidden_layers"]),
                num_attention_heads=heads,
                num_key_value_heads=heads
                if layer.get("num_key_value_heads") is None
                else int(layer["num_key_value_heads"]),
                # the drafter's attention is its model_type's (Qwen3's: head_dim 128)
                head_dim=head_dim_for(layer, str(hf.get("model_type") or "qwen3"), hidden, heads),
                target_hidden_size=int(hf.get("target_hidden_size") or hidden),
                num_target_layers=int(hf.get("num_target_layers") or max(ids) + 1),
                target_layers_recorded=bool(hf.get("num_target_layers")),
                target_layer_ids=tuple(ids),
                block_size=int(hf.get("block_size") or dflash["block_size"]),
                mask_token_id=int(_mask_token_id(hf, dflash)),
                sample_from_anchor=bool(hf.get("sample_from_anchor", False)),
                rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)),
                rope_theta=float(rope.get("rope_theta", layer.get("rope_theta", 10000.0))),
                max_position_embeddings=int(layer.get("max_position_embeddings", 4096)),
                tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
                hidden_act=str(layer.get("hidden_act") or "silu"),
                initializer_range=float(layer.get("initializer_range", 0.02)),
                architecture=architecture,
                model_type=str(hf.get("model_type") or "qwen3"),
                **(_dflash2_fields(dflash) if architecture == DFLASH2 else {}),
            )

    @classmethod
    def from_target(cls, target: Any, spec: Any, *, target_path: str | None) -> DFlashConfig:
        """A fresh drafter shaped after `target` (a DecoderConfig) and `spec` (model.dflash)."""
        ids = spec.target_layer_ids
        if ids is None:
            ids = default_target_layer_ids(target.num_hidden_layers, spec.num_layers)
        return cls(
            vocab_size=target.vocab_size,
            hidden_size=target.hidden_size,
            intermediate_size=spec.intermediate_size or target.intermediate_size,
            num_hidden_layers=spec.num_layers,
            num_attention_heads=target.num_attention_heads,
            num_key_value_heads=target.num_key_value_heads,
            head_dim=target.head_dim,
            target_hidden_size=target.hidden_size,
            num_target_layers=target.num_hidden_layers,
            target_layer_ids=tuple(int(i) for i in ids),
            block_size=spec.block_size,
            mask_token_id=spec.mask_token_id,
            sample_from_anchor=spec.sample_from_anchor,
            rms_norm_eps=target.rms_norm_eps,
            rope_theta=target.rope_theta,
            max_position_embeddings=target.max_position_embeddings,
            tie_word_embeddings=target.tie_word_embeddings,
            initializer_range=target.initializer_range,
            target_path=target_path,
            architecture=spec.architecture,
            **(
                {name: getattr(spec, name) for name in DFLASH2_FIELDS}
                if spec.architecture == DFLASH2
                else {}
            ),
        )

    @property
    def is_dflash2(self) -> bool:
        return self.architecture == DFLASH2

    @property
    def attention_mode(self) -> str:
        return "mha" if self.num_key_value_heads == self.num_attention_heads else "gqa"

    def to_hf_dict(self) -> dict[str, Any]:
        """The drafter's config.json (REFERENCE-FAMILIES §1(5): what SGLang and vLLM read).

        No `auto_map` (the engines have the classes built in); `rope_theta` at the root as well
        as in `rope_parameters`."""
        hf = {
            "architectures": [self.architecture],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": self.hidden_act,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "initializer_range": self.initializer_range,
            "attention_bias": False,
            "attention_dropout": 0.0,
            "target_hidden_size": self.target_hidden_size,
            "num_target_layers": self.num_target_layers,
            "block_size": self.block_size,
            "sample_from_anchor": self.sample_from_anchor,
            "dflash_config": {
                "block_size": self.block_size,
                "mask_token_id": self.mask_token_id,
                "target_layer_ids": list(self.target_layer_ids),
            },
            "torch_dtype": "float32",
        }
        if self.is_dflash2:
            hf["dflash_config"].update(
                {
                    "conv_kernel_size": self.conv_kernel_size,
                    "conv_group_size": self.conv_group_size,
                    "selector_rank": self.selector_rank,
                    "selector_top_k": self.selector_top_k,
                    "final_logit_softcapping": self.final_logit_softcapping,
                    "output_multiplier": self.output_multiplier,
                    "causal": False,  # a block attends to itself bidirectionally
                    "attention_mode": self.attention_mode,
                }
            )
        return hf

    # --- sizes ----------------------------------------------------------------------------
    @property
    def feature_size(self) -> int:
        return len(self.target_layer_ids) * self.target_hidden_size

    @property
    def layer_matmul_params(self) -> int:
        h, d = self.hidden_size, self.head_dim
        attention = h * d * (2 * self.num_attention_heads + 2 * self.num_key_value_heads)
        return attention + 3 * h * self.intermediate_size

    @property
    def conv_params(self) -> int:
        """One DFlash2 convolution: base kernel [2, taps, H] + kernel projection."""
        h, taps = self.hidden_size, self.conv_kernel_size
        return 2 * taps * h + 2 * taps * (h // self.conv_group_size) * h

    def num_params(self) -> int:
        """The drafter's own (trainable) parameters; the target's embeddings/head excluded."""
        h = self.hidden_size
        per_layer = self.layer_matmul_params + 2 * h + 2 * self.head_dim
        total = self.num_hidden_layers * per_layer + self.feature_size * h + 2 * h
        if self.is_dflash2:
            total += self.num_hidden_layers * 2 * self.conv_params
            total += self.selector_rank * (2 * self.vocab_size + h)
        return total

    def step_flops(self, *, stream_tokens: int, scored_tokens: int, pairs: int) -> float:
        """Drafter FLOPs of one forward+backward over `stream_tokens` drafted positions (the
        context projection and the frozen target's forward are not counted)."""
        matmul = self.layer_matmul_params
        if self.is_dflash2:  # the two convolutions' kernel projections
            matmul += (
                2
                * 2
                * self.conv_kernel_size
                * self.hidden_size
                // self.conv_group_size
                * self.hidden_size
            )
        body = 6.0 * self.num_hidden_layers * matmul * stream_tokens
        head = 4.0 * self.vocab_size * self.hidden_size * scored_tokens  # no head gradient
        attention = 12.0 * self.head_dim * self.num_attention_heads * self.num_hidden_layers * pairs
        return body + head + attention


def _mask_token_id(hf: dict[str, Any], dflash: dict[str, Any]) -> Any:
    """The drafter's mask token: `dflash_config.mask_token_id`, else the root's; a KeyError
    (hf_config_errors: "lacks the field") where neither has one."""
    for config in (dflash, hf):
        if config.get("mask_token_id") is not None:
            return config["mask_token_id"]
    raise KeyError("mask_token_id")


def _dflash2_fields(dflash: dict[str, Any]) -> dict[str, Any]:
    """The DFlash2 keys of a config.json's `dflash_config` (the field defaults where absent)."""
    fields = {}
    for name in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
        if name in dflash:
            fields[name] = int(dflash[name])
    if dflash.get("final_logit_softcapping") is not None:
        fields["final_logit_softcapping"] = float(dflash["final_logit_softcapping"])
    if dflash.get("output_multiplier") is not None:
        fields["output_multiplier"] = float(dflash["output_multiplier"])
    mode = dflash.get("attention_mode", "gqa")
    if mode not in ("gqa", "mha"):
        raise DllmError(f"dflash_config.attention_mode {mode!r} is not gqa or mha")
    if dflash.get("causal"):
        raise DllmError(
            "dflash_config.causal true (block-causal draft attention) is not supported",
            hint="this version's drafter blocks attend to themselves bidirectionally",
        )
    return fields


def drafter_problems(config: DFlashConfig, target: Any) -> list[str]:
    """Why a drafter does not fit a target (a DecoderConfig); empty when it does."""
    found = []
    if config.vocab_size != target.vocab_size:
        found.append(
            f"the drafter's vocabulary ({config.vocab_size}) is not the target's "
            f"({target.vocab_size})"
        )
    if config.hidden_size != target.hidden_size:
        found.append(
            f"the drafter's hidden size ({config.hidden_size}) is not the target's "
            f"({target.hidden_size}): it shares the target's embeddings and LM head"
        )
    if config.target_hidden_size != target.hidden_size:
        found.append(
            f"the drafter reads target features of width {config.target_hidden_size}, "
            f"the target's hidden size is {target.hidden_size}"
        )
    if config.target_layers_recorded and config.num_target_layers != target.num_hidden_layers:
        found.append(
            f"the drafter was trained against a {config.num_target_layers}-layer target "
            f"(num_target_layers), this target has {target.num_hidden_layers} layers"
        )
    bad = [i for i in config.target_layer_ids if not 0 <= i < target.num_hidden_layers]
    if bad:
        found.append(
            f"target_layer_ids {bad} are not layers of the {target.num_hidden_layers}-layer "
            f"target (0 .. {target.num_hidden_layers - 1})"
        )
    return found
