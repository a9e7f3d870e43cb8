"""Each family, trained a few steps and exported: the folder records what the run trained with
(the mask token the objective denoised from, the block size where the family's config holds
one) and nothing it did not."""

from __future__ import annotations

import copy
import json

import pytest

from tests.train.test_nemotron_diffusion import NEMOTRON
from tests.train.util import tiny_spec, two_step_run
from turbo_dllm.train.entry import train
from turbo_dllm.train.export import export_checkpoint

transformers = pytest.importorskip("transformers")

STEPS = ("training.steps=2", "checkpoint.interval=2", "checkpoint.keep_last=1")
QWEN38 = two_step_run(
    {
        "family": "qwen3_8",
        "from_config": "tiny",
        "config_overrides": {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 96},
    }
)
GEMMA = copy.deepcopy(QWEN38)
GEMMA["model"] = {"family": "diffusion_gemma", "from_config": "tiny"}


def exported(tmp_path, base, *overrides) -> dict:
    train(tiny_spec(*STEPS, *overrides, base=base), tmp_path / "run")
    out = export_checkpoint(tmp_path / "run/checkpoints", tmp_path / "hf")
    return json.loads((out / "config.json").read_text())


@pytest.mark.parametrize("objective", ["block_diffusion", "fast_dllm_v2"])
def test_qwen3_8_exports_synthetic_data_s_mask_token(tmp_path, objective):
    """The tiny preset has no mask token: the run masked with 511, the export named none."""
    config = exported(tmp_path, QWEN38, f"objective.name={objective}")
    assert config["mask_token_id"] == 511
    assert transformers.AutoConfig.from_pretrained(str(tmp_path / "hf")).mask_token_id == 511


def test_diffusion_gemma_exports_synthetic_data_s_mask_token_and_block_size(tmp_path):
    config = exported(tmp_path, GEMMA, "objective.block_size=8")
    assert config["text_config"]["mask_token_id"] == 511
    assert config["canvas_length"] == 8
    sft = exported(
        tmp_path / "sft", GEMMA, "objective.name=diffusiongemma_sft", "objective.block_size=16"
    )
    assert "mask_token_id" not in sft["text_config"] and "mask_token_id" not in sft
    assert sft["canvas_length"] == 16


def test_nemotron_from_a_config_without_block_size_or_mask_exports_the_run_s(tmp_path):
    """A config.json naming neither (a hand-written one: the published configs name both)
    trains at objective.block_size with the data's mask token; the export said block_size null,
    which the published code reads as no block size at all."""
    from turbo_dllm.families.nemotron_diffusion.config import PRESETS

    hf = {k: v for k, v in PRESETS["tiny"].items() if k not in ("block_size", "mask_token_id")}
    (tmp_path / "nemotron.json").write_text(json.dumps(hf))
    base = copy.deepcopy(NEMOTRON)
    base["model"]["from_config"] = str(tmp_path / "nemotron.json")
    del base["objective"]["mask_token_id"]
    config = exported(tmp_path, base)
    assert (config["block_size"], config["mask_token_id"]) == (8, 511)


def test_nemotron_keeps_its_own_block_size_and_mask_token(tmp_path):
    config = exported(tmp_path, NEMOTRON)
    assert (config["block_size"], config["mask_token_id"]) == (8, 100)
