"""`dllm config validate` as a user meets it: a spec it accepts is one training accepts.

Validation runs the families' own config checks (the trainer's, without building weights), so a
model config the trainer would refuse, or one whose numbers would train to NaN, is refused
here, at the key that is wrong; numbers are strict (a YAML boolean is not a count or a rate).
"""

from __future__ import annotations

import json
import textwrap

import pytest

from tests.helpers import assert_user_error
from turbo_dllm import registry
from turbo_dllm.config.load import load_model
from turbo_dllm.config.runspec import RunSpec
from turbo_dllm.config.validate import problems
from turbo_dllm.errors import DllmError
from turbo_dllm.families.qwen3_8.config import PRESETS as QWEN38_PRESETS


def write(path, text):
    path.write_text(textwrap.dedent(text))
    return path


# What each family's tiny preset needs of the objective beyond its name.
OBJECTIVE = {"nemotron_diffusion": "block_size: 8, mask_token_id: 100"}


def runspec(tmp_path, family="qwen3", objective="block_diffusion", from_config="tiny"):
    shape = OBJECTIVE.get(family, "block_size: 16")
    return write(
        tmp_path / "run.yaml",
        f"""
        model: {{family: {family}, from_config: {from_config}}}
        objective: {{name: {objective}, {shape}}}
        data: {{synthetic: {{}}, seq_len: 64}}
        """,
    )


def validate(cli, config, *overrides):
    args = ["config", "validate", "--config", config]
    for item in overrides:
        args += ["--set", item]
    return cli(*args)


def write_json(path, value):
    path.write_text(json.dumps(value))
    return path


QWEN38 = {"family": "qwen3_8", "objective": "fast_dllm_v2"}


# --- bug 1: validation runs the family config checks training runs ----------------------------


@pytest.mark.parametrize(
    ("family", "override", "needle"),
    [
        (QWEN38, "full_attention_interval=0", "full_attention_interval must be positive"),
        ({}, "hidden_size=0", "hidden_size must be positive"),
        ({}, "num_key_value_heads=3", "must be a multiple of num_key_value_heads (3)"),
        ({}, "hidden_act=tanh", "hidden_act 'tanh' is not supported"),
        (QWEN38, "num_hidden_layers=8", "layer_types has 4 entries for 8 layers"),
        ({"family": "nemotron_diffusion"}, "dlm_paradigm=ar", "dlm_paradigm 'ar'"),
    ],
)
def test_validate_refuses_a_config_override_training_refuses(
    cli, tmp_path, family, override, needle
):
    config = runspec(tmp_path, **family)
    assert validate(cli, config).code == 0  # the spec without the override is fine
    result = validate(cli, config, f"model.config_overrides.{override}")
    assert_user_error(result, "model.config_overrides:", needle)
    assert "Traceback" not in result.err


def test_validate_refuses_run_time_rope_for_qwen3_8(cli, tmp_path):
    hf = json.loads(json.dumps(QWEN38_PRESETS["tiny"]))
    hf["rope_parameters"].update(rope_type="dynamic", factor=2.0)
    model = write_json(tmp_path / "config.json", hf)
    config = runspec(tmp_path, family="qwen3_8", objective="fast_dllm_v2", from_config=model)
    assert_user_error(
        validate(cli, config), "model.from_config:", "rope type 'dynamic' is not supported"
    )


def test_validate_refuses_an_unknown_preset_at_from_config(cli, tmp_path):
    result = validate(cli, runspec(tmp_path), "model.from_config=tinyy")
    assert_user_error(result, "model.from_config: unknown model preset 'tinyy'")


def test_a_model_folder_missing_here_is_left_to_doctor_and_the_trainer(cli, tmp_path):
    """Validation may run where the model is not (a login node): only its content is checked."""
    config = runspec(tmp_path)
    assert (
        validate(cli, config, f"model.from_config={tmp_path / 'elsewhere/config.json'}").code == 0
    )
    spec = load_model(RunSpec, {"model": {"path": "/not/here", "from_config": None}}, "t")
    assert problems(spec) == []


@pytest.mark.parametrize(
    ("family", "overrides"),
    [
        ({}, {"hidden_size": 0}),
        ({}, {"rms_norm_eps": -1.0}),
        ({}, {"rope_theta": 0}),
        ({}, {"num_attention_heads": 3}),
        ({}, {"head_dim": 0}),
        (QWEN38, {"full_attention_interval": 0}),
        (QWEN38, {"partial_rotary_factor": 2.0}),
        (QWEN38, {"linear_num_key_heads": 3}),
        ({"family": "nemotron_diffusion"}, {"mask_token_id": 9999}),
        ({"family": "diffusion_gemma", "objective": "diffusiongemma_sft"}, {"top_k_experts": 9}),
        ({}, {}),
        (QWEN38, {}),
    ],
)
def test_validation_and_the_trainers_config_reader_agree(family, overrides):
    """What validation accepts, the trainer's `resolve_model_config` builds, and vice versa."""
    spec = load_model(
        RunSpec,
        {
            "model": {"family": "qwen3", **family_model(family), "config_overrides": overrides},
            "objective": {"name": family.get("objective", "block_diffusion")},
            "data": {"synthetic": {}, "seq_len": 64},
        },
        "t",
    )
    try:
        registry.resolve_model_config(spec.model)
        trains = True
    except DllmError:
        trains = False
    found = [p for p in problems(spec) if p.path.startswith("model")]
    assert (not found) == trains, found


def family_model(family):
    return {"family": family["family"]} if "family" in family else {}


# --- bug 2: numbers that train to NaN are refused at config time --------------------------------


@pytest.mark.parametrize(
    ("family", "override", "needle"),
    [
        ({}, "rms_norm_eps=-1e-6", "rms_norm_eps must be a finite number > 0 (got -1e-06)"),
        ({}, "rms_norm_eps=0", "rms_norm_eps must be a finite number > 0 (got 0.0)"),
        ({}, "rope_theta=0", "rope_theta must be a finite number > 0 (got 0.0)"),
        (QWEN38, "rope_theta=-5", "rope_theta must be a finite number > 0 (got -5.0)"),
        (QWEN38, "rms_norm_eps=0", "rms_norm_eps must be a finite number > 0"),
        (QWEN38, "partial_rotary_factor=2", "partial_rotary_factor must be a finite number > 0"),
        ({}, "initializer_range=-0.02", "initializer_range must be a finite number >= 0"),
        ({"family": "nemotron_diffusion"}, "rms_norm_eps=0", "rms_norm_eps must be"),
        (
            {"family": "diffusion_gemma", "objective": "diffusiongemma_sft"},
            "rms_norm_eps=-1",
            "rms_norm_eps must be",
        ),
        ({}, "head_dim=0", "head_dim must be positive (got 0)"),
        ({}, "num_key_value_heads=0", "num_key_value_heads must be positive (got 0)"),
        ({}, "num_attention_heads=-4", "num_attention_heads must be positive"),
    ],
)
def test_bad_numerics_are_refused_naming_key_and_range(cli, tmp_path, family, override, needle):
    result = validate(cli, runspec(tmp_path, **family), f"model.config_overrides.{override}")
    assert_user_error(result, "model.config_overrides:", needle)


def test_train_refuses_bad_numerics_before_training(cli, tmp_path):
    """Was: `the loss became nan at step 1`."""
    config = runspec(tmp_path)
    result = cli(
        "train",
        "--config",
        config,
        "--set",
        "model.config_overrides.rms_norm_eps=-1",
        "--set",
        f"launch.run_dir={tmp_path / 'run'}",
    )
    assert_user_error(result, "rms_norm_eps must be a finite number > 0")
    assert not (tmp_path / "run").exists()


def test_heads_that_do_not_divide_the_hidden_size_are_refused(cli, tmp_path):
    """With no head_dim, a Llama's head is hidden / heads: 130 / 4 was truncated to 32. (A
    Qwen3's is Qwen3Config's default, 128: tests/families/test_head_dim_defaults.py.)"""
    hf = {
        "model_type": "llama",
        "vocab_size": 512,
        "hidden_size": 130,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    }
    model = write_json(tmp_path / "config.json", hf)
    result = validate(cli, runspec(tmp_path, "causal_lm", from_config=model))
    assert_user_error(
        result,
        "model.from_config:",
        "hidden_size (130) is not a multiple of num_attention_heads (4)",
    )
    write_json(model, {**hf, "hidden_size": 128})
    assert validate(cli, runspec(tmp_path, "causal_lm", from_config=model)).code == 0


@pytest.mark.parametrize(
    ("scaling", "needle"),
    [
        ({"rope_type": "linear", "factor": 0.0}, "rope_scaling.factor must be a finite number > 0"),
        ({"rope_type": "linear"}, "rope_scaling lacks 'factor'"),
        (
            {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 1.0,
                "original_max_position_embeddings": 8192,
            },
            "must differ",
        ),
    ],
)
def test_bad_rope_scaling_is_refused(cli, tmp_path, scaling, needle):
    hf = {
        **registry.FAMILIES["qwen3"].presets["tiny"],
        "model_type": "llama",
        "rope_scaling": scaling,
    }
    model = write_json(tmp_path / "config.json", hf)
    result = validate(cli, runspec(tmp_path, family="causal_lm", from_config=model))
    assert_user_error(result, "model.from_config:", needle)


def test_nemotron_yarn_needs_a_positive_factor(cli, tmp_path):
    hf = {
        **registry.FAMILIES["nemotron_diffusion"].presets["tiny"],
        "rope_parameters": {
            "rope_type": "yarn",
            "factor": 0,
            "original_max_position_embeddings": 4096,
        },
    }
    model = write_json(tmp_path / "config.json", hf)
    result = validate(cli, runspec(tmp_path, family="nemotron_diffusion", from_config=model))
    assert_user_error(result, "rope_scaling.factor must be a finite number > 0")


def test_diffusion_gemma_rope_theta_must_be_positive(cli, tmp_path):
    hf = json.loads(json.dumps(registry.FAMILIES["diffusion_gemma"].presets["tiny"]))
    hf["text_config"]["rope_parameters"] = {
        "sliding_attention": {"rope_type": "default", "rope_theta": 0.0},
        "full_attention": {"rope_type": "proportional", "rope_theta": 1e6},
    }
    model = write_json(tmp_path / "config.json", hf)
    config = runspec(
        tmp_path, family="diffusion_gemma", objective="diffusiongemma_sft", from_config=model
    )
    assert_user_error(
        validate(cli, config), "sliding_attention rope_parameters.rope_theta must be a finite"
    )


# --- bug 3: numbers are strict: a YAML boolean is not one ---------------------------------------


@pytest.mark.parametrize(
    "override",
    [
        "launch.seed=yes",
        "launch.seed=true",
        "training.steps=on",
        "training.micro_batch_size=yes",
        "optimizer.lr=yes",
        "optimizer.betas=[true, 0.9]",
        "objective.eps_min=true",
        "training.clip_grad_norm=true",
        "scheduler.warmup_steps=no",
        "topology.fsdp=on",
    ],
)
def test_a_boolean_is_not_a_number(cli, tmp_path, override):
    key = override.split("=")[0]
    result = validate(cli, runspec(tmp_path), override)
    assert_user_error(result, f"{key}", "expected a number, not a boolean")


def test_a_boolean_seed_in_the_yaml_is_refused(cli, tmp_path):
    config = write(tmp_path / "run.yaml", "launch: {seed: yes}\n")
    assert_user_error(validate(cli, config), "launch.seed", "not a boolean")
    write(config, "launch: {seed: 1}\n")
    assert validate(cli, config).code == 0


def test_numbers_written_as_yaml_text_still_read(cli, tmp_path):
    """`1e-3` is a string to YAML 1.1: a float field (and a float override) still reads it."""
    result = validate(
        cli,
        runspec(tmp_path),
        "optimizer.lr=1e-3",
        "model.config_overrides.rms_norm_eps=1e-5",
        "launch.seed=7",
    )
    assert result.code == 0, result.err


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("num_hidden_layers=yes", "expected an integer (the config has 4), got True"),
        ("hidden_size=1.5", "expected an integer (the config has 128), got 1.5"),
        ("hidden_size=big", "expected an integer (the config has 128), got 'big'"),
        ("rms_norm_eps=tiny", "expected a number"),
        ("tie_word_embeddings=maybe", "expected true or false"),
        ("rope_theta=on", "expected a number"),
    ],
)
def test_config_overrides_keep_the_configs_types(cli, tmp_path, override, needle):
    """Was: `yes` built a 1-layer model, 1.5 a 1-wide one, 'big' failed naming no key."""
    key = override.split("=")[0]
    result = validate(cli, runspec(tmp_path), f"model.config_overrides.{override}")
    assert_user_error(result, f"model.config_overrides.{key}: {needle}")


# --- further: empty paths, Adam betas, one line per union field ---------------------------------


@pytest.mark.parametrize(
    "key", ["launch.run_dir", "checkpoint.dir", "model.from_config", "checkpoint.resume"]
)
def test_an_empty_path_is_refused(cli, tmp_path, key):
    """Was: `--set launch.run_dir=` made the run folder the config's own folder."""
    result = validate(cli, runspec(tmp_path), f"{key}=")
    assert_user_error(result, key)


def test_adam_betas_must_be_in_range(cli, tmp_path):
    result = validate(cli, runspec(tmp_path), "optimizer.betas=[1.5, 0.95]")
    assert_user_error(result, "optimizer.betas.0: Input should be less than 1")
    assert validate(cli, runspec(tmp_path), "optimizer.betas=[0.0, 0.999]").code == 0


@pytest.mark.parametrize(
    ("override", "line"),
    [
        (
            "checkpoint.resume=5",
            "checkpoint.resume: Input should be 'auto' or 'never' or a valid string (got 5)",
        ),
        (
            "model.config_overrides.rope_theta=.nan",
            "model.config_overrides.rope_theta: Input should be a finite number or a valid "
            "boolean or a valid string (got nan)",
        ),
    ],
)
def test_a_union_field_error_is_one_line_at_the_field(cli, tmp_path, override, line):
    """Was: one line per member of the union, at keys like `rope_theta.int`."""
    result = validate(cli, runspec(tmp_path), override)
    assert_user_error(result, "has 1 problem:", line)
    assert ".int:" not in result.err and ".str:" not in result.err


def test_diffusion_gemma_overrides_of_keys_its_text_config_leaves_out_apply():
    """Was: `rms_norm_eps` (absent from the tiny preset's text_config) went to the root, which
    the reader never read: the override was silently dropped."""
    config = registry.get_family("diffusion_gemma").resolve_config(
        path=None, from_config="tiny", overrides={"rms_norm_eps": 1e-5, "sliding_window": 8}
    )
    assert (config.rms_norm_eps, config.sliding_window) == (1e-5, 8)
    exported = config.to_hf_dict()
    assert "rms_norm_eps" not in exported and exported["text_config"]["rms_norm_eps"] == 1e-5


def test_config_overrides_read_numbers_as_the_config_spells_them(tmp_path):
    """Qwen3's published config.json has `rope_theta: 1000000` (an int): an override of any
    number, or of YAML text such as `1e6`, still applies; an integral float sets an int key."""
    hf = {**registry.FAMILIES["qwen3"].presets["tiny"], "rope_theta": 1000000}
    write_json(tmp_path / "config.json", hf)
    family = registry.get_family("qwen3")
    for overrides, expected in (
        ({"rope_theta": 12.5}, 12.5),
        ({"rope_theta": "1e6"}, 1e6),
        ({"hidden_size": 256.0, "rms_norm_eps": "1e-5"}, 1e6),
    ):
        config = family.resolve_config(path=str(tmp_path), from_config=None, overrides=overrides)
        assert config.rope_theta == expected
    assert (config.hidden_size, config.rms_norm_eps) == (256, 1e-5)
    assert isinstance(config.hidden_size, int)


# --- config_overrides keys: a misspelled one is refused, a real one accepted --------------------


FAMILY_SPECS = {
    "qwen3": {},
    "causal_lm": {"family": "causal_lm"},
    "qwen3_8": QWEN38,
    "nemotron_diffusion": {"family": "nemotron_diffusion"},
    "diffusion_gemma": {"family": "diffusion_gemma", "objective": "diffusiongemma_sft"},
}


@pytest.mark.parametrize(
    ("family", "typo", "meant"),
    [
        ("qwen3", "hiden_size", "hidden_size"),
        ("causal_lm", "num_hidden_layer", "num_hidden_layers"),
        ("qwen3_8", "full_attention_intervall", "full_attention_interval"),
        ("nemotron_diffusion", "attn_output_gates", "attn_output_gate"),
        ("diffusion_gemma", "num_expert", "num_experts"),
    ],
)
def test_a_misspelled_config_override_is_refused_at_its_key(cli, tmp_path, family, typo, meant):
    """Was: the key was written into the config, which no reader reads: the model trained with
    the preset's value and validation said `valid`."""
    result = validate(
        cli, runspec(tmp_path, **FAMILY_SPECS[family]), f"model.config_overrides.{typo}=2"
    )
    assert_user_error(
        result, f"model.config_overrides.{typo}: unknown config key; did you mean {meant!r}?"
    )


@pytest.mark.parametrize(
    ("family", "override"),
    [
        # keys transformers' config class has (or the reader reads) that the tiny preset omits
        ("qwen3", "attention_dropout=0.0"),
        ("qwen3", "use_cache=false"),
        ("causal_lm", "mlp_bias=false"),
        ("qwen3_8", "attention_bias=false"),
        ("qwen3_8", "full_attention_interval=2"),
        ("nemotron_diffusion", "hidden_act=silu"),
        ("nemotron_diffusion", "v_norm=true"),
        ("diffusion_gemma", "attention_dropout=0.0"),
        ("diffusion_gemma", "final_logit_softcapping=20.0"),
        ("diffusion_gemma", "canvas_length=32"),
    ],
)
def test_a_real_config_key_the_preset_leaves_out_is_accepted(cli, tmp_path, family, override):
    config = runspec(tmp_path, **FAMILY_SPECS[family])
    result = validate(cli, config, f"model.config_overrides.{override}")
    assert result.code == 0, result.err


def test_every_misspelled_override_is_reported_at_its_own_key(cli, tmp_path):
    result = validate(
        cli,
        runspec(tmp_path),
        "model.config_overrides.hiden_size=64",
        "model.config_overrides.zzz=1",
        "model.config_overrides.num_hidden_layers=2",
    )
    assert_user_error(
        result,
        "has 2 problems:",
        "model.config_overrides.hiden_size: unknown config key; did you mean 'hidden_size'?",
        "model.config_overrides.zzz: unknown config key (",
    )


def test_train_refuses_a_misspelled_override_before_making_the_run_folder(cli, tmp_path):
    result = cli(
        "train",
        "--config",
        runspec(tmp_path),
        "--set",
        "model.config_overrides.hiden_size=64",
        "--set",
        f"launch.run_dir={tmp_path / 'run'}",
    )
    assert_user_error(result, "model.config_overrides.hiden_size: unknown config key")
    assert not (tmp_path / "run").exists()


def test_an_override_of_a_key_in_the_config_json_is_accepted(cli, tmp_path):
    """Keys the config a spec names holds are known, whatever the family's lists say."""
    hf = {**registry.FAMILIES["qwen3"].presets["tiny"], "my_extra_key": 1}
    model = write_json(tmp_path / "config.json", hf)
    result = validate(
        cli, runspec(tmp_path, from_config=model), "model.config_overrides.my_extra_key=2"
    )
    assert result.code == 0, result.err


def test_diffusion_gemma_token_id_overrides_apply():
    """Was: `pad_token_id` (absent from the tiny preset's text_config) went to the root, which
    the reader never read it from: the model kept pad 0, the export's root said otherwise."""
    config = registry.get_family("diffusion_gemma").resolve_config(
        path=None, from_config="tiny", overrides={"pad_token_id": 5, "eos_token_id": 7}
    )
    assert (config.pad_token_id, config.eos_token_id) == (5, 7)
    exported = config.to_hf_dict()
    assert "pad_token_id" not in exported and exported["text_config"]["pad_token_id"] == 5


def diffusion_gemma_config(tmp_path, **text):
    """The tiny preset as a config.json, its text_config's expert size keys set to `text`."""
    hf = json.loads(json.dumps(registry.FAMILIES["diffusion_gemma"].presets["tiny"]))
    hf["text_config"].pop("moe_intermediate_size")
    hf["text_config"].update(text)
    return str(write_json(tmp_path / "config.json", hf))


@pytest.mark.parametrize("key", ["moe_intermediate_size", "expert_intermediate_size"])
@pytest.mark.parametrize(
    "text",
    [
        None,  # the tiny preset: moe_intermediate_size 32
        {"moe_intermediate_size": 32},
        {"expert_intermediate_size": 32},
    ],
)
def test_diffusion_gemma_expert_size_overrides_apply_under_either_name(tmp_path, key, text):
    """Was: the reader read `moe_intermediate_size or expert_intermediate_size`, so an override
    of `expert_intermediate_size` (the older name, written to the root beside the preset's
    `moe_intermediate_size`) was dropped: the experts kept 32 and validation said `valid`."""
    family = registry.get_family("diffusion_gemma")
    from_config = "tiny" if text is None else diffusion_gemma_config(tmp_path, **text)
    config = family.resolve_config(path=None, from_config=from_config, overrides={key: 48})
    assert config.moe_intermediate_size == 48
    exported = config.to_hf_dict()
    assert exported["text_config"]["moe_intermediate_size"] == 48
    assert "expert_intermediate_size" not in exported and "moe_intermediate_size" not in exported
    again = family.read_config(exported)  # the export reads back with the same size
    assert again.moe_intermediate_size == 48


def test_diffusion_gemma_expert_size_names_that_disagree_are_refused(cli, tmp_path):
    """A config.json with both names, one overridden: which the trainer uses is not for it to
    guess; validation names both values and the way out."""
    model = diffusion_gemma_config(tmp_path, moe_intermediate_size=32, expert_intermediate_size=32)
    config = runspec(tmp_path, **FAMILY_SPECS["diffusion_gemma"], from_config=model)
    assert validate(cli, config).code == 0  # the same size under both names is fine
    assert (
        validate(
            cli,
            config,
            "model.config_overrides.moe_intermediate_size=48",
            "model.config_overrides.expert_intermediate_size=48",
        ).code
        == 0
    )
    result = validate(cli, config, "model.config_overrides.expert_intermediate_size=48")
    assert_user_error(
        result,
        "model.config_overrides:",
        "moe_intermediate_size 32 and expert_intermediate_size 48",
    )


# --- dflash: each problem at its key; a target folder missing here is left to doctor ------------


def dflash_runspec(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    hf = registry.get_family("qwen3").resolve_config(path=None, from_config="tiny").to_hf_dict()
    write_json(target / "config.json", hf)
    return write(
        tmp_path / "run.yaml",
        """
        model: {family: dflash, from_config: target, dflash: {target: target, mask_token_id: 5}}
        objective: {name: dflash_distillation, block_size: 16}
        data: {synthetic: {}, seq_len: 64}
        """,
    )


def test_a_dflash_target_missing_here_is_left_to_doctor_and_the_trainer(cli, tmp_path):
    """Was: `model.dflash: model folder config not found`, a validation error on a login node."""
    config = dflash_runspec(tmp_path)
    assert validate(cli, config).code == 0
    result = validate(cli, config, f"model.dflash.target={tmp_path / 'elsewhere'}")
    assert result.code == 0, result.err
    spec = load_model(
        RunSpec,
        {
            "model": {"family": "dflash", "from_config": None, "path": "/not/here"}
            | {"dflash": {"target": str(tmp_path / "target"), "mask_token_id": 5}},
            "objective": {"name": "dflash_distillation"},
        },
        "t",
    )
    assert [p for p in problems(spec) if p.path.startswith("model")] == []
    with pytest.raises(DllmError, match="model.dflash.target"):  # the trainer's and doctor's
        registry.resolve_model_config(
            spec.model.model_copy(
                update={"path": None, "from_config": "target"}
                | {"dflash": spec.model.dflash.model_copy(update={"target": "/not/here"})}
            )
        )


@pytest.mark.parametrize(
    ("override", "line"),
    [
        ("model.config_overrides.hidden_size=64", "model.config_overrides: "),
        ("model.from_config=tiny", "model.from_config: "),
        ("model.dflash.mask_token_id=600", "model.dflash.mask_token_id: mask_token_id 600"),
        ("model.dflash.target_layer_ids=[9]", "model.dflash.target_layer_ids: target_layer_ids"),
        ("model.dflash.selector_rank=8", "model.dflash.selector_rank: "),
    ],
)
def test_dflash_problems_are_reported_at_their_keys(cli, tmp_path, override, line):
    result = validate(cli, dflash_runspec(tmp_path), override)
    assert_user_error(result, f"  - {line}")


def test_a_dflash_target_of_another_kind_is_refused_at_the_target(cli, tmp_path):
    config = dflash_runspec(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    write_json(other / "config.json", QWEN38_PRESETS["tiny"])
    result = validate(cli, config, f"model.dflash.target={other}")
    assert_user_error(
        result, "model.dflash.target: the target is a 'qwen3_5_text' model, not a Llama"
    )
    assert "model.family" not in result.err


# --- flags are strict: a number is not a boolean ------------------------------------------------


@pytest.mark.parametrize(
    "override",
    [
        "topology.sp=1",
        "training.compile=0",
        "objective.antithetic=0",
        "logging.console='yes'",
        "training.activation_checkpointing=1",
        "profiler.enabled=1",
    ],
)
def test_a_number_is_not_a_flag(cli, tmp_path, override):
    """Was: `--set topology.sp=1` (a degree, as the other topology keys) turned sp on."""
    key = override.split("=")[0]
    result = validate(cli, runspec(tmp_path), override)
    assert_user_error(result, f"{key}: ", "expected true or false")


def test_flags_still_read_yaml_booleans(cli, tmp_path):
    result = validate(
        cli,
        runspec(tmp_path),
        "training.compile=yes",
        "objective.antithetic=false",
        "training.activation_checkpointing=keep_attention",
    )
    assert result.code == 0, result.err


# --- a malformed config never escapes as a traceback ---------------------------------------------


@pytest.mark.parametrize(
    ("family", "override"),
    [
        ("nemotron_diffusion", "rope_scaling=3"),
        ("nemotron_diffusion", "rope_parameters=x"),
        ("qwen3", "rope_scaling=3"),
        ("diffusion_gemma", "per_layer_config=3"),
    ],
)
def test_an_override_cannot_set_an_object_key(cli, tmp_path, family, override):
    """Was: a traceback (`'int' object is not iterable`) for nemotron, or a key set to a value
    no config.json holds there."""
    key = override.split("=")[0]
    result = validate(
        cli, runspec(tmp_path, **FAMILY_SPECS[family]), f"model.config_overrides.{override}"
    )
    assert_user_error(result, f"model.config_overrides.{key}: a config.json holds an object")


@pytest.mark.parametrize(
    ("where", "key", "value", "needle"),
    [
        ("root", "text_config", 3, "text_config is not an object"),
        ("text", "rope_parameters", 3, "rope_parameters must map each layer type"),
        ("text", "per_layer_config", [1], "per_layer_config must map layer indices"),
        ("text", "per_layer_config", {"99": {"head_dim": 8}}, "names layer 99 of a 3-layer"),
        ("text", "mask_token_id", "x", 'text_config.mask_token_id is the string "x"'),
        ("text", "pad_token_id", [1], "text_config.pad_token_id is [1]; it must be an integer"),
    ],
)
def test_a_malformed_diffusion_gemma_config_is_refused(cli, tmp_path, where, key, value, needle):
    """Was: a traceback (AttributeError, IndexError), or a token id of any type accepted."""
    hf = json.loads(json.dumps(registry.FAMILIES["diffusion_gemma"].presets["tiny"]))
    (hf if where == "root" else hf["text_config"])[key] = value
    model = write_json(tmp_path / "config.json", hf)
    spec = {**FAMILY_SPECS["diffusion_gemma"], "from_config": model}
    assert_user_error(validate(cli, runspec(tmp_path, **spec)), "model.from_config:", needle)


def test_a_nemotron_config_with_a_scalar_rope_is_refused(cli, tmp_path):
    hf = {**registry.FAMILIES["nemotron_diffusion"].presets["tiny"], "rope_scaling": 3}
    model = write_json(tmp_path / "config.json", hf)
    spec = {**FAMILY_SPECS["nemotron_diffusion"], "from_config": model}
    assert_user_error(validate(cli, runspec(tmp_path, **spec)), "is not an object: 3")


@pytest.mark.parametrize("family", ["qwen3", "qwen3_8", "nemotron_diffusion"])
def test_token_ids_past_the_models_vocabulary_are_refused_at_validation(cli, tmp_path, family):
    """Was: `valid`, then the trainer refused the data (`the data uses 1000 token ids but the
    model's vocabulary has 512`) once the run had started (diffusion_gemma alone checked)."""
    config = runspec(tmp_path, **FAMILY_SPECS[family])
    result = validate(cli, config, "data.synthetic.vocab_size=1000", "objective.mask_token_id=600")
    assert_user_error(
        result,
        "data.synthetic.vocab_size: 1000 exceeds the model's vocab_size 512",
        "objective.mask_token_id: 600 is outside the model's vocabulary (vocab_size 512)",
    )


# --- a key written twice ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (
            "training:\n  steps: 3\noptimizer: {lr: 0.001}\ntraining:\n  micro_batch_size: 1\n",
            "run.yaml:4:1: training: duplicate key 'training' (first at line 1, column 1)",
        ),
        (
            "training:\n  steps: 30\n  steps: 3\n",
            "run.yaml:3:3: training.steps: duplicate key 'steps' (first at line 2, column 3)",
        ),
        (
            "model: {family: qwen3, config_overrides: {num_hidden_layers: 2, "
            "num_hidden_layers: 3}}\n",
            "model.config_overrides.num_hidden_layers: duplicate key 'num_hidden_layers'",
        ),
        ("launch: {seed: 1}\nlogging: {console: true, console: yes}\n", "logging.console"),
    ],
)
def test_a_key_written_twice_is_refused_at_its_second_place(cli, tmp_path, text, needle):
    """Was: `valid`, YAML keeping the last one: a second `training:` section silently dropped
    the whole first one (its steps became the default 50)."""
    result = validate(cli, write(tmp_path / "run.yaml", text))
    assert_user_error(result, needle, "YAML keeps only the last one")


def test_a_key_written_twice_in_a_set_value_is_refused(cli, tmp_path):
    result = validate(cli, runspec(tmp_path), "model.config_overrides={a: 1, a: 2}")
    assert_user_error(result, "--set model.config_overrides.a: duplicate key 'a': YAML keeps")


def test_a_merged_key_may_still_be_overridden(cli, tmp_path):
    """YAML's merge (`<<`) brings keys in that the mapping itself may set again."""
    config = write(
        tmp_path / "run.yaml",
        "scheduler: {warmup_steps: 1}\n"
        "training:\n  <<: {steps: 9, micro_batch_size: 1}\n  steps: 4\n",
    )
    result = cli("config", "validate", "--config", config, "--json")
    assert result.code == 0, result.err
    training = json.loads(result.out)["training"]
    assert (training["steps"], training["micro_batch_size"]) == (4, 1)


def test_a_folder_given_as_the_config_names_the_configs_in_it(cli, tmp_path):
    """Was: "cannot read config 'proj': [Errno 21] Is a directory: 'proj'" and no hint, for a
    `dllm init` project folder passed where its train.yaml was meant."""
    project = tmp_path / "proj"
    project.mkdir()
    for name in ("train.yaml", "prepare.yaml", "notes.txt"):
        (project / name).write_text("{}\n")
    result = validate(cli, project)
    assert_user_error(result, f"{project} is a folder, not a config file")
    assert "Errno" not in result.err
    assert f"{project / 'prepare.yaml'}, {project / 'train.yaml'}" in result.err
    assert "notes.txt" not in result.err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_user_error(validate(cli, empty), "is a folder, not a config file", "YAML file")


def test_a_section_with_nothing_under_it_is_named_as_empty(cli, tmp_path):
    """`training:` with every field commented out is YAML's null: it read "Input should be a
    valid dictionary or instance of TrainingSpec (got None)"."""
    config = write(
        tmp_path / "run.yaml",
        """
        model: {family: qwen3, from_config: tiny}
        objective: {name: block_diffusion, block_size: 16}
        data: {synthetic: {}, seq_len: 64}
        training:
        #  steps: 10
        """,
    )
    result = validate(cli, config)
    assert_user_error(
        result,
        "training: is empty (a section with nothing under it): give it fields, or remove the "
        "`training:` line for the defaults",
    )
    assert "TrainingSpec" not in result.err
    write(tmp_path / "other.yaml", "model: {family: qwen3, from_config: tiny}\ntraining: 3\n")
    assert_user_error(validate(cli, tmp_path / "other.yaml"), "training: Input should be")


@pytest.mark.parametrize(
    ("override", "line"),
    [
        (
            "layer_types=[full_attention, full_attention]",
            "model.config_overrides.layer_types: an override is a number, true/false or a "
            "string, not a list; set a key that holds a list or an object",
        ),
        (
            "rope_scaling={rope_type: linear, factor: 2.0}",
            "model.config_overrides.rope_scaling: an override is a number, true/false or a "
            "string, not a mapping; set a key that holds a list or an object",
        ),
        (
            "hidden_size=null",
            "model.config_overrides.hidden_size: an override is a number, true/false or a "
            "string, not null; remove the key",
        ),
    ],
)
def test_a_list_or_mapping_override_is_one_clear_line(cli, tmp_path, override, line):
    """Was: "Input should be a valid integer or a valid number or a valid boolean or a valid
    string" (and, from `RunSpec.model_validate`, four pydantic errors at `layer_types.int`,
    `.float`, `.bool`, `.str`), none saying that such a key belongs in a config.json."""
    result = validate(cli, runspec(tmp_path), f"model.config_overrides.{override}")
    assert_user_error(result, "has 1 problem:", line)
    assert "Input should be" not in result.err and "Value error" not in result.err
    with pytest.raises(Exception) as raised:  # the Python API: one error, the same words
        RunSpec.model_validate({"model": {"config_overrides": {"layer_types": ["a", "b"]}}})
    assert raised.value.error_count() == 1
    assert "in a config.json and point model.from_config at it" in str(raised.value)


def test_a_validators_message_reads_without_pydantics_prefix(cli, tmp_path):
    """Was: "launch.seed: Value error, expected a number, not a boolean ..."."""
    result = validate(cli, runspec(tmp_path), "launch.seed=yes")
    assert_user_error(result, "launch.seed: expected a number, not a boolean")
    assert "Value error" not in result.err


@pytest.mark.parametrize(
    ("override", "comment", "meant"),
    [
        ("launch.name=my run #2", "'#2'", "'my run'"),
        ("launch.name=#draft", "'#draft'", "None"),
        ("training.steps=3  # fewer", "'# fewer'", "3"),
    ],
)
def test_a_set_value_with_a_comment_is_refused(cli, tmp_path, override, comment, meant):
    """Was: YAML read ` #...` as a comment and dropped it without a word: the run was named
    'my run', `#draft` set the name to null, `3  # fewer` passed as 3."""
    result = validate(cli, runspec(tmp_path), override)
    key = override.split("=")[0]
    assert_user_error(
        result,
        f"--set {key}: {comment} is a YAML comment, so the value would be {meant} without it",
        "leave the comment out, or quote the value to keep the '#' as text",
    )


def test_a_quoted_set_value_keeps_its_hash(cli, tmp_path):
    for override in ('launch.name="my run #2"', "launch.name=run#2"):
        result = cli("config", "validate", "--config", runspec(tmp_path), "--set", override)
        assert result.code == 0, result.err
    hinted = validate(cli, runspec(tmp_path), "launch.name=my run #2")
    assert """--set 'launch.name="my run #2"'""" in hinted.err  # the hint pastes as printed
    result = cli(
        "config", "validate", "--config", runspec(tmp_path), "--set", 'launch.name="my run #2"',
        "--json",
    )  # fmt: skip
    assert json.loads(result.out)["launch"]["name"] == "my run #2"


def test_a_date_where_text_belongs_is_named_as_a_date(cli, tmp_path):
    """Was: "launch.name: Input should be a valid string (got datetime.date(2024, 1, 1))"."""
    result = validate(cli, runspec(tmp_path), "launch.name=2024-01-01")
    assert_user_error(
        result,
        "launch.name: Input should be a valid string (got 2024-01-01, which YAML reads as a "
        "date: quote it for text)",
    )
    assert "datetime" not in result.err


def test_a_time_like_value_stays_text(cli, tmp_path):
    """Was: YAML 1.1 read `12:30` as the base-60 integer 750 (and `1:30.5` as 90.5): a name of
    `12:30` failed with "got 750", and `launch.seed: 1:00` passed as 60. YAML 1.2 has no base 60."""
    config = write(tmp_path / "run.yaml", "launch: {name: 12:30}\n")
    result = cli("config", "validate", "--config", config, "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["launch"]["name"] == "12:30"
    result = cli(
        "config", "validate", "--config", runspec(tmp_path), "--set", "launch.name=-1:30.5",
        "--json",
    )  # fmt: skip
    assert result.code == 0, result.err
    assert json.loads(result.out)["launch"]["name"] == "-1:30.5"
    result = validate(cli, runspec(tmp_path), "launch.seed=1:00")
    assert_user_error(result, "launch.seed: ", "(got '1:00')")
    assert "got 60" not in result.err  # (the tmp path may hold a 60)


def test_yaml_numbers_without_a_colon_still_read():
    from turbo_dllm.config.bounded_yaml import parse_yaml

    text = "a: 190\nb: -0x1F\nc: 1_000\nd: 2.5e+3\ne: .inf\nf: !!int 1:00\ng: '12:30'\n"
    assert parse_yaml(text, "t.yaml") == {
        "a": 190, "b": -31, "c": 1000, "d": 2500.0, "e": float("inf"), "f": 60, "g": "12:30"
    }  # fmt: skip
    assert parse_yaml("{12:30: x, 1:2:3.5: y}", "t.yaml") == {"12:30": "x", "1:2:3.5": "y"}
