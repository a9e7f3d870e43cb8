"""nemotron_diffusion: its config reader and variants, the model, and block-diffusion training."""

from __future__ import annotations

import json

import pytest
import torch

from tests.train.util import losses, tiny_spec
from turbo_dllm.errors import DllmError
from turbo_dllm.families.nemotron_diffusion.config import PRESETS, NemotronConfig
from turbo_dllm.families.nemotron_diffusion.runtime import build_model
from turbo_dllm.registry import get_family
from turbo_dllm.train.attention import BlockDiffusionLayout, ReferenceAttention
from turbo_dllm.train.entry import train
from turbo_dllm.train.weights import full_state_dict, materialize, save_hf

NEMOTRON = {
    "launch": {"seed": 0},
    "model": {
        "family": "nemotron_diffusion",
        "from_config": "tiny",
        "config_overrides": {"hidden_size": 64, "intermediate_size": 128, "head_dim": 16},
    },
    "objective": {"name": "block_diffusion", "block_size": 8, "mask_token_id": 100},
    "data": {"synthetic": {"num_sequences": 64, "vocab_size": 512}, "seq_len": 64},
    "training": {"micro_batch_size": 4, "steps": 10},
    "optimizer": {"lr": 0.003},
    "scheduler": {"name": "cosine", "warmup_steps": 2},
    "checkpoint": {"interval": None},
    "logging": {"console": False},
}

VARIANTS = [
    {"qk_norm": False, "v_norm": False, "attn_output_gate": False},
    {"qk_norm": True, "v_norm": False, "attn_output_gate": False},
    {"qk_norm": True, "v_norm": True, "attn_output_gate": True},
    {"qk_norm": False, "v_norm": True, "attn_output_gate": True, "attention_bias": True},
]


def _hf(**variant):
    return {**PRESETS["tiny"], **variant}


@pytest.mark.parametrize("variant", VARIANTS)
def test_config_variants_round_trip(variant):
    config = NemotronConfig.from_hf_dict(_hf(**variant))
    for key in ("qk_norm", "v_norm", "attn_output_gate"):
        assert getattr(config, key) is variant[key]
    assert (config.block_size, config.mask_token_id, config.dlm_paradigm) == (8, 100, "block_diff")
    again = NemotronConfig.from_hf_dict(json.loads(json.dumps(config.to_hf_dict())))
    assert again == config


def test_config_reads_head_dimension_and_the_inference_paradigm():
    hf = _hf(dlm_paradigm="bidirectional")
    hf["head_dimension"] = hf.pop("head_dim")
    config = NemotronConfig.from_hf_dict(hf)
    assert config.head_dim == 32 and config.dlm_paradigm == "bidirectional"
    assert config.to_hf_dict()["dlm_paradigm"] == "block_diff"  # what training made it


@pytest.mark.parametrize(
    "change,words",
    [
        ({"dlm_paradigm": "autoregressive"}, "dlm_paradigm"),
        ({"mask_token_id": 4096}, "outside the vocabulary"),
        ({"rope_parameters": {"rope_type": "longrope", "factor": 2.0}}, "longrope"),
        ({"num_key_value_heads": 3}, "multiple of"),
    ],
)
def test_bad_configs_are_refused(change, words):
    with pytest.raises(DllmError, match=words):
        NemotronConfig.from_hf_dict(_hf(**change))


@pytest.mark.parametrize("variant", VARIANTS[1:])
def test_variants_build_train_and_save_under_their_names(tmp_path, variant):
    config = get_family("nemotron_diffusion").resolve_config(
        path=None, from_config="tiny", overrides=variant
    )
    model = materialize(build_model(config, ReferenceAttention()), torch.device("cpu"), seed=0)
    names = {name for name, _ in model.named_parameters()}
    attn = "model.layers.0.self_attn."
    assert (attn + "q_norm.weight" in names) is variant["qk_norm"]
    assert (attn + "v_norm.weight" in names) is variant["v_norm"]
    assert (attn + "g_proj.weight" in names) is variant["attn_output_gate"]
    assert sum(p.numel() for p in model.parameters()) == config.num_params()
    layout = BlockDiffusionLayout(16, 4)
    ids = torch.randint(0, 512, (2, 32))
    logits = model(ids, layout.positions(), ReferenceAttention().prepare(layout, None, "cpu"))
    logits.float().square().mean().backward()
    assert all(p.grad is not None for p in model.parameters())
    save_hf(full_state_dict(model), config, tmp_path)
    reloaded = materialize(
        build_model(
            get_family("nemotron_diffusion").resolve_config(path=str(tmp_path), from_config=None),
            ReferenceAttention(),
        ),
        torch.device("cpu"),
        seed=1,
        weights_from=str(tmp_path),
    )
    for name, tensor in reloaded.named_parameters():
        assert torch.equal(tensor, dict(model.named_parameters())[name]), name


def test_the_gate_changes_the_output():
    config = get_family("nemotron_diffusion").resolve_config(path=None, from_config="tiny")
    model = materialize(build_model(config, ReferenceAttention()), torch.device("cpu"), seed=0)
    layout = BlockDiffusionLayout(8, 4)
    mask = ReferenceAttention().prepare(layout, None, "cpu")
    ids = torch.randint(0, 512, (1, 16))
    with torch.no_grad():
        before = model(ids, layout.positions(), mask)
        model.model.layers[0].self_attn.g_proj.weight.add_(1.0)
        assert not torch.allclose(before, model(ids, layout.positions(), mask))


def test_block_diffusion_trains_and_the_loss_falls(tmp_path):
    spec = tiny_spec(
        "training.steps=15", "optimizer.lr=0.01", "objective.loss_weighting=unit", base=NEMOTRON
    )
    train(spec, tmp_path)
    trace = losses(tmp_path)
    first, last = sum(trace[:3]) / 3, sum(trace[-3:]) / 3
    assert last < 0.8 * first, (first, last)


@pytest.mark.parametrize(
    "override,field",
    [
        ("objective.block_size=16", "objective.block_size"),
        ("objective.mask_token_id=7", "objective.mask_token_id"),
        ("objective.name=fast_dllm_v2", "objective.name"),
        ("topology.ep=2", "topology.ep"),
    ],
)
def test_spec_rules_refuse_with_the_reason(override, field):
    with pytest.raises(DllmError, match=field.replace(".", r"\.")):
        tiny_spec(override, base=NEMOTRON)


def test_an_unset_mask_token_with_synthetic_data_must_be_the_checkpoint_s():
    """Unset, the trainer masks synthetic data with its last id: fine where that is the
    checkpoint's mask token, refused (saying why) where it is not; was "got None" either way."""
    tiny_spec(
        "objective.mask_token_id=null", "model.config_overrides.mask_token_id=511", base=NEMOTRON
    )
    with pytest.raises(DllmError, match=r"objective\.mask_token_id: unset.*last id \(511\)"):
        tiny_spec("objective.mask_token_id=null", base=NEMOTRON)


def test_an_unset_mask_token_is_the_artifact_s_and_must_be_the_checkpoint_s(tmp_path):
    """With an artifact and objective.mask_token_id unset the trainer masks with the artifact's
    mask token: validation refused the spec outright ("got None") even where that token is the
    checkpoint's; now it passes, and the input rule refuses an artifact with another one."""
    from tests.data.helpers import prepare_config, write_config, write_jsonl
    from turbo_dllm.jobs.launcher import check_inputs

    write_jsonl(tmp_path / "data.jsonl", [{"text": "abc " * 40} for _ in range(8)])
    config = write_config(tmp_path, packing={"seq_len": 64, "block_size": 8})
    artifact = prepare_config(config).path  # byte level: mask token 259

    def spec(mask: int):
        return tiny_spec(
            f"data.artifact={artifact}",
            "data.synthetic=null",
            "objective.mask_token_id=null",
            f"model.config_overrides.mask_token_id={mask}",
            base=NEMOTRON,
        )

    check_inputs(spec(259), "train.yaml")
    with pytest.raises(DllmError, match=r"artifact's mask token \(259\), not the checkpoint's"):
        check_inputs(spec(100), "train.yaml")


def _ministral3(**rope):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.Ministral3Config(
        vocab_size=97,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_theta": 10000.0, **rope},
    )
    model = transformers.Ministral3ForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(0.1 * torch.randn_like(param))
    return model.eval()


# The published 3B's RoPE: YaRN with llama-4 query scaling (original length 16 here, so
# positions past 16 are scaled).
PUBLISHED_ROPE = {
    "rope_type": "yarn",
    "factor": 4.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "original_max_position_embeddings": 16,
    "llama_4_scaling_beta": 0.1,
}


@pytest.mark.parametrize(
    "rope",
    [
        PUBLISHED_ROPE,
        {
            "rope_type": "default",
            "llama_4_scaling_beta": 0.1,
            "original_max_position_embeddings": 8,
        },
    ],
)
def test_plain_nemotron_equals_transformers_ministral3_causally(tmp_path, rope):
    """Without its variants Nemotron is a Ministral3 decoder: same logits on the same weights."""
    import torch.nn.functional as F

    hf = _ministral3(**rope)
    hf.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    saved.update(model_type="nemotron_labs_diffusion", block_size=8, mask_token_id=90)
    (tmp_path / "config.json").write_text(json.dumps(saved))
    config = get_family("nemotron_diffusion").resolve_config(path=str(tmp_path), from_config=None)
    assert NemotronConfig.from_hf_dict(config.to_hf_dict()) == config

    def causal(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    ours = materialize(
        build_model(config, causal), torch.device("cpu"), seed=0, weights_from=str(tmp_path)
    ).eval()
    ids = torch.randint(0, 97, (2, 40))
    with torch.no_grad():
        torch.testing.assert_close(
            ours(ids, torch.arange(40)), hf(input_ids=ids).logits, atol=2e-5, rtol=1e-4
        )
