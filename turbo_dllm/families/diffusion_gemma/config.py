"""DiffusionGemma's shape, read from (and written back to) a Hugging Face `diffusion_gemma` config.

The HF config nests the text transformer under `text_config` (plus a vision tower this text-only
family neither trains nor exports). One transformer serves both streams: the clean (encoder)
stream, token-causal, and the noisy (decoder) canvas. Layers alternate sliding-window and full
attention; full layers have their own head size and key/value head count (`global_head_dim`,
`num_global_key_value_heads`) and reuse the keys as values; every layer adds a routed mixture
of experts to a dense gated MLP. Presets give random-init shapes.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from turbo_dllm.errors import DllmError
from turbo_dllm.families.base import (
    DECODER_SIZES,
    decoder_shape_problems,
    head_dim_for,
    hf_config_errors,
    json_type_problems,
    kv_heads_for,
    no_attention_dropout,
    number_problems,
    raise_if_unusable,
    raise_on_json_types,
)
from turbo_dllm.families.decoder.config import _token_ids, cut_layer_list

__all__ = ["CONFIG_KEYS", "LAYER_TYPES", "PRESETS", "DiffusionGemmaConfig"]

LAYER_TYPES = ("sliding_attention", "full_attention")
ACTIVATIONS = ("gelu_pytorch_tanh", "silu")
_ROPE_TYPES = {"sliding_attention": ("default",), "full_attention": ("default", "proportional")}
_DEFAULT_ROPE = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    "full_attention": {
        "rope_type": "proportional",
        "partial_rotary_factor": 0.25,
        "rope_theta": 1_000_000.0,
    },
}


# The JSON type of each text_config key `from_hf_dict` reads (`json_type_problems`), and of
# each root key (where a `_ROOT_TEXT_KEYS` key sits at the root, its text kind).
JSON_KINDS = {
    **dict.fromkeys(
        (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "top_k_experts",
        ),
        "int!",
    ),
    **dict.fromkeys(
        (
            "num_key_value_heads",
            "head_dim",
            "global_head_dim",
            "num_global_key_value_heads",
            "num_experts",
            "moe_intermediate_size",
            "expert_intermediate_size",
            "sliding_window",
            "pad_token_id",
            "bos_token_id",
            "mask_token_id",
        ),
        "int?",
    ),
    "eos_token_id": "ids?",
    "max_position_embeddings": "int",
    "rms_norm_eps": "real",
    "initializer_range": "real",
    "final_logit_softcapping": "real?",
    "hidden_activation": "text?",
    "layer_types": "list?",
    "tie_word_embeddings": "flag",
}
_ROOT_KINDS = {**JSON_KINDS, "canvas_length": "int?", "block_size": "int?"}

# Text-model keys the reader also takes from the root where `text_config` lacks them: the
# checkpoint's mask token and softcap, and the optional keys a `model.config_overrides` entry
# writes to the root when the preset's `text_config` leaves them at their defaults.
_ROOT_TEXT_KEYS = (
    "mask_token_id",
    "final_logit_softcapping",
    "rms_norm_eps",
    "max_position_embeddings",
    "hidden_activation",
    "sliding_window",
    "head_dim",
    "num_key_value_heads",
    "global_head_dim",
    "num_global_key_value_heads",
    "moe_intermediate_size",
    "expert_intermediate_size",
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "use_bidirectional_attention",
    "attention_k_eq_v",
    "enable_moe_block",
)
# The experts' hidden size under transformers' name and an older one (`_expert_size`).
_EXPERT_SIZE_KEYS = ("moe_intermediate_size", "expert_intermediate_size")
# config.json keys beyond a preset's that `model.config_overrides` may set: transformers'
# DiffusionGemmaConfig (the root) and DiffusionGemmaTextConfig fields, and the keys
# `from_hf_dict` reads (global attention shapes, the softcap, the mask token...).
CONFIG_KEYS = frozenset(
    {
        *DECODER_SIZES,
        "text_config",
        "vision_config",
        "boi_token_id",
        "eoi_token_id",
        "image_token_id",
        "canvas_length",
        "block_size",
        "hidden_activation",
        "max_position_embeddings",
        "initializer_range",
        "rms_norm_eps",
        "tie_word_embeddings",
        "rope_parameters",
        "attention_bias",
        "attention_dropout",
        "sliding_window",
        "layer_types",
        "per_layer_config",
        "final_logit_softcapping",
        "use_bidirectional_attention",
        "num_experts",
        "top_k_experts",
        "moe_intermediate_size",
        "expert_intermediate_size",
        "global_head_dim",
        "num_global_key_value_heads",
        "attention_k_eq_v",
        "enable_moe_block",
        "pad_token_id",
        "bos_token_id",
        "eos_token_id",
        "mask_token_id",
    }
)

# transformers always builds a vision tower (5.17 fails on a config without one; 5.24 builds a
# default ~167M-parameter one): every preset names one as small as it allows (never trained here).
_SMALLEST_VISION = {
    "model_type": "gemma4_vision",
    "hidden_size": 8,
    "intermediate_size": 8,
    "num_hidden_layers": 1,
    "num_attention_heads": 1,
    "num_key_value_heads": 1,
    "head_dim": 8,
}


def _text(**fields: Any) -> dict[str, Any]:
    return {
        "model_type": "diffusion_gemma",
        "canvas_length": 16,
        "text_config": fields,
        "vision_config": dict(_SMALLEST_VISION),
    }


PRESETS: dict[str, dict[str, Any]] = {
    # CPU tests and smoke runs: 2 sliding + 1 full layers, 4 experts, top-2.
    "tiny": _text(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        global_head_dim=32,
        num_global_key_value_heads=1,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        sliding_window=24,
        num_experts=4,
        top_k_experts=2,
        moe_intermediate_size=32,
        max_position_embeddings=8192,
    ),
    # A DiffusionGemma-like MoE shape that fits one H200 (8 layers, 64 experts top-8, 256-dim
    # sliding heads, 512-dim full heads, vocab 262144): ~3.1B total params, ~1.1B active per
    # token (0.5B of them the embedding); the train-step benchmark's shape. Not the published
    # 26B-A4B config (not available offline): its proportions, with fewer layers.
    "h200-bench": _text(
        vocab_size=262_144,
        hidden_size=2048,
        intermediate_size=2112,
        num_hidden_layers=8,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=256,
        global_head_dim=512,
        num_global_key_value_heads=2,
        layer_types=["sliding_attention"] * 3
        + ["full_attention"]
        + ["sliding_attention"] * 3
        + ["full_attention"],
        sliding_window=1024,
        num_experts=64,
        top_k_experts=8,
        moe_intermediate_size=704,
        max_position_embeddings=262_144,
    ),
}
# The same with 256-wide full-attention heads, in case a kernel of the running torch does not
# take 512 (FlexAttention's tiles on some builds).
PRESETS["h200-bench-hd256"] = json.loads(json.dumps(PRESETS["h200-bench"]))
PRESETS["h200-bench-hd256"]["text_config"]["global_head_dim"] = 256


@dataclasses.dataclass(frozen=True)
class DiffusionGemmaConfig:
    """Everything the model needs; names follow the HF `text_config` (plus the root's)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    num_global_key_value_heads: int
    head_dim: int
    global_head_dim: int
    layer_types: tuple[str, ...]
    sliding_window: int
    num_experts: int
    top_k_experts: int
    moe_intermediate_size: int
    rope_parameters: dict[str, dict[str, Any]] = dataclasses.field(
        default_factory=lambda: json_copy(_DEFAULT_ROPE)
    )
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 131_072
    final_logit_softcapping: float | None = 30.0
    hidden_activation: str = "gelu_pytorch_tanh"
    initializer_range: float = 0.02
    canvas_length: int = 256
    pad_token_id: int | None = 0
    bos_token_id: int | None = 2
    eos_token_id: Any = 1
    mask_token_id: int | None = None
    # The root's other keys (vision config, image token ids), kept so an export round-trips.
    extra_root: dict[str, Any] = dataclasses.field(default_factory=dict)
    model_type: str = "diffusion_gemma"
    tie_word_embeddings: bool = True
    mlp_bias: bool = False  # what the shared gated MLP (families/decoder/model.py: MLP) reads

    def __post_init__(self) -> None:
        problems = []
        problems += decoder_shape_problems(
            self,
            (
                "num_global_key_value_heads",
                "global_head_dim",
                "num_experts",
                "top_k_experts",
                "moe_intermediate_size",
            ),
            kv_heads=("num_key_value_heads", "num_global_key_value_heads"),
        )
        if len(self.layer_types) != self.num_hidden_layers:
            problems.append(
                f"layer_types has {len(self.layer_types)} entries for "
                f"{self.num_hidden_layers} layers"
            )
        unknown = sorted(set(self.layer_types) - set(LAYER_TYPES))
        if unknown:
            problems.append(f"layer_types {unknown} are not supported (only {LAYER_TYPES})")
        if self.layer_types and self.layer_types[-1] != "full_attention":
            # (a num_hidden_layers override keeps the first layer_types: cut after a sliding one)
            problems.append(
                f"the last layer is {self.layer_types[-1]}: transformers' DiffusionGemma makes its "
                "last layer full_attention whatever layer_types says, so it would load the export "
                "as another model; end layer_types (or a num_hidden_layers cut of it) on a "
                "full_attention layer"
            )
        if "sliding_attention" in self.layer_types and self.sliding_window <= 1:
            problems.append(f"sliding layers need sliding_window > 1 (got {self.sliding_window})")
        if self.top_k_experts > self.num_experts:
            problems.append(
                f"top_k_experts ({self.top_k_experts}) exceeds num_experts ({self.num_experts})"
            )
        if self.hidden_activation not in ACTIVATIONS:
            problems.append(
                f"hidden_activation {self.hidden_activation!r} is not supported ({ACTIVATIONS})"
            )
        for kind in set(self.layer_types) & set(LAYER_TYPES):
            rope = self.rope_parameters.get(kind) or {}
            if rope.get("rope_type", "default") not in _ROPE_TYPES[kind]:
                problems.append(
                    f"{kind} rope_type {rope.get('rope_type')!r} is not supported "
                    f"({', '.join(_ROPE_TYPES[kind])})"
                )
            if (
                rope.get("rope_type", "default") == "default"
                and rope.get("partial_rotary_factor", 1.0) != 1.0
            ):
                problems.append(f"{kind}: partial rotary needs rope_type 'proportional'")
            # What model.rope_inv_freq reads: a zero or negative one makes the loss NaN.
            if "rope_theta" not in rope:
                problems.append(f"{kind} rope_parameters lack rope_theta")
            for name, at_most in (
                ("rope_theta", None),
                ("partial_rotary_factor", 1.0),
                ("factor", None),
            ):
                if name in rope:
                    problems += [
                        f"{kind} rope_parameters.{p}"
                        for p in number_problems(rope, (name,), at_most=at_most)
                    ]
        raise_if_unusable(problems)

    # --- per layer type -------------------------------------------------------------------
    def layer_head_dim(self, kind: str) -> int:
        return self.global_head_dim if kind == "full_attention" else self.head_dim

    def layer_kv_heads(self, kind: str) -> int:
        return (
            self.num_global_key_value_heads
            if kind == "full_attention"
            else self.num_key_value_heads
        )

    def window(self, kind: str) -> int | None:
        return self.sliding_window if kind == "sliding_attention" else None

    @property
    def hidden_act(self) -> str:  # the shared gated MLP's name for it
        return self.hidden_activation

    # --- Hugging Face config.json ---------------------------------------------------------
    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any]) -> DiffusionGemmaConfig:
        """Read a transformers `diffusion_gemma` config dict (root with `text_config`)."""
        if hf.get("model_type") != "diffusion_gemma":
            raise DllmError(
                f"config.json is a {hf.get('model_type')!r} model, not 'diffusion_gemma'",
                hint="set model.family to the family of that model",
            )
        if hf.get("text_config") is None:  # not "lacks the field 'num_hidden_layers'"
            raise DllmError(
                "config.json has no text_config: a diffusion_gemma config.json holds the text "
                "model's settings (hidden_size, num_hidden_layers, ...) in it",
                hint="use the model's config.json as Hugging Face ships it (transformers' "
                "DiffusionGemmaConfig writes text_config; without one it builds its default text "
                "model, not the folder's)",
            )
        text = hf["text_config"]
        if isinstance(text, dict):
            own = ("canvas_length", "block_size", "tie_word_embeddings")
            root = {k: hf[k] for k in own if k in hf}
            root.update({k: hf[k] for k in _ROOT_TEXT_KEYS if k in hf and k not in text})
            raise_on_json_types(
                json_type_problems(root, _ROOT_KINDS)
                + json_type_problems(text, JSON_KINDS, prefix="text_config.")
            )
        if not isinstance(text, dict):
            raise DllmError(
                f"config.json's text_config is not an object: {text!r}",
                hint="use the model's config.json as Hugging Face ships it (text_config holds "
                "the text model's settings as an object)",
            )
        text = dict(text)
        own_text = dict(text)  # before the root's keys fill its gaps (`_expert_size`)
        for key in _ROOT_TEXT_KEYS:  # the root may carry them too
            if key in hf and key not in text:
                text[key] = hf[key]
        if hf.get("tie_word_embeddings", True) is False or text.get("tie_word_embeddings") is False:
            raise DllmError(
                "DiffusionGemma ties its output head to the embeddings (tie_word_embeddings must "
                "be true)",
                hint="use an unmodified diffusion_gemma config.json",
            )
        if text.get("use_bidirectional_attention") == "all":
            raise DllmError(
                "use_bidirectional_attention 'all' is not supported: the clean stream is causal",
                hint="remove use_bidirectional_attention from text_config",
            )
        if text.get("attention_bias"):  # transformers would build q/k/v/o biases we have not
            raise DllmError(
                "attention_bias true is not supported: this family's attention has no biases",
                hint="use a diffusion_gemma config.json with attention_bias false",
            )
        no_attention_dropout(text)
        if text.get("attention_k_eq_v") is False or text.get("enable_moe_block") is False:
            raise DllmError(
                "only the MoE DiffusionGemma with keys as values on full layers is supported "
                "(enable_moe_block and attention_k_eq_v true)"
            )
        with hf_config_errors(
            missing_hint="a diffusion_gemma config.json from Hugging Face has it in text_config"
        ):
            layers = int(text["num_hidden_layers"])
            heads = int(text["num_attention_heads"])
            kv = kv_heads_for(text, "diffusion_gemma", heads)
            head_dim = head_dim_for(text, "diffusion_gemma", int(text["hidden_size"]), heads)
            # num_hidden_layers keeps the model's first layers (`cut_layer_list`), and the
            # per_layer_config entries of those layers
            given = text.get("layer_types")
            if given is not None and not isinstance(given, (list, tuple)):
                raise ValueError(f"layer_types must be a list, got {given!r}")
            layer_types = (
                _default_layer_types(layers)
                if not given
                else cut_layer_list([str(kind) for kind in given], layers)
            )
            global_dim, global_kv = _global_attention(
                text, layer_types, head_dim, kv, listed=len(given or layer_types)
            )
            if text.get("num_experts") is None:
                raise DllmError(
                    "this DiffusionGemma config has no experts (num_experts unset)",
                    hint="the family trains the mixture-of-experts DiffusionGemma",
                )
            rope = json_copy(text.get("rope_parameters") or _DEFAULT_ROPE)
            if not isinstance(rope, dict) or any(
                not isinstance(rope.get(kind, {}), dict) for kind in LAYER_TYPES
            ):
                raise ValueError(
                    f"rope_parameters must map each layer type ({', '.join(LAYER_TYPES)}) to "
                    f"an object, got {rope!r}"
                )
            root_keys = (
                "model_type",
                "text_config",
                "canvas_length",
                "block_size",
                "tie_word_embeddings",
                "architectures",
                "transformers_version",
                "dtype",
                "torch_dtype",
                *_ROOT_TEXT_KEYS,
            )
            return cls(
                vocab_size=int(text["vocab_size"]),
                hidden_size=int(text["hidden_size"]),
                intermediate_size=int(text["intermediate_size"]),
                num_hidden_layers=layers,
                num_attention_heads=heads,
                num_key_value_heads=kv,
                num_global_key_value_heads=global_kv,
                head_dim=head_dim,
                global_head_dim=global_dim,
                layer_types=tuple(layer_types),
                sliding_window=int(text.get("sliding_window") or 512),
                num_experts=int(text["num_experts"]),
                top_k_experts=int(text["top_k_experts"]),
                moe_intermediate_size=int(_expert_size(hf, own_text)),
                rope_parameters=rope,
                rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
                max_position_embeddings=int(text.get("max_position_embeddings", 131_072)),
                final_logit_softcapping=(
                    None
                    if text.get("final_logit_softcapping", 30.0) is None
                    else float(text.get("final_logit_softcapping", 30.0))
                ),
                hidden_activation=str(text.get("hidden_activation") or "gelu_pytorch_tanh"),
                initializer_range=float(
                    text.get("initializer_range", hf.get("initializer_range", 0.02))
                ),
                canvas_length=int(hf.get("canvas_length") or hf.get("block_size") or 256),
                pad_token_id=_token_ids(text.get("pad_token_id", 0)),
                bos_token_id=_token_ids(text.get("bos_token_id", 2)),
                eos_token_id=_listed(_token_ids(text.get("eos_token_id", 1), several=True)),
                mask_token_id=_token_ids(text.get("mask_token_id")),
                extra_root={k: v for k, v in hf.items() if k not in root_keys},
            )

    def to_hf_dict(self) -> dict[str, Any]:
        """A config.json that `DiffusionGemmaForBlockDiffusion.from_pretrained` loads."""
        text: dict[str, Any] = {
            "model_type": "diffusion_gemma_text",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "num_global_key_value_heads": self.num_global_key_value_heads,
            "head_dim": self.head_dim,
            "global_head_dim": self.global_head_dim,
            "layer_types": list(self.layer_types),
            "sliding_window": self.sliding_window,
            "num_experts": self.num_experts,
            "top_k_experts": self.top_k_experts,
            "moe_intermediate_size": self.moe_intermediate_size,
            "rope_parameters": json_copy(self.rope_parameters),
            "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position_embeddings,
            "final_logit_softcapping": self.final_logit_softcapping,
            "hidden_activation": self.hidden_activation,
            "initializer_range": self.initializer_range,
            "pad_token_id": self.pad_token_id,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "tie_word_embeddings": True,
            "attention_k_eq_v": True,
            "enable_moe_block": True,
            "attention_bias": False,
            "attention_dropout": 0.0,
        }
        if self.mask_token_id is not None:
            text["mask_token_id"] = self.mask_token_id
        out: dict[str, Any] = {
            "architectures": ["DiffusionGemmaForBlockDiffusion"],
            "model_type": "diffusion_gemma",
            **json_copy(self.extra_root),
            "canvas_length": self.canvas_length,
            "tie_word_embeddings": True,
            "text_config": text,
            "torch_dtype": "float32",
        }
        return out

    # --- sizes ----------------------------------------------------------------------------
    def _attention_params(self, kind: str) -> int:
        h, d, kv = self.hidden_size, self.layer_head_dim(kind), self.layer_kv_heads(kind)
        values = 0 if kind == "full_attention" else h * kv * d  # full layers: V = K
        return 2 * h * self.num_attention_heads * d + h * kv * d + values

    @property
    def expert_params(self) -> int:
        return 3 * self.hidden_size * self.moe_intermediate_size

    def _layer_active_params(self, kind: str) -> int:
        """Weights one token is multiplied by in one layer (router included, norms not)."""
        dense = 3 * self.hidden_size * self.intermediate_size
        router = self.hidden_size * self.num_experts
        return (
            self._attention_params(kind) + dense + router + self.top_k_experts * self.expert_params
        )

    @property
    def head_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def num_params(self) -> int:
        """Total parameters (the tied embedding once), the self-conditioning MLP included."""
        h = self.hidden_size
        total = 0
        for kind in self.layer_types:
            d = self.layer_head_dim(kind)
            total += self._layer_active_params(kind)
            total += (self.num_experts - self.top_k_experts) * self.expert_params
            total += 8 * h + 2 * d + self.num_experts + 1  # 7 norms, router scales, layer scalar
        self_conditioning = 3 * h * self.intermediate_size + h
        return total + self.head_params + h + self_conditioning

    def num_active_params(self) -> int:
        """Parameters one token meets (top-k experts of each layer)."""
        return sum(self._layer_active_params(k) for k in self.layer_types) + self.head_params

    def step_flops(self, *, stream_tokens: int, scored_tokens: int, pairs: int) -> float:
        """Active-parameter model FLOPs of one forward+backward.

        6 x active matmul params per stream token, 6 x head per scored token, and attention:
        `pairs` (query, key) pairs on full layers; sliding layers at most `sliding_window`
        keys per query (an upper bound where the window is not full).
        """
        body = 6.0 * sum(self._layer_active_params(k) for k in self.layer_types) * stream_tokens
        head = 6.0 * self.head_params * scored_tokens
        attention = 0.0
        for kind in self.layer_types:
            kind_pairs = (
                pairs
                if kind == "full_attention"
                else min(pairs, stream_tokens * self.sliding_window)
            )
            attention += 12.0 * self.layer_head_dim(kind) * self.num_attention_heads * kind_pairs
        return body + head + attention


def json_copy(value: Any) -> Any:
    return json.loads(json.dumps(value))


def _default_layer_types(layers: int) -> list[str]:
    """HF's default: five sliding layers then one full, the last layer always full."""
    kinds = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(layers)]
    kinds[-1] = "full_attention"
    return kinds


def _layer_kind(layer_types: list[str], index: int) -> str:
    if index >= len(layer_types):
        raise ValueError(
            f"per_layer_config names layer {index} of a {len(layer_types)}-layer model"
        )
    return layer_types[index]


def _listed(ids: Any) -> Any:
    """Several token ids as the config.json spells them (a list), else the one id."""
    return list(ids) if isinstance(ids, tuple) else ids


def _expert_size(hf: dict[str, Any], text: dict[str, Any]) -> Any:
    """The experts' hidden size: `moe_intermediate_size` (transformers' name) or
    `expert_intermediate_size` (an older name of the same size).

    A `model.config_overrides` entry of a key the `text_config` lacks is written to the root
    (`Family.resolve_config`), so the root's wins over the `text_config`'s: an override of
    `expert_intermediate_size` on a config holding `moe_intermediate_size` takes effect (it
    was dropped: the reader read the new name first). Within one of them, two names that
    disagree are refused: which one a user meant is not for the reader to guess.
    """
    for where, config in (("config.json", hf), ("text_config", text)):
        sizes = {key: config[key] for key in _EXPERT_SIZE_KEYS if config.get(key) is not None}
        if len(sizes) == 2 and sizes["moe_intermediate_size"] != sizes["expert_intermediate_size"]:
            raise DllmError(
                f"{where} sets moe_intermediate_size {sizes['moe_intermediate_size']!r} and "
                f"expert_intermediate_size {sizes['expert_intermediate_size']!r}, two names of "
                "the experts' hidden size that disagree",
                hint="give both the same value (model.config_overrides can set both), or keep "
                "only moe_intermediate_size, the name transformers reads",
            )
        if sizes:
            return next(iter(sizes.values()))
    raise KeyError("moe_intermediate_size")  # hf_config_errors: "config.json lacks the field"


def _global_attention(
    text: dict[str, Any], layer_types: list[str], head_dim: int, kv: int, *, listed: int
) -> tuple[int, int]:
    """(head_dim, kv heads) of the full layers: `per_layer_config` (as HF writes it) or the
    `global_head_dim` / `num_global_key_value_heads` keys (as HF reads them).

    As transformers reads `per_layer_config`: each layer's entry changes the text config's own
    values for that layer (a full layer it does not list, or whose entry lacks `head_dim`, has
    the text's `head_dim`), and the legacy keys are read only where it is absent. The model here
    builds every layer of a type alike, with only the full layers' head size and kv heads their
    own: an entry giving a sliding layer another shape, or any layer another value of a key
    (`intermediate_size`, `sliding_window`, ...), is refused rather than ignored. Entries of
    layers a `num_hidden_layers` override cut (of the `listed` the config's layer_types had)
    go with them."""
    if text.get("per_layer_config") is None:
        global_kv = text.get("num_global_key_value_heads")
        return int(text.get("global_head_dim") or 512), int(global_kv or kv)
    per_layer = text["per_layer_config"]
    if not isinstance(per_layer, dict) or not all(isinstance(v, dict) for v in per_layer.values()):
        raise ValueError(f"per_layer_config must map layer indices to objects, got {per_layer!r}")
    entries: dict[int, dict[str, Any]] = {}
    for index, entry in per_layer.items():
        if not str(index).isdigit():
            raise ValueError(f"per_layer_config key {index!r} is not a layer index")
        if len(layer_types) <= int(index) < listed:  # a layer the layer count cut
            continue
        _layer_kind(layer_types, int(index))
        entries[int(index)] = entry
    shapes: dict[str, set[tuple[int, int]]] = {kind: set() for kind in LAYER_TYPES}
    for index, kind in enumerate(layer_types):
        entry = entries.get(index, {})
        other = sorted(
            key
            for key, value in entry.items()
            if key not in ("head_dim", "num_key_value_heads") and value != text.get(key)
        )
        if other:
            raise DllmError(
                f"per_layer_config gives layer {index} its own {', '.join(other)}, which this "
                "family does not build (only the full-attention layers' head_dim and "
                "num_key_value_heads may differ from text_config's)"
            )
        shape = (int(entry.get("head_dim", head_dim)), int(entry.get("num_key_value_heads", kv)))
        shapes.setdefault(kind, set()).add(shape)
    if len(shapes["full_attention"]) > 1:
        raise DllmError(
            f"full-attention layers disagree in per_layer_config: {sorted(shapes['full_attention'])}"
        )
    if shapes["sliding_attention"] - {(head_dim, kv)}:
        raise DllmError(
            "per_layer_config gives sliding-attention layers another head_dim or "
            f"num_key_value_heads than text_config's ({head_dim}, {kv}): not supported"
        )
    full = shapes["full_attention"].pop() if shapes["full_attention"] else (head_dim, kv)
    legacy = (
        ("global_head_dim", text.get("global_head_dim"), full[0]),
        ("num_global_key_value_heads", text.get("num_global_key_value_heads"), full[1]),
    )
    for key, value, read in legacy:
        if value is not None and int(value) != read:
            raise DllmError(
                f"{key} = {value} disagrees with per_layer_config, which gives the "
                f"full-attention layers {read} (transformers reads per_layer_config and ignores "
                f"{key})",
                hint="change per_layer_config instead (model.config_overrides can set it whole)",
            )
    return full
