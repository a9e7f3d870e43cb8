"""A launched run stopped by its time budget (`training.max_duration_s`, each attempt's: the
trainer saves and exits 0 so the next job resumes) is not finished: `dllm launch` says it stopped
at step N of M and prints the command that resumes it, and `dllm run list` / `show` (and
`--json`) read `stopped`, as a SIGTERM stop does, with that command. Before, the launch said
"run <id> finished" and the run read `ok` at 1/4 steps, so a user or a script moved on with a
partly trained model."""

from __future__ import annotations

import json
import shlex

# Stops after its first step with exit status 0, as a job out of its time slot does.
SHORT = ("--set", "training.max_duration_s=0.000001")


def _listed(cli) -> dict:
    listing = cli("run", "list", "--json")
    assert listing.code == 0, listing.err
    (run,) = json.loads(listing.out)["runs"]
    return run


def test_a_run_stopped_by_its_time_budget_reads_stopped_with_its_resume_command(
    cli, spec_file, workdir
):
    run_dir = workdir / "runs" / "short"
    launch = cli("launch", "--config", spec_file, *SHORT, "--run-dir", run_dir)
    assert launch.code == 0, launch.err
    assert "stopping after step 1: training.max_duration_s reached" in launch.err, launch.err
    assert "run short finished" not in launch.err, launch.err
    # the trainer's own closing line (all a bare `dllm train` prints) says so too: not "done"
    assert (
        f"not finished: step 1 of 4 saved in {run_dir / 'checkpoints'}; `dllm train` of the "
        f"same spec with --run-dir {run_dir} goes on from it"
    ) in launch.err, launch.err
    assert "done: 1 steps" not in launch.err, launch.err
    assert (
        "dllm: run short stopped by its time budget (training.max_duration_s=1e-06 s reached) "
        "after step 1 of 4, not finished (exit 0; the step was saved, it resumes there): "
        f"{run_dir}\n"
    ) in launch.err, launch.err
    env = json.loads((run_dir / "manifest.json").read_text())["plan"]["env"]
    threads = f"OMP_NUM_THREADS={env['OMP_NUM_THREADS']}"
    command = f"{threads} dllm train --config {run_dir / 'spec.yaml'} --run-dir {run_dir}"
    assert f"dllm: continue it from there with: {command}\n" in launch.err, launch.err

    run = _listed(cli)
    assert run["exit_code"] == 0 and (run["steps_done"], run["steps_total"]) == (1, 4), run
    assert run["status"] == "stopped", run
    assert run["stopped_by"] == "training.max_duration_s", run
    assert run["resume_command"] == command, run
    detail = "stopped (exit 0: training.max_duration_s reached at step 1/4, saved, resumable)"
    table = cli("run", "list").out
    assert detail in table and " ok " not in table, table
    show = cli("run", "show", "short").out
    assert "\nprogress     1/4 steps, last loss " in show and f"; {detail}\n" in show, show
    assert f"\nresume       {command}\n" in show, show

    # The printed command resumes it (in-process here: the environment is this test's): it
    # goes on from step 2, and its time budget stops it again there.
    words = shlex.split(command)
    assert words[0] == threads and words[1:3] == ["dllm", "train"], words
    resume = cli(*words[2:])
    assert resume.code == 0, resume.err
    assert "not finished: step 2 of 4 saved" in resume.err + resume.out
    run = _listed(cli)
    assert (run["status"], run["steps_done"], run["resumed"]) == ("stopped", 2, True), run
    assert run["resume_command"] == command, run
    stopped = (run_dir / "result.json").read_text()

    # Resumed until the budget runs out at the last step: that run is finished, and says so
    # (it said "not finished: step 4 of 4 saved").
    for _ in range(2):
        resume = cli(*words[2:])
        assert resume.code == 0, resume.err
    said = resume.err + resume.out
    assert "done: 4 steps" in said and "not finished" not in said, said
    assert "stopping after step 4" not in said, said
    run = _listed(cli)
    assert (run["status"], run["steps_done"]) == ("ok", 4), run
    (run_dir / "result.json").write_text(json.dumps(json.loads(stopped)))

    # A SIGTERM stop reads the same way, with its own cause.
    result = json.loads((run_dir / "result.json").read_text())
    (run_dir / "result.json").write_text(json.dumps({**result, "exit_code": 143}))
    run = _listed(cli)
    assert (run["status"], run["stopped_by"], run["resume_command"]) == (
        "stopped",
        "SIGTERM",
        command,
    ), run
    assert "stopped (exit 143: the step under way saved, resumable)" in cli("run", "list").out


def test_a_run_that_finished_reads_ok_without_a_resume_command(cli, spec_file, workdir):
    run_dir = workdir / "runs" / "full"
    launch = cli("launch", "--config", spec_file, "--run-dir", run_dir)
    assert launch.code == 0, launch.err
    assert f"dllm: run full finished: {run_dir}\n" in launch.err, launch.err
    assert "continue it" not in launch.err, launch.err
    run = _listed(cli)
    assert (run["status"], run["steps_done"]) == ("ok", 4), run
    assert run["stopped_by"] is None and run["resume_command"] is None, run
    assert "\nresume " not in cli("run", "show", "full").out
