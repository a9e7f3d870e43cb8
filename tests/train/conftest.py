"""Fixtures of the resume tests (test_resume_records, test_resume_checks): one short training
with checkpoints, cut as a crash would leave it, that each test resumes a copy of."""

from __future__ import annotations

import shutil

import pytest

from tests.train.util import tiny_spec
from turbo_dllm.train.entry import train

RESUME_ARGS = ("training.steps=4", "checkpoint.interval=2", "checkpoint.keep_last=2")


@pytest.fixture(scope="module")
def crashed_once(tmp_path_factory):
    """A run that died after step 3: checkpoint at step 2, metrics of steps 1-4 (one shared
    training; each test resumes a copy)."""
    run = tmp_path_factory.mktemp("crashed") / "run"
    train(tiny_spec(*RESUME_ARGS), run)
    shutil.rmtree(run / "checkpoints/step_00000004")
    return run


@pytest.fixture
def run(crashed_once, tmp_path):
    return shutil.copytree(crashed_once, tmp_path / "run")
