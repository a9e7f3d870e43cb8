"""`dllm run list` / `run show` where SLURM cannot be asked (slurmctld down, squeue not on PATH):
a pending or running job read `unknown`, as a job SLURM had forgotten does, with no word of why.
The status now says what kept SLURM from answering; a job SLURM answered it does not know stays
plain `unknown`.
"""

from __future__ import annotations

import json

from tests.jobs.test_runs_cli import slurm_run
from tests.jobs.test_slurm_plans import fake_command


def _status(cli) -> tuple[str, str | None, str]:
    [run] = json.loads(cli("run", "list", "--json").out)["runs"]
    table = cli("run", "list").out
    show = cli("run", "show", "s").out
    progress = next(line for line in show.splitlines() if line.startswith("progress"))
    return run["status"], run["slurm_unreachable"], table + progress


def test_a_job_slurm_could_not_be_asked_about_says_why(cli, spec_file, workdir, monkeypatch):
    from turbo_dllm.jobs.backends.slurm import _write_submission

    slurm_run(cli, spec_file, "--run-dir", "runs/s")
    _write_submission((workdir / "runs" / "s").resolve(), "77", None, "job.sbatch")
    bin_dir = workdir / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))  # no squeue, no sacct

    status, why, text = _status(cli)
    assert (status, why) == ("unknown", "squeue is not on PATH")
    assert "unknown (no answer from SLURM: squeue is not on PATH)" in text, text
    assert text.count("no answer from SLURM") == 2  # the table and `run show`

    down = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"
    fake_command(bin_dir, "squeue", f"echo '{down}' >&2; exit 1\n")
    status, why, text = _status(cli)
    assert status == "unknown" and why == f"squeue failed (exit 1): {down}", why
    assert f"unknown (no answer from SLURM: squeue failed (exit 1): {down})" in text, text

    # The controller answered, and knows no such job: forgotten, nothing kept it from answering.
    fake_command(
        bin_dir, "squeue", "echo 'slurm_load_jobs error: Invalid job id specified' >&2\nexit 1\n"
    )
    status, why, text = _status(cli)
    assert (status, why) == ("unknown", None)
    assert "no answer from SLURM" not in text
