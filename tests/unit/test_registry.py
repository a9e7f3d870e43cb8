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
        "topology.ep: ep is not supported here: expert parallelism needs a mixture-of-experts family"
    ]


def test_unknown_names_are_user_errors():
    with pytest.raises(DllmError, match="model family 'gpt' is not available"):
        registry.get_family("gpt")
    with pytest.raises(DllmError, match="objective 'mdm' is not available"):
        registry.get_objective("mdm")
