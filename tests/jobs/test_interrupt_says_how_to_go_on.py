"""Ctrl-C of `dllm launch` or `dllm train` names the command that goes on from the last
checkpoint, as a time budget or a SIGTERM does. It said only `dllm: interrupted`; the line was
left for `dllm run show` to find, and the same `dllm train --config F` without --run-dir starts
a new runs/<stamp> instead of resuming the one it stopped."""

from __future__ import annotations


def _ctrl_c(*args, **kwargs):
    raise KeyboardInterrupt


def test_ctrl_c_of_a_launch_and_of_its_resume_name_the_resume(cli, spec_file, workdir, monkeypatch):
    import turbo_dllm.jobs.backends.local as local
    import turbo_dllm.train.entry as entry

    run_dir = workdir / "runs" / "r"
    resume = f"dllm train --config {run_dir / 'spec.yaml'} --run-dir {run_dir}"
    with monkeypatch.context() as patch:
        patch.setattr(local, "run_local", _ctrl_c)
        launch = cli("launch", "--config", spec_file, "--run-dir", run_dir)
    assert launch.code == 130
    assert "dllm: run r stopped by Ctrl-C (no result); continue it from its last" in launch.err
    assert resume in launch.err and launch.err.rstrip().endswith("dllm: interrupted")

    monkeypatch.setattr(entry, "train", _ctrl_c)
    again = cli("train", "--config", run_dir / "spec.yaml", "--run-dir", run_dir)
    assert again.code == 130
    assert "dllm: stopped by Ctrl-C (no result); continue it" in again.err and resume in again.err


def test_ctrl_c_of_dllm_train_names_its_run_dir(cli, spec_file, workdir, monkeypatch):
    import turbo_dllm.train.entry as entry

    def saved_then_ctrl_c(spec, run_dir):
        (run_dir / "checkpoints" / "step_00000002").mkdir(parents=True)
        (run_dir / "checkpoints" / "step_00000002" / "checkpoint.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(entry, "train", _ctrl_c)
    result = cli("train", "--config", spec_file, "--set", "training.steps=5", "--run-dir", "a")
    assert result.code == 130
    assert (
        "dllm: continue it (it saved no checkpoint yet: from step 1) with: dllm train --config "
        f"{spec_file} --set training.steps=5 --run-dir {workdir / 'a'}"
    ) in result.err, result.err
    monkeypatch.setattr(entry, "train", saved_then_ctrl_c)
    result = cli("train", "--config", spec_file, "--run-dir", "b")
    assert result.code == 130
    assert "dllm: continue it from its last checkpoint with: dllm train --config " in result.err
    assert f"--run-dir {workdir / 'b'}\n" in result.err
