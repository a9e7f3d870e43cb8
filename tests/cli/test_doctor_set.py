"""`dllm doctor --set` changes the run of `--config`; without one it is refused, not dropped."""

from __future__ import annotations

from tests.helpers import assert_user_error


def test_doctor_set_without_config_is_refused(cli):
    """It reported `ready` for a run the --set values never reached (exit 0)."""
    assert_user_error(
        cli("doctor", "--set", "training.steps=3"),
        "--set training.steps=3 changes the spec of --config, and none was given",
        "hint: pass the RunSpec as well: --config F --set KEY=VALUE",
    )


def test_a_malformed_set_is_a_bad_option(cli, tmp_path):
    """`--set foo` (no KEY=VALUE) was a failed config check, exit 1, whose fix said to check
    it again with the same `--set foo`; `dllm config validate` and `dllm launch` refuse it as
    bad input. A well-formed --set naming an unknown field stays a failed check."""
    config = tmp_path / "train.yaml"
    config.write_text("training: {steps: 10}\n")
    for json_flag in ((), ("--json",)):
        result = cli("doctor", "--config", config, "--set", "foo", *json_flag)
        assert_user_error(result, "bad override 'foo'", "hint: write --set section.field=value")
    result = cli("doctor", "--config", config, "--set", "training.stpes=3", "--json")
    assert result.code == 1
    assert "did you mean 'steps'?" in result.out
