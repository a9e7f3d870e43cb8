"""A SLURM job warned before its first step (a time limit too short for one, or
`scancel --signal=USR1` just after it started) ends with 143 and nothing saved, but the job's
log said 'the step under way saved (exit 143); continue it from there with: sbatch ...' and
`dllm run list` 'stopped (exit 143: the step under way saved, resumable)', so the user
resubmitted into the same limit (found on a real cluster). Without a saved step both now say
nothing was saved, and the log how to give the job more time.
"""

from __future__ import annotations

import json
import os
import subprocess

from tests.jobs.test_slurm_plans import fake_command, saved_step, slurm_launch


def _run_script(workdir, run_dir) -> subprocess.CompletedProcess:
    bin_dir = workdir / "bin"
    fake_command(bin_dir, "scontrol", "echo node7\n")
    fake_command(bin_dir, "srun", "exit 143\n")
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "SLURM_JOB_ID": "79",
        "SLURM_JOB_NODELIST": "node7",
    }
    return subprocess.run(["bash", run_dir / "job.sbatch"], env=env, capture_output=True, text=True)


def test_a_job_stopped_before_its_first_step_says_nothing_was_saved(cli, spec_file, workdir):
    slurm_launch(cli, spec_file, "--run-dir", "runs/my run", "--time", "1")
    run_dir = workdir / "runs" / "my run"
    script = run_dir / "job.sbatch"
    proc = _run_script(workdir, run_dir)
    assert proc.returncode == 143, proc.stderr
    assert "before it had saved any step (exit 143)" in proc.stderr, proc.stderr
    assert f"give it more: sbatch --time=MINUTES '{script}'" in proc.stderr, proc.stderr
    assert "the step under way saved" not in proc.stderr
    assert json.loads((run_dir / "result.json").read_text())["exit_code"] == 143
    nothing = "stopped (exit 143 before it saved any step: a resume starts over)"
    assert nothing in cli("run", "list").out
    assert f"; {nothing}\n" in cli("run", "show", "my run").out

    saved_step(run_dir)  # a step saved (this attempt's or an earlier one's): continue from it
    proc = _run_script(workdir, run_dir)
    assert "the step under way saved (exit 143); continue it from there" in proc.stderr
    assert "stopped (exit 143: the step under way saved, resumable)" in cli("run", "list").out


def test_a_checkpoint_dir_of_the_specs_own_is_where_the_saved_step_is_looked_for(
    cli, spec_file, workdir
):
    slurm_launch(cli, spec_file, "--run-dir", "runs/s", "--set", "checkpoint.dir=elsewhere")
    run_dir = workdir / "runs" / "s"
    (workdir / "elsewhere" / "step_00000001").mkdir(parents=True)
    (workdir / "elsewhere" / "step_00000001" / "checkpoint.json").write_text("{}")
    proc = _run_script(workdir, run_dir)
    assert "the step under way saved (exit 143)" in proc.stderr, proc.stderr
    assert "the step under way saved, resumable" in cli("run", "list").out
