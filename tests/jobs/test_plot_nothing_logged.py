"""`dllm run plot` of a run with no metrics says why, where its manifest tells: the hint said
"check logging.jsonl in the spec" of a SLURM run whose script was never submitted."""

from __future__ import annotations

from tests.helpers import assert_user_error


def test_plot_of_an_unsubmitted_slurm_run_says_it_has_not_run(cli, spec_file, workdir):
    assert (
        cli("launch", "--config", spec_file, "--backend", "slurm", "--run-dir", "runs/s").code == 0
    )
    assert_user_error(
        cli("run", "plot", "s"),
        "has no metrics yet (metrics.jsonl is missing)",
        f"its SLURM script was never submitted (sbatch {workdir / 'runs' / 's' / 'job.sbatch'})",
    )


def test_plot_of_a_run_that_logs_no_metrics_says_so(cli, spec_file, workdir, monkeypatch):
    import turbo_dllm.jobs.backends.local as local

    monkeypatch.setattr(local, "run_local", lambda plan: 0)  # a run that wrote no metrics.jsonl
    launch = (
        "launch",
        "--config",
        spec_file,
        "--set",
        "logging.jsonl=false",
        "--run-dir",
        "runs/q",
    )
    assert cli(*launch).code == 0
    assert_user_error(cli("run", "plot", "q"), "its spec has logging.jsonl: false")
