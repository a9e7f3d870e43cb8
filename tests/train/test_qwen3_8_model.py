"""qwen3_8 against transformers' Qwen3_5ForCausalLM, and the HF-layout round trips."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from turbo_dllm.errors import DllmError
from turbo_dllm.families.qwen3_8.runtime import build_model
from turbo_dllm.registry import get_family
from turbo_dllm.train.weights import full_state_dict, materialize, save_hf

transformers = pytest.importorskip("transformers")

VOCAB = 97
# Both layer kinds, grouped linear values (2 key heads serve 4 value heads), partial RoPE.
HF_SHAPE = dict(
    vocab_size=VOCAB,
    hidden_size=48,
    intermediate_size=80,
    num_hidden_layers=3,
    layer_types=["linear_attention", "full_attention", "linear_attention"],
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=8,
    linear_value_head_dim=12,
    linear_conv_kernel_dim=4,
    max_position_embeddings=256,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
)


def causal(q, k, v, mask):
    return F.scaled_dot_product_attention(
        q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1]
    )


def hf_model(**extra):
    torch.manual_seed(0)
    config = transformers.Qwen3_5TextConfig(**{**HF_SHAPE, **extra})
    model = transformers.Qwen3_5ForCausalLM(config)
    with torch.no_grad():  # non-trivial norms and gates, so a wrong mapping shows up
        for name, param in model.named_parameters():
            if "norm" in name or "dt_bias" in name or "A_log" in name:
                param.add_(0.2 * torch.randn_like(param))
    return model.eval()


def ours(folder, backend=causal, kernel="torch"):
    config = get_family("qwen3_8").resolve_config(path=str(folder), from_config=None)
    model = build_model(config, backend, linear_attention=kernel)
    return materialize(model, torch.device("cpu"), seed=0, weights_from=str(folder)).eval()


@pytest.mark.parametrize("extra", [{}, {"tie_word_embeddings": True}])
def test_causal_forward_matches_transformers(tmp_path, extra):
    hf = hf_model(**extra)
    hf.save_pretrained(tmp_path)
    model = ours(tmp_path)
    ids = torch.randint(0, VOCAB, (2, 40))
    with torch.no_grad():
        expected = hf(input_ids=ids).logits
        got = model(ids, torch.arange(40))
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


def test_recurrent_kernel_gives_the_same_model(tmp_path):
    hf_model().save_pretrained(tmp_path)
    ids = torch.randint(0, VOCAB, (1, 24))
    with torch.no_grad():
        chunked = ours(tmp_path, kernel="torch")(ids, torch.arange(24))
        recurrent = ours(tmp_path, kernel="recurrent")(ids, torch.arange(24))
    torch.testing.assert_close(chunked, recurrent, atol=1e-5, rtol=1e-4)


def test_multimodal_folder_reads_the_text_half(tmp_path):
    """A qwen3_5 folder: text_config, tensors under model.language_model., vision ignored."""
    from safetensors.torch import load_file, save_file

    text = tmp_path / "text"
    hf = hf_model()
    hf.save_pretrained(text)
    tensors = load_file(str(text / "model.safetensors"))
    renamed = {
        ("model.language_model." + k.removeprefix("model.") if k.startswith("model.") else k): v
        for k, v in tensors.items()
    }
    renamed["model.visual.patch_embed.proj.weight"] = torch.zeros(3, 3)
    mm = tmp_path / "mm"
    mm.mkdir()
    save_file(renamed, str(mm / "model.safetensors"))
    text_config = json.loads((text / "config.json").read_text())
    (mm / "config.json").write_text(
        json.dumps({"model_type": "qwen3_5", "text_config": text_config, "vision_config": {}})
    )
    ids = torch.randint(0, VOCAB, (1, 16))
    with torch.no_grad():
        torch.testing.assert_close(
            ours(mm)(ids, torch.arange(16)), hf(input_ids=ids).logits, atol=2e-5, rtol=1e-4
        )


def test_saved_folder_loads_in_transformers_with_same_logits_and_tensors(tmp_path):
    config = get_family("qwen3_8").resolve_config(
        path=None, from_config="tiny", overrides={"mask_token_id": 511}
    )
    model = materialize(build_model(config, causal), torch.device("cpu"), seed=3).eval()
    state = full_state_dict(model)
    save_hf(state, config, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["mask_token_id"] == 511
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(hf).__name__ == "Qwen3_5ForCausalLM"
    hf_state = hf.state_dict()
    for name, tensor in state.items():
        torch.testing.assert_close(hf_state[name], tensor, rtol=0, atol=0)
    ids = torch.randint(0, 512, (1, 32))
    with torch.no_grad():
        torch.testing.assert_close(
            model(ids, torch.arange(32)), hf(input_ids=ids).logits, atol=2e-5, rtol=1e-4
        )


def test_random_init_follows_transformers_rules():
    config = get_family("qwen3_8").resolve_config(path=None, from_config="tiny")
    model = materialize(build_model(config, causal), torch.device("cpu"), seed=0)
    params = dict(model.named_parameters())
    assert torch.all(params["model.layers.0.input_layernorm.weight"] == 0)  # (1 + w) = 1
    assert torch.all(params["model.layers.1.self_attn.q_norm.weight"] == 0)
    assert torch.all(params["model.layers.0.linear_attn.norm.weight"] == 1)
    assert torch.all(params["model.layers.0.linear_attn.dt_bias"] == 1)
    a = params["model.layers.0.linear_attn.A_log"].exp()
    assert torch.all((a >= 0.01) & (a <= 16))
    again = materialize(build_model(config, causal), torch.device("cpu"), seed=0)
    for name, tensor in again.named_parameters():
        assert torch.equal(tensor, params[name]), name


def test_mask_token_migration_adds_the_token_and_records_it(tmp_path, cli):
    from tokenizers import Tokenizer, models, pre_tokenizers

    from turbo_dllm.errors import DllmError
    from turbo_dllm.families.qwen3_8.mask_token import migrate_mask_token

    hf_model().save_pretrained(tmp_path)  # vocab_size 97
    vocab = {f"t{i}": i for i in range(90)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="t1").save_pretrained(
        tmp_path
    )
    result = cli("model", "add-mask-token", tmp_path, "--json")
    assert result.code == 0, result.err
    record = json.loads(result.out)
    assert record == {
        "mask_token_id": 90,
        "dllm_mask_token": "<|mask|>",
        "dllm_mask_token_id": 90,
        "dllm_mask_token_original_vocab_size": 90,
        "dllm_mask_token_migration_version": 1,
    }
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert tokenizer.mask_token == "<|mask|>" and tokenizer.mask_token_id == 90
    assert migrate_mask_token(tmp_path) == record  # twice: a no-op
    with pytest.raises(DllmError, match="migrated with the mask token"):
        migrate_mask_token(tmp_path, "<mask>")
    # The record travels with the model config (checkpoint metadata, exports).
    config = get_family("qwen3_8").resolve_config(path=str(tmp_path), from_config=None)
    written = config.to_hf_dict()
    assert {k: written[k] for k in record} == record
    # A tokenizer as long as the embedding leaves no row for the mask token.
    full = tmp_path / "full"
    hf_model(vocab_size=90).save_pretrained(full)
    transformers.PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="t1").save_pretrained(
        full
    )
    with pytest.raises(DllmError, match="does not cover"):
        migrate_mask_token(full)
    # The id past the tokenizer is the config's pad_token_id: a row that never learns.
    pad = tmp_path / "pad"
    hf_model(pad_token_id=90).save_pretrained(pad)
    transformers.PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="t1").save_pretrained(
        pad
    )
    config_before = (pad / "config.json").read_text()
    with pytest.raises(DllmError, match="id 90, the config's pad_token_id"):
        migrate_mask_token(pad)
    assert (pad / "config.json").read_text() == config_before
    assert "<|mask|>" not in transformers.AutoTokenizer.from_pretrained(pad).get_vocab()


def test_mask_token_migration_of_a_folder_without_a_tokenizer_is_refused(tmp_path, cli):
    """A model folder without tokenizer files (e.g. a `dllm export` of a random-init run) used
    to get a tokenizer made up from its model_type, with the mask token at id 1, written over
    the folder; now it is refused and the folder is left as it was."""
    from tests.helpers import assert_user_error

    hf_model().save_pretrained(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    config = (tmp_path / "config.json").read_text()
    assert_user_error(cli("model", "add-mask-token", tmp_path), "has no tokenizer")
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert (tmp_path / "config.json").read_text() == config
    (tmp_path / "tokenizer.json").write_text('{"torn')  # an unreadable one: said, no traceback
    assert_user_error(cli("model", "add-mask-token", tmp_path), "cannot load the tokenizer")


@pytest.mark.parametrize("failure", [KeyboardInterrupt, OSError(28, "No space left on device")])
def test_an_interrupted_mask_token_migration_leaves_the_folder_as_it_was(
    tmp_path, cli, monkeypatch, failure
):
    """The tokenizer files were rewritten in place and config.json after them: Ctrl-C or a full
    disk in between left a tokenizer holding the mask token and a config without the record,
    and running the command again was refused ("already has '<|mask|>' as an ordinary token").
    Now nothing changes unless everything does, and the run after that succeeds."""
    import os
    from pathlib import Path

    from tokenizers import Tokenizer, models

    from tests.helpers import assert_user_error

    hf_model().save_pretrained(tmp_path)
    backend = Tokenizer(models.WordLevel({f"t{i}": i for i in range(90)}, unk_token="t0"))
    transformers.PreTrainedTokenizerFast(tokenizer_object=backend).save_pretrained(tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    replace, failed = os.replace, []

    def cut_off(src, dst):  # config.json, written last, does not go into place (once)
        if Path(dst) == tmp_path / "config.json" and not failed:
            failed.append(dst)
            raise failure
        replace(src, dst)

    monkeypatch.setattr(os, "replace", cut_off)
    result = cli("model", "add-mask-token", tmp_path)
    assert failed and result.code == (130 if failure is KeyboardInterrupt else 2), result.err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    monkeypatch.setattr(os, "replace", replace)
    result = cli("model", "add-mask-token", tmp_path)
    assert result.code == 0, result.err
    assert transformers.AutoTokenizer.from_pretrained(tmp_path).mask_token_id == 90
    assert json.loads((tmp_path / "config.json").read_text())["mask_token_id"] == 90
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left
    # A folder an older version left half-migrated is named as such (was "an ordinary token").
    (tmp_path / "config.json").write_text(before["config.json"].decode())
    result = cli("model", "add-mask-token", tmp_path)
    assert_user_error(result, "as its mask token (id 90), but config.json records no migration")


def test_fla_on_hopper_with_a_miscompiling_triton_is_refused_before_training():
    """fla 0.6 raises at the first backward on Hopper with Triton in [3.4.0, 3.7.1) (seen on the
    H200 host, Triton 3.6.0): the trainer says so when it builds the model, with the fixes."""
    from turbo_dllm.families.qwen3_8.gated_delta import fla_problem

    assert "Triton 3.6.0" in fla_problem("3.6.0", (9, 0), tilelang=False)
    assert fla_problem("3.6.0", (9, 0), tilelang=True) is None  # fla uses TileLang there
    assert fla_problem("3.7.1", (9, 0), tilelang=False) is None
    assert fla_problem("3.6.0", (8, 0), tilelang=False) is None  # only Hopper is affected
    assert fla_problem("3.3.1", (9, 0), tilelang=False) is None


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "linear", "factor": 4.0},
        # positions 0..39 run past the original 16
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
        {
            "rope_type": "yarn",
            "factor": 8.0,
            "original_max_position_embeddings": 16,
            "attention_factor": 1.3,
            "beta_fast": 8.0,
            "truncate": False,
        },
    ],
)
def test_scaled_rope_logits_equal_transformers(tmp_path, rope):
    """transformers' Qwen3_5TextRotaryEmbedding scales the rotated dims' frequencies (and YaRN's
    cos/sin by its attention factor); such a folder was refused, and before that trained as
    plain RoPE."""
    rope = {"rope_theta": 10000.0, "partial_rotary_factor": 0.5, **rope}
    hf = hf_model(rope_parameters=rope)
    hf.save_pretrained(tmp_path)
    model = ours(tmp_path)
    assert model.config.rope_scaling["rope_type"] == rope["rope_type"]
    ids = torch.randint(0, VOCAB, (2, 40))
    with torch.no_grad():
        torch.testing.assert_close(
            model(ids, torch.arange(40)), hf(input_ids=ids).logits, atol=2e-5, rtol=1e-4
        )
    written = model.config.to_hf_dict()
    assert {k: written["rope_parameters"][k] for k in rope} == rope  # the export keeps it
    assert type(model.config).from_hf_dict(written).rope_scaling == model.config.rope_scaling


def test_run_time_rope_types_are_refused():
    """dynamic's frequencies follow the sequence length at run time: not trained."""
    from turbo_dllm.families.qwen3_8.config import PRESETS, Qwen38Config

    hf = json.loads(json.dumps(PRESETS["tiny"]))
    hf["rope_parameters"].update(rope_type="dynamic", factor=2.0)
    with pytest.raises(DllmError, match="rope type 'dynamic' is not supported: its frequencies"):
        Qwen38Config.from_hf_dict(hf)


def test_a_zero_full_attention_interval_is_a_user_error():
    with pytest.raises(DllmError, match="full_attention_interval must be positive"):
        get_family("qwen3_8").resolve_config(
            path=None, from_config="tiny", overrides={"full_attention_interval": 0}
        )


@pytest.mark.parametrize(
    "config, needle",
    [
        (None, "has no config.json"),
        ("[1]", "is not a JSON object"),
        ('"x"', "is not a JSON object"),
        ('{"vocab_size": "97"}', "has no valid vocab_size (found '97')"),
        ('{"vocab_size": null}', "has no valid vocab_size (found None)"),
        ('{"model_type": "qwen3_5"}', "has no valid vocab_size (found None)"),
    ],
)
def test_mask_token_migration_of_a_bad_config_is_a_user_error(tmp_path, cli, config, needle):
    """A config.json that is no object, or whose vocab_size is no integer, raised a traceback
    (AttributeError, ValueError, TypeError); a missing vocab_size read as "0 rows"; a missing
    config.json said no hint."""
    from tokenizers import Tokenizer, models

    from tests.helpers import assert_user_error

    vocab = {f"t{i}": i for i in range(90)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    transformers.PreTrainedTokenizerFast(tokenizer_object=backend).save_pretrained(tmp_path)
    (tmp_path / "config.json").unlink(missing_ok=True)
    if config is not None:
        (tmp_path / "config.json").write_text(config)
    result = cli("model", "add-mask-token", tmp_path)
    assert_user_error(result, needle, "hint:")


def test_mask_token_migration_names_a_missing_folder_and_an_empty_token(tmp_path, cli):
    from tests.helpers import assert_user_error

    assert_user_error(cli("model", "add-mask-token", tmp_path / "nope"), "does not exist")
    (tmp_path / "f").write_text("")
    assert_user_error(cli("model", "add-mask-token", tmp_path / "f"), "is not a folder")
    hf_model().save_pretrained(tmp_path)
    # the tokenizer added nothing: "the mask token would get id None"
    result = cli("model", "add-mask-token", tmp_path, "--mask-token", "")
    assert_user_error(result, "the mask token is empty", "--mask-token")


def test_model_without_a_subcommand_prints_its_help(cli):
    result = cli("model")  # argparse said "the following arguments are required: model_command"
    assert result.code == 2 and "add-mask-token" in result.err
    assert "model_command" not in result.err
