"""The decoder's shape, read from (and written back to) a Hugging Face `config.json`.

One frozen dataclass covers the Llama / Qwen2 / Qwen3 family: they differ only in which
projections carry a bias, whether q/k get a per-head RMSNorm (Qwen3) and how RoPE is scaled.
Presets give random-init shapes: `tiny` for CPU tests, and the real Qwen3 shapes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from turbo_dllm.errors import DllmError
from turbo_dllm.families.base import (
    DECODER_SIZES,
    FamilyMismatch,
    decoder_shape_problems,
    head_dim_for,
    hf_config_errors,
    json_type_problems,
    key_default,
    kv_heads_for,
    no_attention_dropout,
    number_problems,
    raise_if_unusable,
    raise_on_json_types,
)

__all__ = [
    "ACTIVATIONS",
    "CONFIG_KEYS",
    "PRESETS",
    "DecoderConfig",
    "cut_layer_list",
    "rope_scaling_problems",
    "with_original_length",
    "rope_type_problems",
    "tensor_parallel_problems",
]

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
# transformers' RoPE types whose frequencies follow each sequence's length at run time: a
# training step's packed stream is no sequence of its own, so they are not trained.
_RUNTIME_ROPE_TYPES = ("dynamic", "longrope")
# The `rope_scaling` keys each scaled RoPE type reads (model.rope_frequencies), all positive.
_ROPE_SCALING_KEYS = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings"),
}
# The scaled types whose `original_max_position_embeddings` transformers' config takes from
# `max_position_embeddings` when a config.json leaves it out (`with_original_length`).
_ORIGINAL_LENGTH_TYPES = ("llama3", "yarn")
# The keys a type reads where present (transformers' optional ones): "number" finite and >= 0,
# "positive" > 0, "flag" true or false. A null one is read as transformers reads it: YaRN takes
# a null (or zero) beta or mscale, or a null attention_factor, as absent, and a null truncate as
# false.
_ROPE_OPTIONAL_KEYS = {
    "yarn": {
        "beta_fast": "number",
        "beta_slow": "number",
        "mscale": "number",
        "mscale_all_dim": "number",
        "attention_factor": "positive",
        "truncate": "flag",
    },
}
# The MLP activations of HF configs (`hidden_act`) the decoder implements (model.ACTIVATIONS).
ACTIVATIONS = ("silu", "gelu", "gelu_pytorch_tanh", "gelu_new", "relu")
# Other names transformers' ACT2FN gives one of them ("swish" is nn.SiLU): read as that one.
ACTIVATION_ALIASES = {"swish": "silu"}

# HF config.json dicts (only the fields we read). Real shapes from the published Qwen3 configs.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {
        "model_type": "qwen3",
        "vocab_size": 512,
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
    },
    "qwen3-0.6b": {
        "model_type": "qwen3",
        "vocab_size": 151936,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 40960,
        "tie_word_embeddings": True,
    },
    "qwen3-1.7b": {
        "model_type": "qwen3",
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 40960,
        "tie_word_embeddings": True,
    },
}

# config.json keys beyond a preset's that `model.config_overrides` may set: transformers'
# LlamaConfig, Qwen2Config and Qwen3Config fields, and the keys `from_hf_dict` reads.
CONFIG_KEYS = frozenset(
    {
        *DECODER_SIZES,
        "hidden_act",
        "hidden_activation",
        "max_position_embeddings",
        "initializer_range",
        "rms_norm_eps",
        "use_cache",
        "tie_word_embeddings",
        "rope_parameters",
        "rope_scaling",
        "rope_theta",
        "attention_bias",
        "attention_dropout",
        "mlp_bias",
        "pretraining_tp",
        "use_sliding_window",
        "sliding_window",
        "max_window_layers",
        "layer_types",
        "pad_token_id",
        "bos_token_id",
        "eos_token_id",
    }
)

# The JSON type of each config.json key `from_hf_dict` reads (`json_type_problems`).
JSON_KINDS = {
    **dict.fromkeys(
        ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers"), "int!"
    ),
    "num_attention_heads": "int!",
    "num_key_value_heads": "int?",
    "head_dim": "int?",
    "max_position_embeddings": "int",
    **dict.fromkeys(("rms_norm_eps", "rope_theta", "initializer_range"), "real"),
    **dict.fromkeys(("tie_word_embeddings", "attention_bias", "mlp_bias"), "flag"),
    "use_sliding_window": "flag?",
    "hidden_act": "text?",
    "hidden_activation": "text?",
    "rope_parameters": "object?",
    "rope_scaling": "object?",
    "bos_token_id": "int?",
    "pad_token_id": "int?",
    "eos_token_id": "ids?",
}

# The architectures of DFlash drafter folders (families/dflash), whose config.json names a
# decoder model_type (qwen3) too.
DRAFTERS = ("DFlashDraftModel", "DFlash2DraftModel", "DFlashSpeculator")

_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """Everything the decoder needs; field names follow Hugging Face's config.json."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    hidden_act: str = "silu"
    initializer_range: float = 0.02
    # Special token ids: carried from the source config.json to the exported one, so generation
    # knows where a sequence ends. eos may be several ids (a tuple here, a list in JSON).
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int | None = None

    def __post_init__(self) -> None:
        problems = []
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            problems.append(
                f"model_type {self.model_type!r} is not supported "
                f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
            )
        problems += decoder_shape_problems(self)
        if self.head_dim % 2:
            problems.append(f"head_dim must be even for RoPE (got {self.head_dim})")
        problems += rope_type_problems(self.rope_scaling, SUPPORTED_ROPE_TYPES)
        problems += rope_scaling_problems(self.rope_scaling)
        if self.hidden_act not in ACTIVATIONS:
            problems.append(
                f"hidden_act {self.hidden_act!r} is not supported "
                f"(supported: {', '.join(ACTIVATIONS)})"
            )
        raise_if_unusable(problems)

    # --- Hugging Face config.json ---------------------------------------------------------
    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any]) -> DecoderConfig:
        """Read a transformers config dict (4.x flat rope keys or 5.x `rope_parameters`)."""
        model_type = hf.get("model_type")
        if model_type is None:
            raise DllmError("config.json has no 'model_type'", hint="is this a decoder LM config?")
        architectures = hf.get("architectures")
        drafters = [
            a for a in (architectures if isinstance(architectures, list) else []) if a in DRAFTERS
        ]
        if drafters:  # its model_type says qwen3, but its weights are no decoder's
            raise FamilyMismatch(
                f"config.json is a DFlash drafter's (architectures {drafters}), not a "
                f"{model_type} model's: a decoder family does not train it",
                hint="set model.family to dflash, with model.dflash.target naming its target",
                model_type=model_type,
                readers=["dflash"],
            )
        if hf.get("use_sliding_window"):
            raise DllmError(
                "sliding-window attention is not supported",
                hint="set use_sliding_window: false in config.json",
            )
        no_attention_dropout(hf)
        problems = json_type_problems(hf, JSON_KINDS)
        if isinstance(hf.get("rope_parameters"), dict):
            problems += json_type_problems(
                hf["rope_parameters"], {"rope_theta": "real"}, prefix="rope_parameters."
            )
        raise_on_json_types(problems)
        with hf_config_errors(
            missing_hint="a Llama/Qwen2/Qwen3 config.json from Hugging Face has it"
        ):
            heads = int(hf["num_attention_heads"])
            hidden = int(hf["hidden_size"])
            rope = dict(hf.get("rope_parameters") or {})
            legacy_scaling = hf.get("rope_scaling")
            if legacy_scaling:
                rope.update(legacy_scaling)
                if "type" in legacy_scaling and "rope_type" not in legacy_scaling:
                    rope["rope_type"] = legacy_scaling["type"]
            rope_theta = float(rope.pop("rope_theta", hf.get("rope_theta", 10000.0)))
            rope.pop("type", None)
            max_positions = int(
                hf.get(
                    "max_position_embeddings",
                    key_default(str(model_type), "max_position_embeddings", 4096),
                )
            )
            scaling = rope if rope.get("rope_type", "default") != "default" else None
            attention_bias = bool(hf.get("attention_bias", False))
            act = str(hf.get("hidden_act") or hf.get("hidden_activation") or "silu")
            return cls(
                model_type=str(model_type),
                vocab_size=int(hf["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(hf["intermediate_size"]),
                num_hidden_layers=int(hf["num_hidden_layers"]),
                num_attention_heads=heads,
                num_key_value_heads=kv_heads_for(hf, str(model_type), heads),
                head_dim=head_dim_for(hf, str(model_type), hidden, heads),
                rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
                rope_theta=rope_theta,
                rope_scaling=with_original_length(scaling, max_positions),
                max_position_embeddings=max_positions,
                tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
                # Qwen2 always biases q/k/v (and never o); Llama/Qwen3 follow attention_bias.
                qkv_bias=True if model_type == "qwen2" else attention_bias,
                o_bias=False if model_type == "qwen2" else attention_bias,
                # Llama's MLP follows mlp_bias; Qwen2's and Qwen3's never have biases (their
                # transformers classes ignore the key)
                mlp_bias=model_type == "llama" and bool(hf.get("mlp_bias", False)),
                qk_norm=model_type == "qwen3",
                hidden_act=ACTIVATION_ALIASES.get(act, act),
                initializer_range=float(hf.get("initializer_range", 0.02)),
                bos_token_id=_token_ids(hf.get("bos_token_id")),
                eos_token_id=_token_ids(hf.get("eos_token_id"), several=True),
                pad_token_id=_token_ids(hf.get("pad_token_id")),
            )

    def to_hf_dict(self) -> dict[str, Any]:
        """A config.json that transformers loads into the matching *ForCausalLM."""
        rope: dict[str, Any] = {"rope_type": "default", "rope_theta": self.rope_theta}
        if self.rope_scaling:
            rope.update(self.rope_scaling)
            rope["rope_theta"] = self.rope_theta
        out: dict[str, Any] = {
            "architectures": [_ARCHITECTURES[self.model_type]],
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
            # Both spellings, so transformers 4.x and 5.x read the same RoPE.
            "rope_theta": self.rope_theta,
            "rope_scaling": dict(self.rope_scaling) if self.rope_scaling else None,
            "rope_parameters": rope,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "initializer_range": self.initializer_range,
            "attention_dropout": 0.0,
            "torch_dtype": "float32",
        }
        if self.model_type != "qwen2":
            out["attention_bias"] = self.qkv_bias
        if self.model_type == "llama":
            out["mlp_bias"] = self.mlp_bias
        if self.model_type in ("qwen2", "qwen3"):
            out["use_sliding_window"] = False
            out["sliding_window"] = None
        for name in ("bos_token_id", "eos_token_id", "pad_token_id"):  # written when known
            value = getattr(self, name)
            if value is not None:
                out[name] = list(value) if isinstance(value, tuple) else value
        return out

    # --- sizes ----------------------------------------------------------------------------
    @property
    def layer_matmul_params(self) -> int:
        """Weights one decoder layer multiplies each token by (norms and biases excluded)."""
        h, d = self.hidden_size, self.head_dim
        q = h * self.num_attention_heads * d
        kv = 2 * h * self.num_key_value_heads * d
        o = self.num_attention_heads * d * h
        mlp = 3 * h * self.intermediate_size
        return q + kv + o + mlp

    @property
    def body_matmul_params(self) -> int:
        return self.num_hidden_layers * self.layer_matmul_params

    @property
    def head_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def num_params(self) -> int:
        """Total parameters, counting a tied embedding once."""
        h = self.hidden_size
        per_layer = self.layer_matmul_params + 2 * h
        if self.qk_norm:
            per_layer += 2 * self.head_dim
        if self.qkv_bias:
            per_layer += (self.num_attention_heads + 2 * self.num_key_value_heads) * self.head_dim
        if self.o_bias:
            per_layer += h
        if self.mlp_bias:
            per_layer += 2 * self.intermediate_size + h
        embeddings = self.head_params * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * per_layer + embeddings + h

    def step_flops(
        self,
        *,
        stream_tokens: int,
        scored_tokens: int,
        pairs: int,
        last_layer: tuple[int, int] | None = None,
    ) -> float:
        """Model FLOPs of one forward+backward: 6 x matmul params per token, plus attention.

        `last_layer` (query tokens, pairs): the last layer computes its queries for fewer
        tokens (`train.attention.trim`): all but its key/value projections run on those only."""
        per_pair = 12.0 * self.head_dim * self.num_attention_heads
        body = 6.0 * self.body_matmul_params * stream_tokens
        head = 6.0 * self.head_params * scored_tokens
        attention = per_pair * self.num_hidden_layers * pairs
        if last_layer is not None:
            tokens, last_pairs = last_layer
            kv = 2 * self.hidden_size * self.num_key_value_heads * self.head_dim
            body -= 6.0 * (self.layer_matmul_params - kv) * (stream_tokens - tokens)
            attention -= per_pair * (pairs - last_pairs)
        return body + head + attention


def rope_type_problems(scaling: dict[str, Any] | None, supported: tuple[str, ...]) -> list[str]:
    """Why `scaling`'s rope_type is not one of `supported` (the family's), naming them; a type
    whose frequencies follow the sequence length at run time says so."""
    rope_type = (scaling or {}).get("rope_type", "default")
    if rope_type in supported:
        return []
    why = (
        ": its frequencies follow each sequence's length at run time, and a training step's "
        "packed stream is no one sequence"
        if rope_type in _RUNTIME_ROPE_TYPES
        else ""
    )
    return [f"rope type {rope_type!r} is not supported{why} (supported: {', '.join(supported)})"]


def with_original_length(scaling: dict[str, Any] | None, max_positions: int) -> dict | None:
    """`scaling` as transformers' config reads it: a llama3 or yarn RoPE without
    `original_max_position_embeddings` takes the config's `max_position_embeddings` (it warns;
    the published configs that leave the key out mean their own context length)."""
    if not scaling or scaling.get("rope_type") not in _ORIGINAL_LENGTH_TYPES:
        return scaling
    if "original_max_position_embeddings" in scaling:
        return scaling
    return {**scaling, "original_max_position_embeddings": max_positions}


def rope_scaling_problems(
    scaling: dict[str, Any] | None, keys: dict[str, tuple[str, ...]] = _ROPE_SCALING_KEYS
) -> list[str]:
    """Why a scaled RoPE (`keys`: the keys each type reads) cannot scale: a key it reads missing
    or not a positive number (a zero factor divides the frequencies by zero: the loss is NaN),
    or an optional key it reads (`_ROPE_OPTIONAL_KEYS`) of the wrong kind."""
    scaling = scaling or {}
    rope_type = scaling.get("rope_type", "default")
    names = keys.get(rope_type, ())
    missing = [n for n in names if n not in scaling]
    found = [f"rope_scaling lacks {n!r}" for n in missing]
    found += [
        f"rope_scaling.{p}"
        for p in number_problems(scaling, tuple(n for n in names if n not in missing))
    ]
    for name, kind in _ROPE_OPTIONAL_KEYS.get(rope_type, {}).items():
        value = scaling.get(name)
        if value is None:  # absent, or null (read as transformers reads it)
            continue
        if kind == "flag":
            if not isinstance(value, bool):
                found.append(f"rope_scaling.{name} must be true or false (got {value!r})")
        else:
            zero = kind == "number"
            found += [
                f"rope_scaling.{p}" for p in number_problems({name: value}, (name,), zero=zero)
            ]
    low, high = scaling.get("low_freq_factor"), scaling.get("high_freq_factor")
    if not found and low is not None and high is not None and low == high:
        found.append(f"rope_scaling.low_freq_factor and high_freq_factor must differ (both {low})")
    return found


def _token_ids(value: Any, *, several: bool = False) -> int | tuple[int, ...] | None:
    """A config.json token id (or, for eos, a list of them) as an int, a tuple or None."""
    if value is None:
        return None
    if several and isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value)
    return int(value)


def tensor_parallel_problems(config: DecoderConfig, tp: int) -> list[str]:
    """Why `config` cannot be split over `tp` ranks; empty when it can."""
    if tp <= 1:
        return []
    found = []
    for field in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        value = getattr(config, field)
        if value % tp:
            found.append(f"{field} = {value} is not divisible by topology.tp = {tp}")
    return found


def cut_layer_list(kinds: list[str], layers: int, *, rule: str | None = None) -> list[str]:
    """A per-layer `layer_types` for `layers` layers (`num_hidden_layers`, overridden or not):
    its first `layers` entries, the kinds of the model's first layers (a `model.path` folder's
    later layers are not read either), as every family reads a smaller layer count. A list
    with fewer entries describes no longer model: refused, naming what would (`rule`, a key
    giving the pattern by a period)."""
    if len(kinds) >= layers:
        return list(kinds[:layers])
    by_rule = f", or {rule}, which repeats a pattern" if rule else ""
    raise DllmError(
        f"layer_types has {len(kinds)} entries for {layers} layers (num_hidden_layers): a "
        "num_hidden_layers override keeps a model's first layers, and the config says nothing "
        "of the kinds of further ones",
        hint=f"give one layer_types entry per layer in a config.json (model.from_config){by_rule}",
    )
