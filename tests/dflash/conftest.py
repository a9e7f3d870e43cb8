"""One real-text world per test session: stdlib artifact + a tiny autoregressive target."""

from __future__ import annotations

import contextlib

import pytest

from tests.dflash.helpers import stdlib_artifact, train_target


@contextlib.contextmanager
def one_thread():
    """torch's intra-op pool at one thread, restored after. These models are tiny (hidden 64,
    one row at a time in feature preparation): a second thread gains nothing on them, and on a
    2-core host that other processes share its spin-waits made each op 4-20x slower (a feature
    artifact of the world's data: 22-27 s at 2 threads, 1.4-1.6 s at 1, back to back)."""
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


@pytest.fixture(scope="package", autouse=True)
def _one_thread():
    """Every test here (its subprocesses already run with OMP_NUM_THREADS=1); the session
    fixtures below, made before any package fixture, set it themselves."""
    with one_thread():
        yield


@pytest.fixture(scope="session")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("dflash-world")
    with one_thread():
        artifact = stdlib_artifact(root)
        target = train_target(artifact, root, steps=30)
    return {"root": root, "artifact": artifact, "target": target}


@pytest.fixture(scope="session")
def small_artifact(tmp_path_factory):
    """Two of the world's sources (about 70 rows of 64 bytes against its ~290), in the world's
    byte-level tokens: data for the world's target where the rows are only passed through it
    (feature artifacts: one target forward a row, whose count sets their tests' time)."""
    root = tmp_path_factory.mktemp("dflash-small")
    return stdlib_artifact(root, files=("keyword.py", "bisect.py"))


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
    with one_thread():
        train(spec, run)
    return {"run": run, "folder": export_checkpoint(run / "checkpoints", world["root"] / "drafter")}
