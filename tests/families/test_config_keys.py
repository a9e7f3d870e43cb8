"""The config.json keys each family lets `model.config_overrides` set include every field of
its transformers config classes (a key a newer transformers adds shows up here first)."""

from __future__ import annotations

import inspect

import pytest

from turbo_dllm import registry
from turbo_dllm.families.base import HF_COMMON_KEYS

transformers = pytest.importorskip("transformers")
from transformers.models.auto.configuration_auto import CONFIG_MAPPING  # noqa: E402

# The transformers config classes (by model_type) whose fields each family accepts.
HF_TYPES = {
    "causal_lm": ("llama", "qwen2", "qwen3"),
    "qwen3": ("qwen3",),
    "qwen3_8": ("qwen3_5", "qwen3_5_text"),
    "diffusion_gemma": ("diffusion_gemma", "diffusion_gemma_text"),
}


def hf_fields(model_type: str) -> set[str]:
    cls = CONFIG_MAPPING[model_type]
    names = set(inspect.signature(cls.__init__).parameters) - {"self", "kwargs"}
    names |= {n for n in vars(cls).get("__annotations__", {}) if not n.startswith("_")}
    names |= set(cls.attribute_map)
    return names


@pytest.mark.parametrize("family", sorted(HF_TYPES))
def test_every_transformers_config_field_is_an_override_key(family):
    known = registry.FAMILIES[family].config_keys | HF_COMMON_KEYS
    for model_type in HF_TYPES[family]:
        missing = sorted(hf_fields(model_type) - known - {"base_config_key", "sub_configs"})
        assert not missing, (model_type, missing)


def test_every_family_that_reads_a_config_json_lists_its_keys():
    for family in registry.FAMILIES.values():
        if family.configure is None:  # dflash refuses config_overrides altogether
            assert family.config_keys, family.name


@pytest.mark.parametrize(
    "family",
    [name for name in registry.FAMILIES if name != "dflash"],  # (a drafter's own format)
)
def test_a_config_asking_for_attention_dropout_is_refused(family, tmp_path):
    """transformers applies attention_dropout while training; our attention applies none, so a
    config.json asking for it trained another model, silently. 0.0 (the override's way out) reads.
    Read as a RunSpec's model.path folder is (`resolve_config`), so a plugin family whose reader
    leaves the key alone is held to it too (its `tiny` preset, else its first)."""
    import copy
    import json

    from turbo_dllm.errors import DllmError

    presets = registry.FAMILIES[family].presets
    if not presets:
        pytest.skip(f"family {family!r} has no preset to start from")
    hf = copy.deepcopy(presets.get("tiny") or next(iter(presets.values())))
    text = hf["text_config"] if isinstance(hf.get("text_config"), dict) else hf
    text["attention_dropout"] = 0.1
    (tmp_path / "config.json").write_text(json.dumps(hf))
    resolve = registry.FAMILIES[family].resolve_config
    with pytest.raises(DllmError, match="attention_dropout 0.1 is not supported") as error:
        resolve(path=str(tmp_path), from_config=None)
    assert "model.config_overrides.attention_dropout: 0.0" in error.value.hint
    resolve(path=str(tmp_path), from_config=None, overrides={"attention_dropout": 0.0})
