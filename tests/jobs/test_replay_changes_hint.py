"""A replay given a flag that would change the job (`--set`, `--nproc-per-node`, ...) is refused,
and the hint is a command that runs the changed job: the run's spec.yaml as a new run, with a
new --run-dir (that spec names the recorded run's dir, so without one the launch is refused as
a launch into that run). Before, the hint read "launch the config with the new settings
instead (dllm launch --config F)", naming neither the spec nor the run dir it needs."""

from __future__ import annotations

import json
import shlex

import yaml

from tests.helpers import assert_user_error
from tests.jobs.test_replay_inputs import record


def test_a_changed_replay_names_the_launch_that_runs_the_change(cli, spec_file, workdir):
    path, manifest = record(cli, "--config", spec_file, "--run-dir", "a")
    # as the launch writes it: the resolved spec, launch.run_dir naming the run's dir
    (workdir / "a" / "spec.yaml").write_text(yaml.safe_dump(manifest.spec, sort_keys=False))
    assert manifest.spec["launch"]["run_dir"] == str(workdir / "a")
    result = cli("launch", "--manifest", path, "--set", "training.steps=3")
    assert_user_error(
        result,
        "a replay runs the recorded job; --set would change it\n",
        f"hint: launch its spec with the new settings, as a new run: dllm launch --config "
        f"{workdir / 'a' / 'spec.yaml'} --set training.steps=3 --run-dir NEW_DIR\n",
    )
    # The changes as given (it read `--set ...`, to be filled in again): only NEW_DIR to pick.
    hint = result.err.split("as a new run: ")[1].strip()
    hint = hint.replace("NEW_DIR", "b")
    words = shlex.split(hint)
    assert words[:2] == ["dllm", "launch"], words
    changed = cli(*words[1:], "--dry-run", "--json")
    assert changed.code == 0, changed.err
    plan = json.loads(changed.out)
    assert plan["plan"]["run_dir"] == str(workdir / "b")
    assert plan["manifest"]["spec"]["training"]["steps"] == 3
