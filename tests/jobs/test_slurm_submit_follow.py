"""`dllm launch --submit` ends naming how to follow and cancel the job it submitted: `scancel`
with the job's id. Before, it said "cancel with scancel", leaving the user to find the id in
sbatch's line above or in slurm_job.json."""

from __future__ import annotations

import json

from tests.jobs.test_slurm_plans import SLURM, fake_command


def test_a_submitted_job_names_its_scancel(cli, spec_file, workdir, monkeypatch):
    bin_dir = workdir / "bin"
    fake_command(bin_dir, "sbatch", "echo 4242\n")
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    result = cli("launch", "--config", spec_file, *SLURM, "--run-dir", "run", "--submit")
    assert result.code == 0, result.err
    assert json.loads((workdir / "run" / "slurm_job.json").read_text())["job_id"] in (4242, "4242")
    assert (
        f"dllm: follow it with `dllm run show {workdir / 'run'}` (state from SLURM); cancel "
        "with scancel 4242\n"
    ) in result.err, result.err
