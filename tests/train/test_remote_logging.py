"""W&B (a fake `wandb` module) and TensorBoard beside metrics.jsonl."""

from __future__ import annotations

import shutil
import sys
import types

import pytest

from tests.train.util import losses, tiny_spec
from turbo_dllm.train.entry import train


@pytest.fixture
def fake_wandb(monkeypatch):
    """A `wandb` whose init records its arguments and hands out runs with fixed ids."""
    inits: list[dict] = []

    class Run:
        def __init__(self, run_id):
            self.id = run_id

        def log(self, record, step):
            pass

        def finish(self):
            pass

    def init(**kwargs):
        inits.append(kwargs)
        return Run(kwargs.get("id") or f"id{len(inits)}")

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    return inits


def test_wandb_mode_defaults_to_the_environment_then_offline(tmp_path, fake_wandb, monkeypatch):
    train(tiny_spec("training.steps=2", "logging.wandb.project=p"), tmp_path / "a")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    train(tiny_spec("training.steps=2", "logging.wandb.project=p"), tmp_path / "b")
    spec = ("training.steps=2", "logging.wandb.project=p", "logging.wandb.mode=online")
    train(tiny_spec(*spec), tmp_path / "c")  # the spec's own mode wins
    assert [init["mode"] for init in fake_wandb] == ["offline", "disabled", "online"]


def test_a_resume_continues_the_same_wandb_run_named_after_the_dllm_run(tmp_path, fake_wandb):
    run = tmp_path / "20261201-120000-abcd"
    args = ("training.steps=4", "checkpoint.interval=2", "logging.wandb.project=p")
    train(tiny_spec(*args), run)
    shutil.rmtree(run / "checkpoints/step_00000004")
    train(tiny_spec(*args), run)  # resumes from step 2
    first, resumed = fake_wandb
    assert first["id"] is None and resumed["id"] == "id1" and resumed["resume"] == "allow"
    assert first["name"] == resumed["name"] == run.name
    train(tiny_spec("training.steps=2", "logging.wandb.project=p", "launch.name=sweep-3"), tmp_path)
    assert fake_wandb[-1]["name"] == "sweep-3"


def test_tensorboard_event_file_holds_the_loss(tmp_path):
    from tensorboard.backend.event_processing import event_accumulator  # the tensorboard extra

    train(tiny_spec("training.steps=3", "logging.tensorboard=true"), tmp_path)
    events = event_accumulator.EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    scalars = events.Scalars("train/loss")
    assert [s.step for s in scalars] == [1, 2, 3]
    assert [s.value for s in scalars] == pytest.approx(losses(tmp_path), rel=1e-6)
