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
