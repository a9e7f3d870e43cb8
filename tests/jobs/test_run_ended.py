"""`dllm run list --json` gives when a run ended (`finished_at`, from its result.json) and whether
a `dllm train --run-dir` resume wrote that result; `dllm run show` says both. Before, the summary
held them but neither command said them."""

from __future__ import annotations

import json


def test_list_and_show_say_when_a_run_ended_and_whether_a_resume_ended_it(cli, spec_file, workdir):
    run_dir = workdir / "runs" / "r"
    assert cli("launch", "--config", spec_file, "--run-dir", run_dir).code == 0
    launched = json.loads((run_dir / "result.json").read_text())

    (run,) = json.loads(cli("run", "list", "--json").out)["runs"]
    assert run["finished_at"] == launched["finished_at"] and run["resumed"] is False
    show = cli("run", "show", "r").out
    assert f"\nended        exit status 0 at {launched['finished_at']}\n" in show, show

    # A run that finished keeps its records (test_train_finished_run.py); one whose launch
    # left no result (killed after its last step) is resumed, and the resume's result is its own.
    (run_dir / "result.json").unlink()
    resume = cli("train", "--config", run_dir / "spec.yaml", "--run-dir", run_dir)
    assert resume.code == 0, resume.err
    resumed = json.loads((run_dir / "result.json").read_text())
    assert resumed["resumed_by"] == "dllm train"

    (run,) = json.loads(cli("run", "list", "--json").out)["runs"]
    assert run["finished_at"] == resumed["finished_at"] and run["resumed"] is True
    assert run["status"] == "ok"
    show = cli("run", "show", "r").out
    ended = f"ended        exit status 0 at {resumed['finished_at']}, by a `dllm train --run-dir` resume"
    assert f"\n{ended}\n" in show, show


def test_a_run_without_a_result_has_no_ended_line(cli, spec_file, workdir):
    run_dir = workdir / "runs" / "r"
    assert cli("launch", "--config", spec_file, "--run-dir", run_dir).code == 0
    (run_dir / "result.json").unlink()
    (run,) = json.loads(cli("run", "list", "--json").out)["runs"]
    assert run["finished_at"] is None and run["resumed"] is False
    assert "\nended " not in cli("run", "show", "r").out
