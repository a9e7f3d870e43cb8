"""A requeued SLURM job (scontrol requeue, a node failure, preemption) starts again under the
same id, so it writes the same `slurm-<id>.out`; sbatch's default open mode (truncate) emptied
it, and the earlier attempt's log (its steps, why it stopped) was lost, as `scontrol requeue`
on a real cluster showed. The script now asks for `--open-mode=append`.
"""

from __future__ import annotations

from tests.jobs.test_runs_cli import slurm_run


def test_a_requeued_job_appends_to_its_log(cli, spec_file, workdir):
    slurm_run(cli, spec_file, "--run-dir", "runs/s", "--sbatch=--open-mode=truncate")
    lines = (workdir / "runs" / "s" / "job.sbatch").read_text().splitlines()
    output = next(i for i, line in enumerate(lines) if line.startswith("#SBATCH --output="))
    assert lines[output + 1] == "#SBATCH --open-mode=append"
    # The user's own choice comes later, and sbatch takes the last one.
    assert lines.index("#SBATCH --open-mode=truncate") > output + 1
