"""checkpoint.keep_last never prunes the step a save just wrote: a rewind (`checkpoint.resume`
naming an earlier step of the run's own folder) with a smaller keep_last than the run had kept
its later steps, and the prune that followed each save removed the new step instead of the
old timeline's."""

from __future__ import annotations

from tests.train.util import write_config
from turbo_dllm.train.checkpoint import read_meta


def test_a_rewound_run_keeps_the_step_it_just_saved(cli, tmp_path):
    config = write_config(
        tmp_path / "train.yaml",
        "training.steps=8",
        "checkpoint.interval=2",
        "checkpoint.keep_last=3",
    )
    run = tmp_path / "run"
    assert cli("train", "--config", str(config), "--run-dir", str(run)).code == 0
    checkpoints = run / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == [
        "step_00000004",
        "step_00000006",
        "step_00000008",
    ]
    old_six = read_meta(checkpoints / "step_00000006").train_time_s
    result = cli(
        "train", "--config", str(config), "--run-dir", str(run),
        "--set", f"checkpoint.resume={checkpoints / 'step_00000004'}",
        "--set", "checkpoint.keep_last=1",
        "--set", "training.steps=6",
    )  # fmt: skip
    assert result.code == 0, result.err
    # The run's own final step stays (the old timeline's step 8 is replaced when the run
    # saves its step 8, as the resume's note says); the older steps of the run are pruned.
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_00000006", "step_00000008"]
    saved = read_meta(checkpoints / "step_00000006")
    assert saved.step == 6 and saved.train_time_s != old_six
