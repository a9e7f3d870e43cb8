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


def test_validate_refuses_scaled_rope_for_qwen3_8(cli, tmp_path):
    hf = json.loads(json.dumps(QWEN38_PRESETS["tiny"]))
    hf["rope_parameters"]["rope_type"] = "yarn"
    model = write_json(tmp_path / "config.json", hf)
    config = runspec(tmp_path, family="qwen3_8", objective="fast_dllm_v2", from_config=model)
    assert_user_error(
        validate(cli, config), "model.from_config:", "rope_type yarn is not supported"
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
    """With no head_dim, the head is hidden / heads: 130 / 4 was truncated to 32."""
    hf = {
        "model_type": "qwen3",
        "vocab_size": 512,
        "hidden_size": 130,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    }
    model = write_json(tmp_path / "config.json", hf)
    result = validate(cli, runspec(tmp_path, from_config=model))
    assert_user_error(
        result,
        "model.from_config:",
        "hidden_size (130) is not a multiple of num_attention_heads (4)",
    )
    write_json(model, {**hf, "hidden_size": 128})
    assert validate(cli, runspec(tmp_path, from_config=model)).code == 0


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
