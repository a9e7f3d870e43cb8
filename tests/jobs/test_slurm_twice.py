"""The same SLURM run submitted twice (`dllm launch --submit`, then `sbatch job.sbatch` again
while the first job trains): the second job's first step took the run over (slurm_job.json
named it, its end wrote result.json, exit 1) though the trainer's lock stopped its workers, so
`dllm run list` read `exit 1` for a run that trained on, and its record named the wrong job to
scancel. The second job now ends at its first step, leaving the run's records to the first.
"""

from __future__ import annotations

import json
import os
import textwrap
import time

import pytest

from tests.jobs.conftest import SMALL_SPEC
from tests.jobs.test_runs_cli import slurm_run
from tests.jobs.test_slurm_plans import fake_command


def _job_started(run_dir, job_id: str) -> int:
    from turbo_dllm.jobs.result import main

    return main(["--run-dir", str(run_dir), "--job-started", "--slurm-job-id", job_id])


def _submitted(run_dir, job_id: str) -> None:
    from turbo_dllm.jobs.backends.slurm import _write_submission

    _write_submission(run_dir, job_id, None, str(run_dir / "job.sbatch"))


def test_a_second_job_of_a_run_whose_job_runs_ends_without_taking_it_over(
    cli, spec_file, workdir, monkeypatch, capsys
):
    slurm_run(cli, spec_file, "--run-dir", "runs/s")
    run_dir = (workdir / "runs" / "s").resolve()
    _submitted(run_dir, "41")
    bin_dir = workdir / "bin"
    fake_command(bin_dir, "squeue", "echo '41|RUNNING'\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    capsys.readouterr()
    assert _job_started(run_dir, "42") == 2
    err = capsys.readouterr().err
    assert err.startswith("dllm: error: ") and "SLURM job 41 (RUNNING)" in err, err
    assert "this job (42)" in err and "sbatch " in err and "hint: " in err
    assert json.loads((run_dir / "slurm_job.json").read_text())["job_id"] == "41"
    [run] = json.loads(cli("run", "list", "--json").out)["runs"]
    assert (run["slurm_job_id"], run["status"]) == ("41", "running")

    # Once that job has ended (or SLURM forgot it), a resubmission is the run's next attempt.
    for answer in ("echo '41|COMPLETED'\n", "true\n"):
        _submitted(run_dir, "41")
        fake_command(bin_dir, "squeue", answer)
        assert _job_started(run_dir, "43") == 0
        assert json.loads((run_dir / "slurm_job.json").read_text())["job_id"] == "43"


# The jobs' small spec, training on until it is cancelled: the second job meets it running.
SPEC = SMALL_SPEC.replace("steps: 4", "steps: 100000")
assert SPEC != SMALL_SPEC


@pytest.mark.slow
def test_the_same_script_submitted_twice_on_a_real_cluster(
    cli, workdir, slurm_cluster, monkeypatch
):
    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)
    (workdir / "train.yaml").write_text(textwrap.dedent(SPEC))
    run_dir = workdir / "runs" / "twice"
    args = ("--config", "train.yaml", "--backend", "slurm", "--submit", "--run-dir", run_dir)
    assert cli("launch", *args).code == 0
    first = json.loads((run_dir / "slurm_job.json").read_text())["job_id"]
    try:
        slurm_cluster.wait_for(first, {"RUNNING"})
        proc = slurm_cluster.run("sbatch", "--parsable", str(run_dir / "job.sbatch"))
        assert proc.returncode == 0, proc.stderr
        second = proc.stdout.strip().split(";")[0]
        state = slurm_cluster.wait_for(second, {"FAILED", "COMPLETED"})
        out = (run_dir / f"slurm-{second}.out").read_text()
        assert state == "FAILED" and f"being trained by SLURM job {first}" in out, out
        assert json.loads((run_dir / "slurm_job.json").read_text())["job_id"] == first
        assert not (run_dir / "result.json").exists()
        deadline = time.monotonic() + 60
        while slurm_cluster.state(first) == "RUNNING" and time.monotonic() < deadline:
            [run] = json.loads(cli("run", "list", "--json").out)["runs"]
            assert run["status"] == "running", run
            if (run_dir / "metrics.jsonl").exists():
                break
            time.sleep(1)
    finally:
        slurm_cluster.run("scancel", first)
