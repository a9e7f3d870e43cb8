"""One real-text world per test session: stdlib artifact + a tiny autoregressive target."""

from __future__ import annotations

import pytest

from tests.dflash.helpers import stdlib_artifact, train_target


@pytest.fixture(scope="session")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("dflash-world")
    artifact = stdlib_artifact(root)
    target = train_target(artifact, root, steps=40)
    return {"root": root, "artifact": artifact, "target": target}
