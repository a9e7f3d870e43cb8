"""`dllm export` of a run that diverged: a checkpoint saved the step before the loss became nan
held nan weights (the trainer now stops on the step's nan gradient norm first), and exporting
it wrote a folder that transformers loads and that computes only nan."""

from __future__ import annotations

import pytest

from tests.helpers import assert_user_error
from tests.train.util import tiny_spec
from turbo_dllm.errors import DllmError
from turbo_dllm.train.entry import train


def test_a_checkpoint_with_nan_weights_is_not_exported(cli, tmp_path, monkeypatch):
    from turbo_dllm.train.trainer import Trainer

    def loss_only(stats, done):
        """The trainer before it stopped on a non-finite gradient norm: it then saved the
        step whose update made the weights nan (a checkpoint such a trainer left)."""
        if stats["loss"] != stats["loss"]:
            raise DllmError(f"the loss became nan at step {done}")

    monkeypatch.setattr(Trainer, "_stop_if_not_finite", staticmethod(loss_only))
    diverging = tiny_spec(
        "training.steps=8",
        "optimizer.lr=1e12",
        "training.clip_grad_norm=null",
        "checkpoint.interval=1",
        "checkpoint.keep_last=2",
    )
    with pytest.raises(DllmError, match="the loss became nan"):
        train(diverging, tmp_path / "run")
    steps = sorted((tmp_path / "run/checkpoints").glob("step_*"))
    assert steps, "the run saved no checkpoint before it diverged"
    result = cli("export", "--checkpoint", tmp_path / "run", "--out", tmp_path / "hf")
    assert_user_error(
        result,
        f"the checkpoint '{steps[-1]}' holds non-finite weights",
        "training diverged",
        "hint: export an earlier checkpoints/step_<N> folder",
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no folder, no .hf.partial
