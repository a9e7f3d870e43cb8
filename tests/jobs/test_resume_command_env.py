"""The command a refused launch prints to continue a stopped one-process run carries the
environment its plan recorded: its thread count (`OMP_NUM_THREADS=N`, recorded since local
launches record it), shell-quoted, as the torchrun line carries its workers'. Before, it was a
bare `dllm train ...`, which continued the run with the shell's thread count (CPU ops then
round otherwise than the run did); a run recorded before the field ran with torch's default,
and its line still sets none."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import assert_user_error
from turbo_dllm.host import view
from turbo_dllm.jobs import launcher, provenance
from turbo_dllm.jobs.manifest import RunManifest, write_manifest
from turbo_dllm.jobs.options import LaunchOptions

CONTINUE = "continue it from its last checkpoint: "


@pytest.fixture
def pinned_code(monkeypatch):
    code = provenance.code_version()  # others may edit this checkout while the test runs
    monkeypatch.setattr(provenance, "code_version", lambda: dict(code))


def continue_line(cli, spec_file, run_dir: Path) -> str:
    result = cli("launch", "--config", spec_file, "--run-dir", run_dir)
    assert_user_error(result, "(no result, no steps yet)", CONTINUE)
    return result.err.split(CONTINUE)[1].split("\n")[0]


def test_a_stopped_local_run_continues_with_its_recorded_thread_count(
    cli, spec_file, workdir, monkeypatch, pinned_code
):
    monkeypatch.setattr(view, "_cpu_count", lambda: 3)
    run_dir = workdir / "my run"  # a space: the printed command quotes it
    # Its launcher recorded the job, then died before the worker trained a step.
    job = launcher.prepare_launch(
        spec_file, [], LaunchOptions(run_dir=str(run_dir)), ["dllm", "launch"]
    )
    assert job.plan.backend == "local" and job.plan.env == {"OMP_NUM_THREADS": "3"}
    launcher.materialize(job)

    line = continue_line(cli, spec_file, run_dir)
    assert line == (
        f"OMP_NUM_THREADS=3 dllm train --config '{run_dir}/spec.yaml' --run-dir '{run_dir}'"
    )
    # Pasted into a shell, it continues that run.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    resumed = subprocess.run(
        ["bash", "-c", line], capture_output=True, text=True, timeout=300, env=env, cwd=workdir
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((run_dir / "result.json").read_text())["resumed_by"] == "dllm train"


def test_a_local_run_recorded_before_its_thread_count_continues_without_one(
    cli, spec_file, workdir, pinned_code
):
    result = cli("launch", "--dry-run", "--json", "--config", spec_file, "--run-dir", "old")
    assert result.code == 0, result.err
    document = json.loads(result.out)["manifest"]
    document["plan"]["env"] = {}  # what a local launch recorded before
    Path("old").mkdir()
    write_manifest(RunManifest.model_validate(document), Path("old"))
    (workdir / "old" / "spec.yaml").write_text("")
    line = continue_line(cli, spec_file, workdir / "old")
    assert line == f"dllm train --config {workdir}/old/spec.yaml --run-dir {workdir}/old"
