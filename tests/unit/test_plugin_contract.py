"""What a family plugin that breaks the family contract gets told (found by the family-plugin
docs-as-an-outside-developer audit).

Each plugin is a distribution made by hand in tmp_path (a `.dist-info` folder with its entry
points beside the package), put on sys.path: importlib.metadata finds it as pip would have
installed it, and `plugins.load_plugins` loads it in this process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from turbo_dllm import plugins, registry
from turbo_dllm.errors import DllmError


def _distribution(site: Path, name: str, points: str, files: dict[str, str]) -> Path:
    """A distribution `name` 0.4 under `site`: its package (the files) and its entry points."""
    package = name.replace("-", "_")
    info = site / f"{package}-0.4.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.4\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(points))  # (INI, as pip writes it)
    (site / package).mkdir()
    for file, text in files.items():
        (site / package / file).write_text(textwrap.dedent(text))
    return site


def _load(monkeypatch, site: Path) -> plugins.Plugins:
    monkeypatch.syspath_prepend(str(site))
    return plugins.load_plugins(registry.BUILTIN_FAMILIES, registry.BUILTIN_OBJECTIVES)


# A runtime module that has build_model and the tensor-parallel pair, but no `layers`.
_LACKING = {
    "__init__.py": """\
        from dataclasses import replace

        from turbo_dllm.families.decoder import QWEN3

        LACKING = replace(QWEN3, name="lacking", runtime_module="lacking_plugin.runtime")
        """,
    "runtime.py": """\
        def build_model(config, backend, dtype=None):
            raise AssertionError("not called")


        def check_tensor_parallel(config, tp):
            pass


        def apply_tensor_parallel(model, tp_mesh, *, sequence_parallel=False):
            pass
        """,
}


def test_a_runtime_without_a_contract_function_is_refused_naming_it_and_the_plugin(
    tmp_path, monkeypatch
):
    """A plugin runtime without `layers` was an AttributeError traceback from `dllm train`
    (`module 'lacking_plugin.runtime' has no attribute 'layers'`), after validation and doctor
    had passed, naming neither the family nor the package."""
    site = _distribution(
        tmp_path / "site",
        "lacking-plugin",
        "[turbo_dllm.families]\nlacking = lacking_plugin:LACKING\n",
        _LACKING,
    )
    found = _load(monkeypatch, site)
    family = found.families["lacking"]
    with pytest.raises(DllmError) as error:
        family.runtime()
    message = str(error.value.message)
    assert "model family 'lacking' (from plugin lacking-plugin 0.4)" in message
    assert "'lacking_plugin.runtime' has no layers" in message
    assert "check_tensor_parallel" in error.value.hint


_WRONG_TYPES = {
    "__init__.py": """\
        from dataclasses import replace

        from turbo_dllm.families.base import Objective
        from turbo_dllm.families.decoder import QWEN3

        ONE_TYPE = replace(QWEN3, name="one_type", model_types="qwen3")
        ONE_OBJECTIVE = replace(QWEN3, name="one_objective", objectives="block_diffusion")
        NO_READER = replace(QWEN3, name="no_reader", read_config="my_plugin.config:read")
        BAD_OBJECTIVE = Objective("bad_objective", "x", "wrong_types_plugin", stream_block_size=0)
        FINE = replace(QWEN3, name="fine", axes=["fsdp"])
        """,
}


def test_descriptor_fields_of_the_wrong_type_are_left_out_with_the_field_named(
    tmp_path, monkeypatch
):
    """`model_types="qwen3"` (a str, not a tuple) loaded, and then read any model whose type is
    a part of "qwen3"; `objectives="block_diffusion"` was left out as naming the objectives
    ['b', 'l', 'o', ...]; a read_config that is not a function loaded and failed in validation
    with a TypeError traceback."""
    site = _distribution(
        tmp_path / "site",
        "wrong-types-plugin",
        """\
        [turbo_dllm.families]
        one_type = wrong_types_plugin:ONE_TYPE
        one_objective = wrong_types_plugin:ONE_OBJECTIVE
        no_reader = wrong_types_plugin:NO_READER
        fine = wrong_types_plugin:FINE

        [turbo_dllm.objectives]
        bad_objective = wrong_types_plugin:BAD_OBJECTIVE
        """,
        _WRONG_TYPES,
    )
    found = _load(monkeypatch, site)
    problems = found.problems["family"]
    assert set(problems) == {"one_type", "one_objective", "no_reader"}
    assert "wrong-types-plugin 0.4 (wrong_types_plugin:ONE_TYPE)" in problems["one_type"]
    assert "model_types is str 'qwen3', not a tuple of str" in problems["one_type"]
    assert "objectives is str 'block_diffusion', not a tuple of str" in problems["one_objective"]
    assert "'b'" not in problems["one_objective"]
    assert "read_config is str" in problems["no_reader"]
    assert "not a function" in problems["no_reader"]
    assert "stream_block_size is int 0" in found.problems["objective"]["bad_objective"]
    assert set(found.families) == {"fine"}  # any collection of axis names will do


_OBJECTIVE_LEFT_OUT = {
    "__init__.py": "",
    "family.py": """\
        from dataclasses import replace

        from turbo_dllm.families.decoder import QWEN3

        USER = replace(QWEN3, name="user", objectives=("broken_objective",))
        """,
    "objective.py": """\
        import a_module_that_is_not_installed
        """,
}


def test_a_family_whose_objective_s_plugin_failed_says_so(tmp_path, monkeypatch):
    """A family naming an objective whose own plugin failed to import was left out as naming
    objectives 'not defined by turbo-dllm or any plugin': the plugin does define it; the
    reason to fix is the objective's import."""
    site = _distribution(
        tmp_path / "site",
        "objective-left-out",
        """\
        [turbo_dllm.families]
        user = objective_left_out.family:USER

        [turbo_dllm.objectives]
        broken_objective = objective_left_out.objective:OBJECTIVE
        """,
        _OBJECTIVE_LEFT_OUT,
    )
    found = _load(monkeypatch, site)
    why = found.problems["family"]["user"]
    assert "not defined by turbo-dllm or any plugin" not in why
    assert "its objective 'broken_objective' could not be loaded from its plugin" in why
    assert "No module named 'a_module_that_is_not_installed'" in why


def test_a_reader_that_returns_no_family_config_is_refused_naming_the_family(monkeypatch):
    """A read_config returning a plain dict passed `dllm config validate`, and `dllm doctor
    --config` and `dllm train` then stopped with `AttributeError: 'dict' object has no attribute
    'vocab_size'` tracebacks."""
    from dataclasses import replace

    family = replace(registry.get_family("qwen3"), name="dict_config", read_config=dict)
    monkeypatch.setitem(registry.FAMILIES, "dict_config", family)  # type: ignore[index]
    monkeypatch.setitem(
        registry.PLUGINS.sources, ("family", "dict_config"), "dict-plugin 0.4 (dict_plugin:F)"
    )
    model = SimpleNamespace(
        family="dict_config", path=None, from_config="tiny", config_overrides={}
    )
    with pytest.raises(DllmError) as error:
        registry.resolve_model_config(model)
    message = error.value.message
    assert "model family 'dict_config' (plugin dict-plugin 0.4 (dict_plugin:F))" in message
    assert "its read_config returned a dict without model_type" in message
    assert "to_hf_dict" in message and "to_hf_dict()" in error.value.hint


def test_a_runspec_naming_a_broken_plugin_is_told_how_to_fix_it(monkeypatch):
    """Validation said why the plugin was left out, with the hint "`dllm config schema` lists
    every field and its type", which fixes nothing; it now says what to do."""
    from turbo_dllm.config.load import load_model
    from turbo_dllm.config.runspec import RunSpec

    broken = plugins.Plugins()
    broken.problems["family"]["gone"] = "gone-plugin 0.4 (gone:F): importing it failed: boom"
    monkeypatch.setattr(registry, "PLUGINS", broken)
    with pytest.raises(DllmError) as error:
        load_model(RunSpec, {"model": {"family": "gone"}}, "train.yaml")
    message = error.value.message
    assert "family 'gone' could not be loaded from its plugin" in message
    assert "importing it failed: boom" in message
    assert "to fix: fix or reinstall the package that declares it" in message
    with pytest.raises(DllmError) as direct:
        registry.get_family("gone")
    assert "to fix" not in direct.value.message  # there the fix is the hint
    assert direct.value.hint == registry.PLUGIN_FIX


def _plain_reader(hf):
    return SimpleNamespace(**hf)


def test_attention_dropout_is_refused_in_a_family_whose_reader_does_not_check_it(tmp_path):
    """docs/training.md: "attention_dropout is refused in every family"; a plugin family whose
    reader did not call `base.no_attention_dropout` trained a config.json asking for 0.1
    without dropout, silently. Every family's `resolve_config` refuses it now."""
    from turbo_dllm.families.base import Family

    family = Family(
        name="plain",
        summary="a reader that reads anything",
        model_types=("plain",),
        objectives=("block_diffusion",),
        axes=frozenset(),
        presets={},
        read_config=_plain_reader,
        runtime_module="plain.runtime",
    )
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps({"model_type": "plain", "vocab_size": 8, "attention_dropout": 0.1})
    )
    with pytest.raises(DllmError, match="attention_dropout 0.1 is not supported"):
        family.resolve_config(path=str(folder), from_config=None)
    config = family.resolve_config(
        path=str(folder), from_config=None, overrides={"attention_dropout": 0.0}
    )
    assert config.attention_dropout == 0.0


def test_dllm_config_validate_reports_a_reader_of_the_wrong_type_at_its_field(tmp_path):
    """End to end, as a user runs it: the plugin's family is in the schema, and validation
    reports its reader's wrong return at model.from_config instead of passing."""
    site = _distribution(
        tmp_path / "site",
        "dict-reader",
        "[turbo_dllm.families]\ndict_reader = dict_reader:F\n",
        {
            "__init__.py": """\
                from dataclasses import replace

                from turbo_dllm.families.decoder import QWEN3

                F = replace(QWEN3, name="dict_reader", read_config=dict)
                """
        },
    )
    spec = tmp_path / "train.yaml"
    spec.write_text(
        "model: {family: dict_reader, from_config: tiny}\n"
        "data: {synthetic: {vocab_size: 64}, seq_len: 64}\n"
        "objective: {name: block_diffusion, block_size: 16}\n"
    )
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-m", "turbo_dllm", "config", "validate", "--config", str(spec)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(repo)])},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "model.from_config: model family 'dict_reader' (plugin dict-reader 0.4" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("signature", "passed"),
    [
        ("spec, mask_token_id", None),  # the contract before vocab_size: called without it
        ("spec, mask_token_id, vocab_size=None", 50),
        ("spec, mask_token_id, **options", 50),
    ],
)
def test_an_objective_build_gets_vocab_size_only_where_it_takes_it(
    tmp_path, monkeypatch, signature, passed
):
    """Objective.build always passed vocab_size=, so a plugin objective written to the
    documented two-argument build(spec, mask_token_id) failed with a TypeError at its first
    run (found by the architecture audit)."""
    from turbo_dllm.families.base import Objective

    name = f"objective_plugin_{len(signature)}"
    (tmp_path / f"{name}.py").write_text(
        f"def build({signature}):\n"
        "    return spec, mask_token_id, locals().get('vocab_size', "
        "locals().get('options', {}).get('vocab_size'))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    objective = Objective("plugged", "an objective from a plugin", name)
    assert objective.build("spec", 7, vocab_size=50) == ("spec", 7, passed)
