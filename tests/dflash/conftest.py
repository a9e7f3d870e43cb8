"""One real-text world per test session: stdlib artifact + a tiny autoregressive target."""

from __future__ import annotations

import pytest

from tests.dflash.helpers import stdlib_artifact, train_target


@pytest.fixture(scope="session")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("dflash-world")
    artifact = stdlib_artifact(root)
    target = train_target(artifact, root, steps=30)
    return {"root": root, "artifact": artifact, "target": target}


@pytest.fixture(scope="session")
def drafter(world):
    """A drafter distilled from the world's target, as its training run and an HF folder."""
    from tests.dflash.helpers import drafter_spec
    from turbo_dllm.train.entry import train
    from turbo_dllm.train.export import export_checkpoint

    run = world["root"] / "drafter-run"
    spec = drafter_spec(
        world["target"],
        world["artifact"],
        "training.steps=30",
        "checkpoint.interval=null",
        "objective.max_anchors=16",
        "optimizer.lr=0.01",
    )
    train(spec, run)
    return {"run": run, "folder": export_checkpoint(run / "checkpoints", world["root"] / "drafter")}
