"""The Qwen3.8 hybrid's shape, read from (and written back to) a Hugging Face `config.json`.

Qwen3.8 is transformers' `qwen3_5` model: a stack of Gated DeltaNet (linear attention) layers
with a full-attention layer every few (`layer_types`), SwiGLU MLPs and zero-centred RMSNorms.
A `qwen3_5` folder is the multimodal checkpoint: its text half is `text_config` (and its tensors
sit under `model.language_model.`); a `qwen3_5_text` folder is the text model alone. Both are
read into one frozen dataclass; it writes `qwen3_5_text` (`Qwen3_5ForCausalLM`) back.

Torch-free: the registry and validation import it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from turbo_dllm.errors import DllmError
from turbo_dllm.families.base import (
    DECODER_SIZES,
    KEY_DEFAULTS,
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
from turbo_dllm.families.decoder.config import (
    ACTIVATION_ALIASES,
    SUPPORTED_ROPE_TYPES,
    _token_ids,
    cut_layer_list,
    rope_scaling_problems,
    rope_type_problems,
    with_original_length,
)
from turbo_dllm.families.decoder.config import JSON_KINDS as DECODER_KINDS

__all__ = [
    "CONFIG_KEYS",
    "GDN_CHUNK",
    "LAYER_KINDS",
    "MODEL_TYPES",
    "PRESETS",
    "Qwen38Config",
    "mrope_section_for",
    "tensor_parallel_problems",
]

MODEL_TYPES = ("qwen3_5", "qwen3_5_text")
LAYER_KINDS = ("linear_attention", "full_attention")
# The chunk length of the chunked Gated DeltaNet kernels (fla's and our torch reference): the
# clean stream's recurrent state is captured at block boundaries, which must be chunk boundaries.
GDN_CHUNK = 64
# config.json keys beyond a preset's that `model.config_overrides` may set: transformers'
# Qwen3_5Config and Qwen3_5TextConfig fields, and the keys `from_hf_dict` reads (the layer
# pattern's `full_attention_interval`, the mask-token migration's record).
CONFIG_KEYS = frozenset(
    {
        *DECODER_SIZES,
        "text_config",
        "vision_config",
        "image_token_id",
        "video_token_id",
        "vision_start_token_id",
        "vision_end_token_id",
        "hidden_act",
        "max_position_embeddings",
        "initializer_range",
        "rms_norm_eps",
        "use_cache",
        "tie_word_embeddings",
        "rope_parameters",
        "rope_scaling",
        "rope_theta",
        "partial_rotary_factor",
        "attention_bias",
        "attention_dropout",
        "linear_conv_kernel_dim",
        "linear_key_head_dim",
        "linear_value_head_dim",
        "linear_num_key_heads",
        "linear_num_value_heads",
        "layer_types",
        "full_attention_interval",
        "pad_token_id",
        "bos_token_id",
        "eos_token_id",
        "mask_token_id",
        "dllm_mask_token",
        "dllm_mask_token_original_vocab_size",
        "dllm_mask_token_migration_version",
    }
)


def _hybrid(layers: int, every: int = 4) -> list[str]:
    """Qwen3.5's default pattern: three linear-attention layers, then one full attention."""
    return ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(layers)]


# transformers' Qwen3_5TextConfig defaults of the keys a config.json may lack.
_DEFAULTS = KEY_DEFAULTS["qwen3_5_text"]

# The JSON type of each config.json key `from_hf_dict` reads (`json_type_problems`).
JSON_KINDS = {
    **{k: v for k, v in DECODER_KINDS.items() if k not in ("mlp_bias", "use_sliding_window")},
    **dict.fromkeys(
        (
            "linear_num_key_heads",
            "linear_num_value_heads",
            "linear_key_head_dim",
            "linear_value_head_dim",
        ),
        "int",
    ),
    "linear_conv_kernel_dim": "int",
    "full_attention_interval": "int?",
    "partial_rotary_factor": "real",
    "layer_types": "list?",
    "mask_token_id": "int?",
    "dllm_mask_token": "text?",
    "dllm_mask_token_original_vocab_size": "int?",
    "dllm_mask_token_migration_version": "int?",
}


# `rope_parameters` keys of the rotated dims and the multimodal layout, not of a scaled type.
_ROPE_LAYOUT_KEYS = (
    "type",
    "rope_theta",
    "partial_rotary_factor",
    "mrope_section",
    "mrope_interleaved",
)


def _json_type_problems(hf: dict[str, Any]) -> list[str]:
    """`json_type_problems` of a qwen3_5 / qwen3_5_text config.json: a key at the root, and
    one of `text_config` that the root does not override (named `text_config.KEY`)."""
    problems = json_type_problems(hf, JSON_KINDS)
    nested = hf.get("text_config") if hf.get("model_type") == "qwen3_5" else None
    configs = [(hf, "")]
    if isinstance(nested, dict):
        configs.append((nested, "text_config."))
        own = {k: v for k, v in nested.items() if k not in hf}
        problems += json_type_problems(own, JSON_KINDS, prefix="text_config.")
    for config, prefix in configs:
        rope = config.get("rope_parameters")
        if isinstance(rope, dict) and (not prefix or "rope_parameters" not in hf):
            problems += json_type_problems(
                rope,
                {"rope_theta": "real", "partial_rotary_factor": "real", "mrope_section": "ints?"},
                prefix=f"{prefix}rope_parameters.",
            )
    return problems


def _layer_types(text: dict[str, Any], layers: int) -> list[str]:
    """The layer pattern as transformers builds it: `layer_types` where the config has it, else
    a full-attention layer every `full_attention_interval` (4). Published configs hold both; one
    that disagrees with the other (an override of either, a hand-edited config.json) is refused:
    read by the interval, it trained another model than transformers loads from the same file
    (a `layer_types` override was ignored without a word). `num_hidden_layers` is the model's
    first layers (`cut_layer_list`): fewer keep the first `layer_types`, more extend the
    pattern the interval describes, and are refused where none does."""
    given, every = text.get("layer_types"), text.get("full_attention_interval")
    if every is not None:
        every = int(every)
        if every <= 0:
            raise ValueError(f"full_attention_interval must be positive (got {every})")
    if given is None:
        return _hybrid(layers, every or 4)
    if not isinstance(given, (list, tuple)):
        raise ValueError(f"layer_types must be a list, got {given!r}")
    kept = [str(kind) for kind in given][:layers]
    if every is not None and kept != _hybrid(len(kept), every):
        raise DllmError(
            f"config.json's layer_types ({_pattern(kept)}) and full_attention_interval = {every} "
            f"(a full-attention layer every {every}: {_pattern(_hybrid(len(kept), every))}) "
            "disagree; transformers builds layer_types and ignores the interval",
            hint="make them agree (model.config_overrides can set full_attention_interval; a "
            "layer_types list goes in a config.json, model.from_config); a pattern no interval "
            "describes needs a config.json without full_attention_interval",
        )
    if every is not None:
        return _hybrid(layers, every)
    return cut_layer_list(kept, layers, rule="full_attention_interval")


def _pattern(kinds: list[str]) -> str:
    """`L L L F ...`: linear / full attention per layer (the first 16)."""
    short = {"full_attention": "F", "linear_attention": "L"}
    letters = [short.get(kind, kind) for kind in kinds[:16]]
    return " ".join(letters) + (" ..." if len(kinds) > 16 else "")


_TINY = {
    "model_type": "qwen3_5_text",
    "vocab_size": 512,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 32,
    "linear_value_head_dim": 32,
    "linear_conv_kernel_dim": 4,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.25,
    },
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
}

# The published Qwen3.8-27B text config's shapes (64 layers, full attention every 4th), and the
# same layer shapes with 8 layers for single-GPU benchmarks.
_27B = {
    "model_type": "qwen3_5_text",
    "vocab_size": 248320,
    "hidden_size": 5120,
    "intermediate_size": 17408,
    "num_hidden_layers": 64,
    "layer_types": _hybrid(64),
    "num_attention_heads": 24,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 48,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10000000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [11, 11, 10],
        "mrope_interleaved": True,
    },
    "max_position_embeddings": 262144,
    "tie_word_embeddings": False,
}
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": _TINY,
    "qwen3.8-27b": _27B,
    "qwen3.8-27b-8l": {**_27B, "num_hidden_layers": 8, "layer_types": _hybrid(8)},
}


def mrope_section_for(rotary_dim: int) -> tuple[int, int, int]:
    """The temporal / height / width split of the `rotary_dim // 2` RoPE frequencies, as
    transformers' Qwen3_5TextRotaryEmbedding lays them out with `mrope_interleaved` (frequency i
    is temporal, height, width for i % 3 = 0, 1, 2: height takes the indices 1, 4, ... below
    3 x section[1], width 2, 5, ... below 3 x section[2], temporal the rest), so the sections sum
    to the frequency count (what vLLM's MRotaryEmbedding asserts). For the published Qwen3.5 /
    Qwen3.8 (32 frequencies) it is their [11, 11, 10]."""
    frequencies = rotary_dim // 2
    height, width = len(range(1, frequencies, 3)), len(range(2, frequencies, 3))
    return (frequencies - height - width, height, width)


@dataclasses.dataclass(frozen=True)
class Qwen38Config:
    """Everything the hybrid needs; field names follow transformers' Qwen3_5TextConfig."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    layer_types: tuple[str, ...]
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int = 4
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    partial_rotary_factor: float = 0.25
    # The source's (kept where it fits `rotary_dim`); None: derived (`mrope_section_for`).
    mrope_section: tuple[int, ...] | None = None
    # A scaled RoPE's `rope_parameters` keys (rope_type and what it reads; the decoder's types,
    # computed by decoder.model.rope_frequencies on the rotated dims); None: default RoPE.
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    hidden_act: str = "silu"
    initializer_range: float = 0.02
    mask_token_id: int | None = None
    # The source's special token ids, kept so an export can generate (written when known).
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int | None = None
    # The mask-token migration's record (mask_token.py), carried into checkpoints and exports.
    dllm_mask_token: str | None = None
    dllm_mask_token_original_vocab_size: int | None = None
    dllm_mask_token_migration_version: int | None = None
    # What the decoder's gated MLP reads (Qwen3.5's MLPs have no biases).
    mlp_bias: bool = False

    def __post_init__(self) -> None:
        problems = []
        if self.model_type not in MODEL_TYPES:
            problems.append(
                f"model_type {self.model_type!r} is not one of {', '.join(MODEL_TYPES)}"
            )
        problems += decoder_shape_problems(
            self,
            (
                "linear_num_key_heads",
                "linear_num_value_heads",
                "linear_key_head_dim",
                "linear_value_head_dim",
                "linear_conv_kernel_dim",
            ),
        )
        if len(self.layer_types) != self.num_hidden_layers:
            problems.append(
                f"layer_types has {len(self.layer_types)} entries for "
                f"{self.num_hidden_layers} layers"
            )
        unknown = sorted(set(self.layer_types) - set(LAYER_KINDS))
        if unknown:
            problems.append(f"layer_types holds {unknown} (known: {', '.join(LAYER_KINDS)})")
        if self.linear_num_key_heads > 0 and (
            self.linear_num_value_heads % self.linear_num_key_heads
        ):
            problems.append("linear_num_value_heads must be a multiple of linear_num_key_heads")
        problems += number_problems(self, ("partial_rotary_factor",), at_most=1.0)
        problems += rope_type_problems(self.rope_scaling, SUPPORTED_ROPE_TYPES)
        problems += rope_scaling_problems(self.rope_scaling)
        if self.rotary_dim % 2 or self.rotary_dim <= 0:
            problems.append(
                f"head_dim x partial_rotary_factor = {self.rotary_dim} must be a positive even number"
            )
        if self.hidden_act != "silu":
            problems.append(f"hidden_act {self.hidden_act!r} is not supported (Qwen3.5 uses silu)")
        if self.mask_token_id is not None and not 0 <= self.mask_token_id < self.vocab_size:
            problems.append(
                f"mask_token_id {self.mask_token_id} is outside the vocabulary ({self.vocab_size})"
            )
        raise_if_unusable(problems)

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def export_mrope_section(self) -> tuple[int, ...]:
        """`rope_parameters.mrope_section` for config.json: the source's where it fits this
        model's rotary dims, else `mrope_section_for` them. It was always the 27B's [11, 11, 10],
        which fits only rotary_dim 64 (head_dim 256 x 0.25): other head dims exported a section
        that serving engines holding sum(mrope_section) == rotary_dim / 2 refuse, and which
        transformers' multimodal positions read past (or short of) the frequencies there are."""
        if self.mrope_section is not None and sum(self.mrope_section) == self.rotary_dim // 2:
            return tuple(self.mrope_section)
        return mrope_section_for(self.rotary_dim)

    @property
    def num_linear_layers(self) -> int:
        return self.layer_types.count("linear_attention")

    @property
    def num_full_layers(self) -> int:
        return self.layer_types.count("full_attention")

    # --- Hugging Face config.json ---------------------------------------------------------
    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any]) -> Qwen38Config:
        """Read a `qwen3_5` (multimodal: its `text_config`) or `qwen3_5_text` config dict."""
        model_type = hf.get("model_type")
        if model_type not in MODEL_TYPES:
            raise DllmError(
                f"config.json is a {model_type!r} model, not one of {', '.join(MODEL_TYPES)}",
                hint="set model.family to the family of that model",
            )
        text = dict(hf)
        if model_type == "qwen3_5":
            nested = hf.get("text_config")
            if not isinstance(nested, dict):
                raise DllmError(
                    "a qwen3_5 config.json needs a text_config object",
                    hint="use the model's config.json as Hugging Face ships it (its text model's "
                    "settings are under text_config), or a qwen3_5_text config.json",
                )
            # Root keys (overrides, the mask token, tying) win over the nested defaults.
            text = {**nested, **{k: v for k, v in hf.items() if k not in ("text_config",)}}
            text.pop("vision_config", None)
            # Tying is the root's alone, as Qwen3_5ForConditionalGeneration (the model such a
            # folder is saved from) reads it: Qwen3_5Config's own field, false where absent,
            # whatever text_config says. A root without it and a text_config saying true is
            # an untied model whose folder holds lm_head.weight (transformers' text model, told
            # to tie, keeps that head too, the two weights differing).
            text["tie_word_embeddings"] = hf.get("tie_word_embeddings", False)
        no_attention_dropout(text)
        raise_on_json_types(_json_type_problems(hf))
        with hf_config_errors(
            missing_hint="a Qwen3.5 / Qwen3.8 config.json from Hugging Face has it"
        ):
            layers = int(text["num_hidden_layers"])
            heads = int(text["num_attention_heads"])
            rope = dict(text.get("rope_parameters") or {})
            legacy = text.get("rope_scaling")
            if isinstance(legacy, dict):  # (4.x's key: transformers merges it in)
                rope.update(legacy)
                if "type" in legacy and "rope_type" not in legacy:
                    rope["rope_type"] = legacy["type"]
            rope.setdefault("rope_type", "default")
            # What a scaled type reads (the rest: the rotated dims and the multimodal layout)
            scaling = {k: v for k, v in rope.items() if k not in _ROPE_LAYOUT_KEYS}
            layer_types = _layer_types(text, layers)
            max_positions = int(
                text.get("max_position_embeddings", _DEFAULTS["max_position_embeddings"])
            )
            act = str(text.get("hidden_act") or "silu")
            return cls(
                model_type="qwen3_5_text",
                vocab_size=int(text["vocab_size"]),
                hidden_size=int(text["hidden_size"]),
                intermediate_size=int(text["intermediate_size"]),
                num_hidden_layers=layers,
                layer_types=tuple(str(kind) for kind in layer_types),
                num_attention_heads=heads,
                num_key_value_heads=kv_heads_for(text, "qwen3_5_text", heads),
                head_dim=head_dim_for(text, "qwen3_5_text", int(text["hidden_size"]), heads),
                linear_num_key_heads=int(
                    text.get("linear_num_key_heads", _DEFAULTS["linear_num_key_heads"])
                ),
                linear_num_value_heads=int(
                    text.get("linear_num_value_heads", _DEFAULTS["linear_num_value_heads"])
                ),
                linear_key_head_dim=int(
                    text.get("linear_key_head_dim", _DEFAULTS["linear_key_head_dim"])
                ),
                linear_value_head_dim=int(
                    text.get("linear_value_head_dim", _DEFAULTS["linear_value_head_dim"])
                ),
                linear_conv_kernel_dim=int(
                    text.get("linear_conv_kernel_dim", _DEFAULTS["linear_conv_kernel_dim"])
                ),
                rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
                rope_theta=float(rope.get("rope_theta", text.get("rope_theta", 10000.0))),
                partial_rotary_factor=float(
                    rope.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25))
                ),
                mrope_section=(
                    None
                    if rope.get("mrope_section") is None
                    else tuple(int(x) for x in rope["mrope_section"])
                ),
                rope_scaling=(
                    with_original_length(scaling, max_positions)
                    if scaling["rope_type"] != "default"
                    else None
                ),
                max_position_embeddings=max_positions,
                tie_word_embeddings=bool(text.get("tie_word_embeddings", False)),
                attention_bias=bool(text.get("attention_bias", False)),
                hidden_act=ACTIVATION_ALIASES.get(act, act),
                initializer_range=float(text.get("initializer_range", 0.02)),
                mask_token_id=(
                    None if text.get("mask_token_id") is None else int(text["mask_token_id"])
                ),
                bos_token_id=_token_ids(text.get("bos_token_id")),
                eos_token_id=_token_ids(text.get("eos_token_id"), several=True),
                pad_token_id=_token_ids(text.get("pad_token_id")),
                dllm_mask_token=text.get("dllm_mask_token"),
                dllm_mask_token_original_vocab_size=text.get("dllm_mask_token_original_vocab_size"),
                dllm_mask_token_migration_version=text.get("dllm_mask_token_migration_version"),
            )

    def to_hf_dict(self) -> dict[str, Any]:
        """A `qwen3_5_text` config.json that transformers loads into `Qwen3_5ForCausalLM`."""
        out: dict[str, Any] = {
            "architectures": ["Qwen3_5ForCausalLM"],
            "model_type": "qwen3_5_text",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "layer_types": list(self.layer_types),
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "linear_num_key_heads": self.linear_num_key_heads,
            "linear_num_value_heads": self.linear_num_value_heads,
            "linear_key_head_dim": self.linear_key_head_dim,
            "linear_value_head_dim": self.linear_value_head_dim,
            "linear_conv_kernel_dim": self.linear_conv_kernel_dim,
            "hidden_act": self.hidden_act,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": {
                "rope_type": "default",
                **(self.rope_scaling or {}),
                "rope_theta": self.rope_theta,
                "partial_rotary_factor": self.partial_rotary_factor,
                "mrope_section": list(self.export_mrope_section),
                "mrope_interleaved": True,
            },
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "attention_dropout": 0.0,
            "initializer_range": self.initializer_range,
            "torch_dtype": "float32",
        }
        if self.mask_token_id is not None:
            out["mask_token_id"] = self.mask_token_id
        for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
            value = getattr(self, name)
            if value is not None:
                out[name] = list(value) if isinstance(value, tuple) else value
        if self.dllm_mask_token is not None:
            out.update(
                dllm_mask_token=self.dllm_mask_token,
                dllm_mask_token_id=self.mask_token_id,
                dllm_mask_token_original_vocab_size=self.dllm_mask_token_original_vocab_size,
                dllm_mask_token_migration_version=self.dllm_mask_token_migration_version,
            )
        return out

    # --- sizes ----------------------------------------------------------------------------
    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    def _full_matmul_params(self) -> int:
        h, d = self.hidden_size, self.head_dim
        q_and_gate = h * 2 * self.num_attention_heads * d
        kv = 2 * h * self.num_key_value_heads * d
        return q_and_gate + kv + self.num_attention_heads * d * h

    def _linear_matmul_params(self) -> int:
        h, heads = self.hidden_size, self.linear_num_value_heads
        qkv = h * (2 * self.linear_key_dim + self.linear_value_dim)
        return qkv + h * self.linear_value_dim + 2 * h * heads + self.linear_value_dim * h

    @property
    def body_matmul_params(self) -> int:
        mlp = 3 * self.hidden_size * self.intermediate_size
        return (
            self.num_full_layers * self._full_matmul_params()
            + self.num_linear_layers * self._linear_matmul_params()
            + self.num_hidden_layers * mlp
        )

    @property
    def head_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def num_params(self) -> int:
        h = self.hidden_size
        conv = (2 * self.linear_key_dim + self.linear_value_dim) * self.linear_conv_kernel_dim
        linear_extra = conv + 2 * self.linear_num_value_heads + self.linear_value_head_dim
        norms = self.num_hidden_layers * 2 * h + self.num_full_layers * 2 * self.head_dim
        embeddings = self.head_params * (1 if self.tie_word_embeddings else 2)
        return (
            self.body_matmul_params + self.num_linear_layers * linear_extra + norms + embeddings + h
        )

    def step_flops(self, *, stream_tokens: int, scored_tokens: int, pairs: int) -> float:
        """Model FLOPs of one forward+backward: 6 x matmul params per token, plus the mixers.

        Softmax attention: 12 x head_dim x heads per allowed (query, key) pair, on the full
        layers. Gated DeltaNet (chunked, chunk C): per token and value head, the intra-chunk
        products (2C(Dk + Dv)) and the state read, correction and update (6 Dk Dv), forward,
        times three for forward+backward.
        """
        body = 6.0 * self.body_matmul_params * stream_tokens
        head = 6.0 * self.head_params * scored_tokens
        attention = 12.0 * self.head_dim * self.num_attention_heads * self.num_full_layers * pairs
        dk, dv = self.linear_key_head_dim, self.linear_value_head_dim
        per_token = self.linear_num_value_heads * (2 * GDN_CHUNK * (dk + dv) + 6 * dk * dv)
        linear = 3.0 * per_token * self.num_linear_layers * stream_tokens
        return body + head + attention + linear


def tensor_parallel_problems(config: Qwen38Config, tp: int) -> list[str]:
    """Why `config` cannot be split over `tp` ranks; empty when it can."""
    if tp <= 1:
        return []
    found = []
    for field in (
        "num_attention_heads",
        "num_key_value_heads",
        "intermediate_size",
        "linear_num_key_heads",
        "linear_num_value_heads",
    ):
        value = getattr(config, field)
        if value % tp:
            found.append(f"{field} = {value} is not divisible by topology.tp = {tp}")
    return found
