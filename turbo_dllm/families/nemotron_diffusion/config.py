"""Nemotron-Labs-Diffusion's shape, read from (and written back to) its `config.json`.

Nemotron ships remote code only, so this reader follows the keys its published configs carry
(model_type `nemotron_labs_diffusion`, hidden_size, num_hidden_layers, num_attention_heads,
num_key_value_heads, head_dim or head_dimension, vocab_size, intermediate_size,
max_position_embeddings, block_size, dlm_paradigm, mask_token_id, attn_implementation,
use_cache) plus the attention variants, under names of our own since the reference names none:
`qk_norm` and `v_norm` (per-head RMSNorms on q/k and on v) and `attn_output_gate` (a sigmoid gate
per head on the attention output, from its own `self_attn.g_proj`). Everything else is the
decoder's (`families/decoder/config.py`), whose dataclass this one extends.

Torch-free.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from turbo_dllm.errors import DllmError
from turbo_dllm.families.base import (
    head_dim_for,
    hf_config_errors,
    json_type_problems,
    raise_if_unusable,
    raise_on_json_types,
)
from turbo_dllm.families.decoder.config import CONFIG_KEYS as DECODER_KEYS
from turbo_dllm.families.decoder.config import JSON_KINDS as DECODER_KINDS
from turbo_dllm.families.decoder.config import (
    SUPPORTED_ROPE_TYPES,
    DecoderConfig,
    rope_scaling_problems,
    rope_type_problems,
)

__all__ = ["CONFIG_KEYS", "MODEL_TYPES", "PARADIGMS", "PRESETS", "NemotronConfig"]

MODEL_TYPES = ("nemotron_labs_diffusion",)
# The checkpoint's attention mode: block_diff trains with the block-diffusion mask; bidirectional
# is the published inference default (the same weights). Training writes block_diff back.
PARADIGMS = ("block_diff", "bidirectional")
# config.json keys beyond a preset's that `model.config_overrides` may set (transformers has no
# config class for this remote-code model): the decoder's and the keys `from_hf_dict` reads.
CONFIG_KEYS = DECODER_KEYS | {
    "head_dimension",
    "block_size",
    "dlm_paradigm",
    "mask_token_id",
    "attn_implementation",
    "qk_norm",
    "v_norm",
    "attn_output_gate",
}

# The JSON type of each key `from_hf_dict` reads beyond the decoder's (`json_type_problems`).
JSON_KINDS = {
    **dict.fromkeys(("head_dimension", "block_size", "mask_token_id"), "int?"),
    **dict.fromkeys(("qk_norm", "v_norm", "attn_output_gate"), "flag"),
    "dlm_paradigm": "text",
}

_TINY = {
    "model_type": "nemotron_labs_diffusion",
    "architectures": ["NemotronLabsDiffusionModel"],
    "vocab_size": 512,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "max_position_embeddings": 4096,
    "block_size": 8,
    "dlm_paradigm": "block_diff",
    "mask_token_id": 100,
    "qk_norm": True,
    "v_norm": False,
    "attn_output_gate": True,
}
# The 3B layer shapes as its published config has them (RoPE left at the default type).
_3B = {
    **_TINY,
    "vocab_size": 131072,
    "hidden_size": 3072,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 16384,
    "block_size": 32,
    "qk_norm": False,
    "attn_output_gate": False,
}
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": _TINY,
    "nemotron-3b": _3B,
    "nemotron-3b-8l": {**_3B, "num_hidden_layers": 8},
}


@dataclasses.dataclass(frozen=True)
class NemotronConfig(DecoderConfig):
    """The decoder's fields plus Nemotron's attention variants and diffusion settings."""

    v_norm: bool = False
    attn_output_gate: bool = False
    block_size: int | None = None
    mask_token_id: int | None = None
    # The attention the published code builds (block_diff: training's; bidirectional: inference).
    # This model trains block diffusion whatever it says, so it is not part of the config's
    # identity: an export (bidirectional) reads back as the checkpoint's config (block_diff).
    dlm_paradigm: str = dataclasses.field(default="block_diff", compare=False)

    def __post_init__(self) -> None:
        self._as_decoder()  # the decoder's shape checks; then Nemotron's own
        problems = []
        if self.model_type not in MODEL_TYPES:
            problems.append(f"model_type {self.model_type!r} is not {MODEL_TYPES[0]!r}")
        if self.dlm_paradigm not in PARADIGMS:
            problems.append(
                f"dlm_paradigm {self.dlm_paradigm!r} is not one this version trains "
                f"({', '.join(PARADIGMS)})"
            )
        # YaRN's keys (decoder.model.rope_frequencies), which the decoder view leaves out.
        if self.is_yarn:
            problems += rope_scaling_problems(self.rope_scaling)
        if self.block_size is not None and self.block_size <= 0:
            problems.append(f"block_size must be positive (got {self.block_size})")
        if self.mask_token_id is not None and not 0 <= self.mask_token_id < self.vocab_size:
            problems.append(
                f"mask_token_id {self.mask_token_id} is outside the vocabulary ({self.vocab_size})"
            )
        raise_if_unusable(problems)

    @property
    def is_yarn(self) -> bool:
        return (self.rope_scaling or {}).get("rope_type") == "yarn"

    def _as_decoder(self) -> DecoderConfig:
        """The same shape as a Llama-typed decoder config (its checks and its writer); YaRN
        scaling, which the decoder does not have, is left out of that view."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(DecoderConfig)}
        if self.is_yarn:
            fields["rope_scaling"] = None
        return DecoderConfig(**{**fields, "model_type": "llama"})

    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any]) -> NemotronConfig:
        model_type = hf.get("model_type")
        if model_type not in MODEL_TYPES:
            raise DllmError(
                f"config.json is a {model_type!r} model, not {MODEL_TYPES[0]!r}",
                hint="set model.family to the family of that model",
            )
        # (rope_parameters / rope_scaling: checked below, with what this family reads there)
        kinds = {k: v for k, v in DECODER_KINDS.items() if not k.startswith("rope_")}
        raise_on_json_types(json_type_problems(hf, {**kinds, "rope_theta": "real", **JSON_KINDS}))
        rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
        if not isinstance(rope, dict):
            raise DllmError(
                f"config.json's rope_parameters / rope_scaling is not an object: {rope!r}",
                hint='write it as an object, e.g. {"rope_type": "default", "rope_theta": '
                "1000000.0}, or use the model's config.json as Hugging Face ships it",
            )
        rope = dict(rope)
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        unsupported = rope_type_problems({"rope_type": rope_type}, SUPPORTED_ROPE_TYPES)
        if unsupported:
            raise DllmError(
                f"nemotron_diffusion: {unsupported[0]}",
                hint="override rope_parameters in config.json with a supported type",
            )
        # (read as a llama's, but an absent max_position_embeddings keeps this family's 4096,
        # not LlamaConfig's 2048)
        decoder_view = {"max_position_embeddings": 4096, **hf, "model_type": "llama"}
        if rope_type == "yarn" or "llama_4_scaling_beta" in rope:  # read below, not by the decoder
            theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
            decoder_view.pop("rope_scaling", None)
            decoder_view["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
        if "head_dim" not in hf and "head_dimension" in hf:
            decoder_view["head_dim"] = hf["head_dimension"]
        elif hf.get("head_dim") is None:  # Ministral3Config's, not the decoder view's (llama)
            with hf_config_errors(missing_hint="a nemotron_diffusion config.json has it"):
                decoder_view["head_dim"] = head_dim_for(
                    hf, str(model_type), int(hf["hidden_size"]), int(hf["num_attention_heads"])
                )
        base = DecoderConfig.from_hf_dict(decoder_view)
        scaling = base.rope_scaling
        if rope_type == "yarn" or "llama_4_scaling_beta" in rope:
            scaling = {k: v for k, v in rope.items() if k not in ("rope_theta", "type")}
            scaling["rope_type"] = rope_type
        with hf_config_errors(missing_hint="a nemotron_diffusion config.json has it"):
            return cls(
                **{
                    f.name: getattr(base, f.name)
                    for f in dataclasses.fields(DecoderConfig)
                    if f.name not in ("model_type", "qk_norm", "rope_scaling")
                },
                model_type=str(model_type),
                rope_scaling=scaling,
                qk_norm=bool(hf.get("qk_norm", False)),
                v_norm=bool(hf.get("v_norm", False)),
                attn_output_gate=bool(hf.get("attn_output_gate", False)),
                block_size=None if hf.get("block_size") is None else int(hf["block_size"]),
                mask_token_id=None if hf.get("mask_token_id") is None else int(hf["mask_token_id"]),
                dlm_paradigm=str(hf.get("dlm_paradigm", "block_diff")),
            )

    def to_hf_dict(self) -> dict[str, Any]:
        out = {
            key: value
            for key, value in self._as_decoder().to_hf_dict().items()
            if key not in ("use_sliding_window", "sliding_window")
        }
        if self.rope_scaling:  # YaRN and llama-4 scaling keys, which the decoder view drops
            rope = {**self.rope_scaling, "rope_theta": self.rope_theta}
            out.update(rope_parameters=rope, rope_scaling=dict(self.rope_scaling))
        out.update(
            architectures=["NemotronLabsDiffusionModel"],
            model_type=self.model_type,
            mlp_bias=self.mlp_bias,
            qk_norm=self.qk_norm,
            v_norm=self.v_norm,
            attn_output_gate=self.attn_output_gate,
            block_size=self.block_size,
            mask_token_id=self.mask_token_id,
            dlm_paradigm="block_diff",  # what it was trained as
            use_cache=False,
        )
        return out

    @property
    def layer_matmul_params(self) -> int:
        gate = self.hidden_size * self.num_attention_heads if self.attn_output_gate else 0
        return super().layer_matmul_params + gate

    def num_params(self) -> int:
        # The gate's weights are in layer_matmul_params already; v_norm adds a head_dim weight.
        return super().num_params() + self.num_hidden_layers * self.head_dim * self.v_norm
