"""benchmarks/train_step.py --family runs each new family against its baseline (CPU smoke)."""

from __future__ import annotations

import json

import pytest

from tests.helpers import benchmark_module


@pytest.mark.parametrize(
    "family,names",
    [
        ("qwen3_8", ["turbo-dllm", "hf-qwen3_5-sdpa"]),
        ("nemotron_diffusion", ["turbo-dllm", "turbo-dllm decoder (same shapes)"]),
    ],
)
def test_train_step_benchmark_runs_each_family(tmp_path, family, names):
    train_step = benchmark_module("train_step")
    out = tmp_path / "bench.json"
    argv = ["--tiny", "--family", family, "--seq-len", "32", "--block-size", "8"]
    assert train_step.main(argv + ["--steps", "1", "--warmup", "0", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["family"] == family
    assert [r["name"] for r in report["results"]] == names
    assert all(r["tokens_per_s"] > 0 for r in report["results"]) and report["speedup"] > 0


@pytest.mark.parametrize(
    "name",
    [
        "smoke/cpu-tiny-qwen3.8",
        "smoke/cpu-tiny-nemotron",
        "h200/fast-dllm-v2-qwen3.8",
        "2xh200/block-diffusion-nemotron-3b-tp2",
    ],
)
def test_family_recipes_parse_and_smoke_recipes_validate(name, tmp_path):
    import yaml

    from turbo_dllm.config.recipe_catalog import find_recipe
    from turbo_dllm.config.runspec import RunSpec
    from turbo_dllm.config.validate import check

    spec = RunSpec.model_validate(yaml.safe_load(find_recipe(name).text))
    if name.startswith("smoke/"):  # the others name local folders that do not exist here
        check(spec)


def test_nemotron_decoder_twin_trains_the_nemotron_runs_data(tmp_path):
    """At the GPU presets the decoder twin must take the Nemotron run's data (vocabulary
    131,072), not the default decoder's (151,936): validation refused the twin on the H200."""
    train_step = benchmark_module("train_step")
    from turbo_dllm.registry import resolve_model_config

    args = train_step.parse_args(["--family", "nemotron_diffusion"])  # the H200 shapes
    spec = train_step.build_spec(args, on_gpu=False)
    nemotron = resolve_model_config(spec.model)
    twin = train_step.decoder_twin_spec(nemotron, spec, args, False, tmp_path)
    assert twin.model.family == "causal_lm"
    assert twin.data == spec.data and twin.objective == spec.objective
    assert spec.data.synthetic.vocab_size == nemotron.vocab_size == 131072
