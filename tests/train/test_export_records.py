"""What an export says about the run: the mask token the objective denoised from, exactly as
trained, and none where the objective masked nothing.

Synthetic data (the quick start's default when no artifact is prepared) masks with its
vocabulary's last id unless `objective.mask_token_id` is set: that default was in no record, so
the export named no mask token. An `autoregressive` decoder run masks nothing, yet its export
claimed the data's mask token.
"""

from __future__ import annotations

import copy
import json
import shutil

import pytest
import torch

from tests.data.helpers import prepare_config, write_jsonl
from tests.data.helpers import write_config as write_prepare_config
from tests.train.test_export_generation import WORDS
from tests.train.test_export_nemotron import ours_causal
from tests.train.util import TINY, tiny_spec
from turbo_dllm.train.checkpoint import read_meta, resolve_checkpoint
from turbo_dllm.train.entry import train
from turbo_dllm.train.export import export_checkpoint

transformers = pytest.importorskip("transformers")

STEPS = ("training.steps=2", "checkpoint.interval=2")


def exported(tmp_path, *overrides, base=None) -> tuple:
    train(tiny_spec(*STEPS, *overrides, base=base), tmp_path / "run")
    out = export_checkpoint(tmp_path / "run/checkpoints", tmp_path / "hf")
    return out, json.loads((out / "config.json").read_text())


@pytest.mark.parametrize("objective", ["block_diffusion", "fast_dllm_v2"])
def test_synthetic_data_s_default_mask_token_is_recorded_and_exported(tmp_path, objective):
    """vocab_size 512 and no objective.mask_token_id: the run masked with id 511, and the
    export said nothing about it."""
    out, config = exported(tmp_path, f"objective.name={objective}")
    meta = read_meta(resolve_checkpoint(tmp_path / "run/checkpoints"))
    assert meta.mask_token_id == 511
    assert config["mask_token_id"] == 511
    assert transformers.AutoConfig.from_pretrained(str(out)).mask_token_id == 511


def byte_level_artifact(tmp_path):
    """A prepared byte-level artifact (mask token 259, which its tokenizer does not name)."""
    write_jsonl(tmp_path / "data.jsonl", [{"text": " ".join(WORDS * 4)}] * 20)
    prepare_config(write_prepare_config(tmp_path))
    return tmp_path / "out"


def test_the_mask_token_survives_the_artifact_s_removal(tmp_path):
    """The artifact's mask token was read back from the artifact at export time: once it was
    deleted (or moved) after training, the export named no mask token."""
    artifact = byte_level_artifact(tmp_path)
    mask = json.loads((artifact / "manifest.json").read_text())["special_tokens"]["mask"]
    train(tiny_spec(*STEPS, "data.synthetic=null", f"data.artifact={artifact}"), tmp_path / "run")
    shutil.rmtree(artifact)
    out = export_checkpoint(tmp_path / "run/checkpoints", tmp_path / "hf")
    assert json.loads((out / "config.json").read_text())["mask_token_id"] == mask


def llama_base(tmp_path) -> dict:
    """TINY as a Llama model (family causal_lm), from a config.json."""
    config = transformers.LlamaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False,
    ).to_dict()  # fmt: skip
    path = tmp_path / "llama.json"
    path.write_text(json.dumps(config))
    base = copy.deepcopy(TINY)
    base["model"] = {"family": "causal_lm", "from_config": str(path)}
    return base


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_an_autoregressive_export_claims_no_mask_token_and_is_a_causal_lm(tmp_path, arch):
    """The autoregressive objective masks nothing: its export said mask_token_id 259 (the
    byte-level artifact's) all the same. It loads as transformers' causal LM with our logits."""
    base = llama_base(tmp_path) if arch == "llama" else None
    artifact = byte_level_artifact(tmp_path)
    on_artifact = ("data.synthetic=null", f"data.artifact={artifact}")
    out, config = exported(tmp_path, "objective.name=autoregressive", *on_artifact, base=base)
    assert "mask_token_id" not in config
    generation = json.loads((out / "generation_config.json").read_text())
    assert "mask_token_id" not in generation
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out)).eval()
    assert type(hf).__name__ == {"qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}[arch]
    assert getattr(hf.config, "mask_token_id", None) is None
    ids = torch.randint(0, 260, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        theirs = hf(input_ids=ids).logits
        ours = ours_causal(tmp_path / "run/checkpoints")(ids, torch.arange(24))
    torch.testing.assert_close(ours, theirs, atol=2e-5, rtol=1e-4)


def test_a_checkpoint_from_before_the_record_says_what_it_lacks(tmp_path, capsys):
    """A synthetic-data checkpoint written before `mask_token_id` was recorded cannot know the
    default it masked with: the export names none, and says so."""
    train(tiny_spec(*STEPS), tmp_path / "run")
    step = resolve_checkpoint(tmp_path / "run/checkpoints")
    record = json.loads((step / "checkpoint.json").read_text())
    del record["mask_token_id"]
    (step / "checkpoint.json").write_text(json.dumps(record))
    capsys.readouterr()
    out = export_checkpoint(step, tmp_path / "hf")
    assert "does not record the mask token" in capsys.readouterr().err
    assert "mask_token_id" not in json.loads((out / "config.json").read_text())


def test_a_checkpoint_json_path_names_its_step(tmp_path):
    """`dllm export --checkpoint .../step_N/checkpoint.json` (the file a user finds in the step
    folder) exports that step; it was refused as 'not a checkpoint ... (no checkpoint.json)'."""
    train(tiny_spec(*STEPS), tmp_path / "run")
    step = tmp_path / "run/checkpoints/step_00000002"
    assert resolve_checkpoint(step / "checkpoint.json") == step
    out = export_checkpoint(step / "checkpoint.json", tmp_path / "hf")
    assert (out / "config.json").is_file()
