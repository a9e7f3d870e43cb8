"""The plan names a SLURM job (`--job-name=dllm-<run id>`) and sends its log, output and errors
both, into the run dir (`--output=<run dir>/slurm-%j.out`), where `dllm run` and the docs say it
is. sbatch takes the last of two options, so an `--sbatch` line with --job-name, --output or
--error (as sbatch reads it: a prefix, a short form, short options sharing a word) renamed the
job or moved its log out of the run dir; the guard let them through. They are refused before
anything is written, naming --run-dir (which names the job and holds its log)."""

from __future__ import annotations

import pytest

from tests.helpers import assert_user_error

LOGGED = "writes the job's output and errors to <run dir>/slurm-<job id>.out itself"
NAMED = "names the job dllm-<run id> itself"
REFUSED = [
    ("--output=/elsewhere/%j.out", [LOGGED, "sbatch would take this --output instead"]),
    ("--out=/elsewhere/x.out", [LOGGED, "(sbatch reads --out as --output)"]),
    ("--output /elsewhere/x.out", [LOGGED]),
    ("-o /elsewhere/x.out", [LOGGED, "this -o"]),
    ("-o/elsewhere/x.out", [LOGGED, "this -o"]),
    ("-vo /elsewhere/x.out", [LOGGED, "(sbatch reads -vo as -o)"]),
    ("--error=/elsewhere/x.err", [LOGGED, "this --error"]),
    ("--err=x.err", [LOGGED, "(sbatch reads --err as --error)"]),
    ("-e x.err", [LOGGED, "this -e"]),
    ("--job-name=mine", [NAMED, "this --job-name"]),
    ("--job=mine", [NAMED, "(sbatch reads --job as --job-name)"]),
    ("-J mine", [NAMED, "this -J"]),
    ("-Jmine", [NAMED]),
    ("--hold -J mine", [NAMED]),
    ("--comment=x --job-name mine", [NAMED]),
]


@pytest.mark.parametrize(("line", "needles"), REFUSED, ids=[line for line, _ in REFUSED])
def test_an_sbatch_line_renaming_the_job_or_moving_its_log_is_refused(
    cli, spec_file, workdir, line, needles
):
    run_dir = workdir / "r"
    result = cli(
        "launch", "--config", spec_file, "--backend", "slurm", "--run-dir", run_dir,
        f"--sbatch={line}",
    )  # fmt: skip
    assert_user_error(result, *needles, "dllm launch --run-dir")
    assert not run_dir.exists()


def test_the_plan_s_own_name_and_log_lines_are_the_script_s_only_ones(cli, spec_file, workdir):
    """A value that only looks like them is no option of its own: `--comment=-o` and
    `--comment -J` are comments, and the script names the job and its log once, in the run dir."""
    run_dir = workdir / "r"
    result = cli(
        "launch", "--config", spec_file, "--backend", "slurm", "--run-dir", run_dir,
        "--sbatch=--comment=-o", "--sbatch=--comment -J",
    )  # fmt: skip
    assert result.code == 0, result.err
    lines = (run_dir / "job.sbatch").read_text().splitlines()
    assert [x for x in lines if x.startswith("#SBATCH --output")] == [
        f"#SBATCH --output={run_dir}/slurm-%j.out"
    ]
    assert [x for x in lines if x.startswith("#SBATCH --job-name")] == ["#SBATCH --job-name=dllm-r"]
