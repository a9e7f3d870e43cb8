"""`dllm run show` prints the command that continues a run (`resume  CMD`, `resume_command` in
`dllm run list --json`) for every run that ended short of its end with its checkpoints there to
go on from: one that stopped, died, was interrupted, or whose SLURM job SLURM ended (cancelled,
timeout, ...). Before, only a `stopped` run had it: for a run that died or was cancelled, the
docs sent the user to launch into its run dir again to be refused and read the line there."""

from __future__ import annotations

import json
import os

from tests.jobs.test_slurm_plans import SLURM, fake_command
from turbo_dllm.jobs.result import write_result


def _listed(cli, run_id) -> dict:
    listing = cli("run", "list", "--json")
    assert listing.code == 0, listing.err
    return next(run for run in json.loads(listing.out)["runs"] if run["run_id"] == run_id)


def test_a_run_that_died_shows_its_resume_command(cli, spec_file, workdir):
    run_dir = workdir / "runs" / "gone"
    assert cli("launch", "--config", spec_file, "--run-dir", run_dir).code == 0
    assert _listed(cli, "gone")["resume_command"] is None  # finished: nothing to continue
    (run_dir / "result.json").unlink()  # as a SIGKILL of its launcher leaves it
    run = _listed(cli, "gone")
    assert run["status"] == "died", run
    env = json.loads((run_dir / "manifest.json").read_text())["plan"]["env"]
    command = (
        f"OMP_NUM_THREADS={env['OMP_NUM_THREADS']} dllm train --config "
        f"{run_dir / 'spec.yaml'} --run-dir {run_dir}"
    )
    assert run["resume_command"] == command, run
    assert f"\nresume       {command}\n" in cli("run", "show", "gone").out
    # the same line a launch into its run dir names
    refused = cli("launch", "--config", spec_file, "--run-dir", run_dir)
    assert f"continue it from its last checkpoint: {command}\n" in refused.err, refused.err

    # A failed run is not offered a resume: it would fail the same way.
    write_result(run_dir, 1, "2026-01-01T00:00:00+00:00", "local")
    run = _listed(cli, "gone")
    assert (run["status"], run["resume_command"]) == ("exit 1", None), run
    assert "\nresume " not in cli("run", "show", "gone").out


def test_a_job_slurm_cancelled_shows_its_script_again(cli, spec_file, workdir, monkeypatch):
    bin_dir = workdir / "bin"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    fake_command(bin_dir, "sbatch", "echo 4242\n")
    fake_command(bin_dir, "squeue", "echo '4242|CANCELLED'\n")
    run_dir = workdir / "runs" / "job"
    assert cli("launch", "--config", spec_file, *SLURM, "--run-dir", run_dir, "--submit").code == 0
    run = _listed(cli, "job")
    assert run["status"] == "cancelled", run
    assert run["resume_command"] == f"sbatch {run_dir / 'job.sbatch'}", run
    assert f"\nresume       sbatch {run_dir / 'job.sbatch'}\n" in cli("run", "show", "job").out

    fake_command(bin_dir, "squeue", "echo '4242|RUNNING'\n")  # still in SLURM's hands
    assert _listed(cli, "job")["resume_command"] is None
    assert "\nresume " not in cli("run", "show", "job").out
