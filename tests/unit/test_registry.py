"""The family registry drives the schema and validation: what it lists is what a RunSpec may ask."""

from __future__ import annotations

import json

import pytest

from turbo_dllm import registry
from turbo_dllm.config.load import load_model
from turbo_dllm.config.runspec import RunSpec
from turbo_dllm.config.validate import problems
from turbo_dllm.errors import DllmError


def spec(**sections) -> RunSpec:
    return load_model(RunSpec, sections, "test")


def test_schema_offers_exactly_the_registered_families_and_objectives():
    schema = RunSpec.model_json_schema()["$defs"]
    assert schema["ModelSpec"]["properties"]["family"]["enum"] == list(registry.FAMILIES)
    assert schema["ObjectiveSpec"]["properties"]["name"]["enum"] == list(registry.OBJECTIVES)
    for family in registry.FAMILIES.values():
        assert set(family.objectives) <= set(registry.OBJECTIVES), family.name
        assert family.axes <= set(registry.AXES), family.name


def test_every_family_runtime_has_the_runtime_functions():
    for family in registry.FAMILIES.values():
        runtime = family.runtime()
        for name in ("build_model", "layers", "apply_tensor_parallel", "check_tensor_parallel"):
            assert callable(getattr(runtime, name)), (family.name, name)


def test_every_family_preset_reads_into_a_config_that_keeps_the_contract():
    """What the trainer, doctor and export read from a family's config (`FamilyConfig`):
    `resolve_model_config` refuses a reader's value without it, naming the family."""
    from types import SimpleNamespace

    for family in registry.FAMILIES.values():
        if family.configure is not None:  # (dflash: its config comes from two folders)
            continue
        for preset in family.presets:
            model = SimpleNamespace(
                family=family.name, path=None, from_config=preset, config_overrides={}
            )
            config = registry.resolve_model_config(model)
            assert config.to_hf_dict()["model_type"] in family.model_types, (family.name, preset)


def test_a_folder_of_another_model_type_is_refused_at_validation(tmp_path):
    """A Llama folder under `family: qwen3` trained silently before; now validation says so."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 8}))
    found = problems(spec(model={"family": "qwen3", "path": str(tmp_path), "from_config": None}))
    messages = [str(p) for p in found if p.path == "model.family"]
    assert messages and "'llama' model" in messages[0] and "causal_lm" in messages[0]
    ok = problems(spec(model={"family": "causal_lm", "path": str(tmp_path), "from_config": None}))
    assert not [p for p in ok if p.path == "model.family"]


def test_an_axis_the_family_lacks_is_refused_with_its_reason():
    found = problems(spec(topology={"ep": 2}))
    assert [str(p) for p in found if p.path == "topology.ep"] == [
        "topology.ep: ep is not supported here: expert parallelism needs a mixture-of-experts "
        "family; set topology.ep: 1 (model families with ep: diffusion_gemma)"
    ]


def test_unknown_names_are_user_errors():
    with pytest.raises(DllmError, match="model family 'gpt' is not available"):
        registry.get_family("gpt")
    with pytest.raises(DllmError, match="objective 'mdm' is not available"):
        registry.get_objective("mdm")


def test_config_overrides_reach_a_nested_text_config_and_rope_parameters(tmp_path):
    """Overrides of DiffusionGemma's text keys, and of a RoPE key rope_parameters also holds,
    were written where the reader never looked: the model trained at the unchanged shape."""
    dg = registry.get_family("diffusion_gemma").resolve_config(
        path=None,
        from_config="tiny",
        overrides={"hidden_size": 32, "num_experts": 2, "canvas_length": 8},
    )
    assert (dg.hidden_size, dg.num_experts, dg.canvas_length) == (32, 2, 8)
    assert "hidden_size" not in dg.to_hf_dict()  # not left at the root of an export either
    qwen = registry.get_family("qwen3_8")
    tiny = qwen.resolve_config(
        path=None, from_config="tiny", overrides={"partial_rotary_factor": 0.5}
    )
    assert tiny.partial_rotary_factor == 0.5
    text = {**qwen.presets["tiny"], "rope_parameters": {"rope_type": "default", "rope_theta": 1.0}}
    multimodal = {"model_type": "qwen3_5", "text_config": text, "tie_word_embeddings": True}
    (tmp_path / "config.json").write_text(json.dumps(multimodal))
    folder = qwen.resolve_config(
        path=str(tmp_path),
        from_config=None,
        overrides={"rope_theta": 500.0, "num_hidden_layers": 2, "tie_word_embeddings": False},
    )
    assert (folder.rope_theta, folder.num_hidden_layers) == (500.0, 2)
    assert folder.tie_word_embeddings is False


def test_a_runtime_module_that_is_not_there_is_a_user_error():
    """A misspelt `runtime_module` (or a family package not installed) was a
    ModuleNotFoundError traceback from `dllm train`, after validation and doctor passed."""
    import dataclasses

    family = dataclasses.replace(
        registry.get_family("qwen3"), runtime_module="turbo_dllm.families.decoder.runtim"
    )
    with pytest.raises(DllmError, match="'turbo_dllm.families.decoder.runtim' cannot be imp"):
        family.runtime()
    gone = dataclasses.replace(family, runtime_module="toy_family_not_installed.runtime")
    with pytest.raises(DllmError, match="no module named 'toy_family_not_installed'"):
        gone.runtime()
