"""`dllm launch --json` without --dry-run is refused with a hint that says what to do: add
--dry-run (the plan as JSON) or drop --json. Before, the hint read "a real launch streams the
workers", which names no way on."""

from __future__ import annotations

import json

from tests.helpers import assert_user_error


def test_json_without_dry_run_says_what_to_do(cli, spec_file, workdir):
    result = cli("launch", "--config", spec_file, "--json")
    assert_user_error(
        result,
        "dllm: error: --json goes with --dry-run\n",
        "hint: add --dry-run for the plan and manifest as JSON, or drop --json to launch",
    )
    assert json.loads(result.out)["hint"].startswith("add --dry-run")
    assert not (workdir / "runs").exists()
