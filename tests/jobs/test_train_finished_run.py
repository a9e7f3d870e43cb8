"""`dllm train` of a launched run that finished (exit status 0 at its last step) has nothing to
resume and leaves the run's records as they are. It removed the launch's result.json and wrote
its own, so `dllm run show` said the run ended, at the time of that command, "by a `dllm train
--run-dir` resume" that trained nothing, and the launch's record of when it finished was lost."""

from __future__ import annotations

import json


def test_train_of_a_finished_run_changes_none_of_its_records(cli, spec_file, workdir):
    run_dir = workdir / "runs" / "r"
    assert cli("launch", "--config", spec_file, "--run-dir", run_dir).code == 0
    records = ("result.json", "launcher.json", "metrics.jsonl", "manifest.json")
    before = {name: (run_dir / name).read_bytes() for name in records}
    finished_at = json.loads(before["result.json"])["finished_at"]

    again = cli("train", "--config", run_dir / "spec.yaml", "--run-dir", run_dir)
    assert again.code == 0, again.err
    assert f"nothing to do: run r finished at {finished_at} (step 4/4)" in again.err
    assert f"dllm launch --manifest {run_dir / 'manifest.json'}" in again.err
    assert {name: (run_dir / name).read_bytes() for name in records} == before
    show = cli("run", "show", "r").out
    assert f"\nended        exit status 0 at {finished_at}\n" in show, show
