"""A RunSpec problem that a `--set` made says so (`  - training.steps: ... (from --set)`). The report
is headed by the file's name ("train.yaml has 1 problem"), and a user looked in train.yaml for a
value or key (`training.stepz`) they had typed on the command line. Problems written in the file
read as before."""

from __future__ import annotations

import yaml

from tests.helpers import assert_user_error

SPEC = """\
launch: {seed: 0}
model: {family: qwen3, from_config: tiny}
objective: {name: block_diffusion, block_size: 16}
data: {synthetic: {num_sequences: 8, vocab_size: 512}, seq_len: 64}
training: {micro_batch_size: 2, steps: 4}
scheduler: {warmup_steps: 1}
"""


def test_a_problem_made_by_set_names_it(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.yaml").write_text(SPEC.replace("steps: 4", "steps: 4, stepz: 1"))
    sets = ("--set", "training.micro_batch_size=abc", "--set", "optimizer.lrr=0.1")
    for command in (("config", "validate"), ("launch", "--dry-run")):
        result = cli(*command, "--config", "train.yaml", *sets)
        assert_user_error(
            result,
            "train.yaml has 3 problems:\n",
            "  - training.micro_batch_size: Input should be a valid integer, unable to parse "
            "string as an integer (got 'abc') (from --set)\n",
            "  - optimizer.lrr: unknown key; did you mean 'lr'? (from --set)\n",
            # written in the file: no (from --set)
            "  - training.stepz: unknown key; did you mean 'steps'?\n",
        )


def test_a_set_value_yaml_reads_as_a_mapping_or_list_says_so(cli, tmp_path, monkeypatch):
    """`--set 'launch.name=v1: final'` said only "Input should be a valid string (from --set)":
    YAML had read the value as a mapping (`- x` and `[x]` as lists). The problem says what YAML
    made of it and how to quote it (found by the odd-paths audit)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.yaml").write_text(SPEC)
    result = cli("config", "validate", "--config", "train.yaml", "--set", "launch.name=v1: final")
    assert_user_error(
        result,
        "  - launch.name: Input should be a valid string (from --set); YAML read 'v1: final' "
        "as a mapping: to keep it as text, quote it: --set 'launch.name=\"v1: final\"'",
    )
    result = cli("config", "validate", "--config", "train.yaml", "--set", "launch.name=- x")
    assert_user_error(result, "YAML read '- x' as a list")
    # the quoted value the hint gives is valid
    result = cli("config", "validate", "--config", "train.yaml", "--set", 'launch.name="v1: final"')
    assert result.code == 0, result.err
    assert "name: 'v1: final'" in result.out


def test_config_validate_prints_non_ascii_values_as_written(cli, tmp_path, monkeypatch):
    """The resolved spec printed 'caf\\xE9 \\u6570\\u636E' for `café 数据` (found by the
    odd-paths audit)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.yaml").write_text(SPEC)
    result = cli("config", "validate", "--config", "train.yaml", "--set", "launch.name=café 数据")
    assert result.code == 0, result.err
    assert "name: café 数据" in result.out


def test_a_cross_field_problem_names_the_set_that_took_part(cli, tmp_path, monkeypatch):
    """`--set training.steps=3` against the starter's `warmup_steps: 5` said only
    "scheduler.warmup_steps: 5 exceeds training.steps (3)": the 3 is in no file. The --set that
    took part is named; one that did not (launch.name) is not, nor is a problem at the --set's
    own field marked otherwise than `(from --set)`."""
    monkeypatch.chdir(tmp_path)
    assert cli("init", "p").code == 0
    result = cli(
        "config", "validate", "--config", "p/train.yaml",
        "--set", "training.steps=3", "--set", "launch.name=x",
    )  # fmt: skip
    assert_user_error(
        result,
        "p/train.yaml has 1 problem:\n"
        "  - scheduler.warmup_steps: 5 exceeds training.steps (3) (from --set training.steps=3)\n",
    )
    result = cli("config", "validate", "--config", "p/train.yaml", "--set", "launch.name=x")
    assert result.code == 0, result.err
    steps = yaml.safe_load((tmp_path / "p/train.yaml").read_text())["training"]["steps"]
    result = cli(
        "config", "validate", "--config", "p/train.yaml", "--set", "scheduler.warmup_steps=999"
    )
    assert_user_error(
        result, f"  - scheduler.warmup_steps: 999 exceeds training.steps ({steps}) (from --set)\n"
    )
