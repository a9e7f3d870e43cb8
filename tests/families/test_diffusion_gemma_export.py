"""What a diffusion_gemma export records of the run: the mask token block_diffusion denoised
from, and the block size it trained on as `canvas_length` (transformers' DiffusionGemma
generates canvases of `canvas_length` tokens)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from tests.data.helpers import prepare_config, write_jsonl
from tests.data.helpers import write_config as write_prepare_config
from tests.train.util import tiny_spec, two_step_run
from turbo_dllm.families.diffusion_gemma.config import PRESETS, DiffusionGemmaConfig
from turbo_dllm.train.entry import train
from turbo_dllm.train.export import export_checkpoint

transformers = pytest.importorskip("transformers")

RUN = two_step_run({"family": "diffusion_gemma", "from_config": "tiny"})


def exported(tmp_path, *overrides: str) -> tuple[Path, dict]:
    train(tiny_spec(*overrides, base=copy.deepcopy(RUN)), tmp_path / "run")
    out = export_checkpoint(tmp_path / "run/checkpoints", tmp_path / "hf")
    return out, json.loads((out / "config.json").read_text())


@pytest.fixture(scope="module")
def module_home(tmp_path_factory):
    """DLLM_HOME for this module's shared runs (set up before each test's own home)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DLLM_HOME", str(tmp_path_factory.mktemp("home")))
        yield


@pytest.fixture(scope="module")
def mask_500(tmp_path_factory, module_home):
    """The preset trained on synthetic data with mask token 500, exported: read (never written)
    by three tests, so trained once."""
    return exported(tmp_path_factory.mktemp("mask-500"), "objective.mask_token_id=500")


@pytest.fixture(scope="module")
def artifact(tmp_path_factory, module_home):
    """A byte-level artifact (seq_len 32, block 8) of a short text."""
    root = tmp_path_factory.mktemp("artifact")
    write_jsonl(root / "data/data.jsonl", [{"text": "the fox runs over a dog " * 8}] * 20)
    prepare_config(
        write_prepare_config(
            root / "data", packing={"seq_len": 32, "block_size": 8, "overflow": "truncate"}
        )
    )
    return root / "data/out"


@pytest.fixture(scope="module")
def on_artifact(tmp_path_factory, artifact):
    """The preset trained (block_diffusion) on `artifact`, exported: read by two tests."""
    overrides = ("data.synthetic=null", f"data.artifact={artifact}")
    return exported(tmp_path_factory.mktemp("on-artifact"), *overrides)


def test_block_diffusion_records_the_mask_token_where_both_readers_find_it(mask_500):
    """The family's config has a mask_token_id field (None for a preset): the export skipped
    recording the run's, so the folder did not say which token it denoises from."""
    out, config = mask_500
    assert config["text_config"]["mask_token_id"] == 500  # where the family writes its own
    assert DiffusionGemmaConfig.from_hf_dict(config).mask_token_id == 500  # our loader
    hf_config = transformers.AutoConfig.from_pretrained(str(out))
    assert hf_config.text_config.mask_token_id == 500
    hf = transformers.DiffusionGemmaForBlockDiffusion.from_pretrained(str(out))
    assert hf.config.text_config.mask_token_id == 500


def test_the_artifact_s_mask_token_is_recorded_and_sft_records_none(
    tmp_path, artifact, on_artifact
):
    """Without objective.mask_token_id block_diffusion masks with the artifact's mask token
    (byte-level: 259); diffusiongemma_sft noises with random ids and masks nothing, so its
    export names no mask token."""
    _, config = on_artifact
    assert config["text_config"]["mask_token_id"] == 259
    _, config = exported(
        tmp_path / "sft",
        "data.synthetic=null",
        f"data.artifact={artifact}",
        "objective.name=diffusiongemma_sft",
        "objective.block_size=16",
    )
    assert "mask_token_id" not in config["text_config"] and "mask_token_id" not in config


def test_a_preset_exports_the_block_size_it_trained_on_as_canvas_length(mask_500):
    """The tiny preset says canvas_length 16 (a placeholder: runs choose the block size); a run
    at block size 8 exported canvas_length 16, and transformers generated 16-token canvases
    with a model trained on 8-token blocks."""
    assert PRESETS["tiny"]["canvas_length"] == 16
    out, config = mask_500
    assert config["canvas_length"] == 8
    assert DiffusionGemmaConfig.from_hf_dict(config).canvas_length == 8
    hf = transformers.DiffusionGemmaForBlockDiffusion.from_pretrained(str(out)).eval()
    assert hf.config.canvas_length == 8
    torch.manual_seed(0)
    prompt = torch.randint(3, 500, (1, 5))
    generated = hf.generate(prompt, max_new_tokens=8)
    assert generated.sequences.shape[1] == 5 + 8  # one canvas of the trained block size


RECIPES = Path(__file__).parents[2] / "turbo_dllm/config/recipes"


@pytest.mark.parametrize(
    "recipe",
    sorted(
        str(p.relative_to(RECIPES))
        for p in RECIPES.rglob("*.yaml")
        if (yaml.safe_load(p.read_text()).get("model") or {}).get("family") == "diffusion_gemma"
    ),
)
def test_every_diffusion_gemma_recipe_exports_its_block_size(recipe):
    """The h200-bench recipes train at block 256 on a preset whose canvas_length is 16: their
    exports said 16. Checked on the config the export writes (the model is too large to train
    here): the recipe's block size, whatever the preset's placeholder."""
    from turbo_dllm.train.export import _as_trained

    document = yaml.safe_load((RECIPES / recipe).read_text())
    preset = PRESETS[document["model"]["from_config"]]
    block = document["objective"]["block_size"]
    meta = SimpleNamespace(
        objective=document["objective"]["name"],
        settings={"objective.block_size": block, "objective.mask_token_id": None},
        mask_token_id=None,
        data_artifact=None,
        data_fingerprint=None,
        model_path=None,
    )
    config = _as_trained(meta, DiffusionGemmaConfig.from_hf_dict(preset))
    assert config.to_hf_dict()["canvas_length"] == block
    assert (
        config.to_hf_dict()["text_config"]
        == DiffusionGemmaConfig.from_hf_dict(preset).to_hf_dict()["text_config"]
    )  # nothing else changes (sft: no mask token)


def test_a_preset_trained_on_an_artifact_exports_the_artifact_s_token_ids(on_artifact):
    """DiffusionGemma keeps its token ids in text_config, where its reader fills Gemma's (pad 0,
    eos 1, bos 2) for a preset, which has none. A preset trained on an artifact exported those
    beside the artifact's tokenizer: the artifact's ids went to the root of config.json, which
    transformers' DiffusionGemma does not read, so its embedding took byte 0 as padding_idx
    and its text config named byte 1 as eos. The export now writes the artifact's ids where
    both readers find them, and generation_config.json from them."""
    out, config = on_artifact
    byte_level = {"bos_token_id": 256, "eos_token_id": 257, "pad_token_id": 258}
    assert {k: config["text_config"][k] for k in byte_level} == byte_level
    assert not set(byte_level) & set(config)  # not at the root, which nothing reads
    generation = json.loads((out / "generation_config.json").read_text())
    assert {k: generation[k] for k in byte_level} == byte_level
    read = DiffusionGemmaConfig.from_hf_dict(config)
    assert (read.bos_token_id, read.eos_token_id, read.pad_token_id) == (256, 257, 258)
    hf = transformers.DiffusionGemmaForBlockDiffusion.from_pretrained(str(out))
    assert hf.config.text_config.eos_token_id == 257
    assert hf.generation_config.eos_token_id == 257
    assert hf.model.decoder.embed_tokens.padding_idx == 258


def test_a_preset_on_synthetic_data_exports_no_invented_generation_config(mask_500):
    """Synthetic data has no tokenizer: the preset's filled-in Gemma ids are no eos to stop at."""
    out, _ = mask_500
    assert not (out / "generation_config.json").exists()
