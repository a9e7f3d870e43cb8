"""The trainer's startup line for CSBP on GPUs with the reference merge (two GPUs)."""

from __future__ import annotations

import pytest
import torch

from tests.train.util import torchrun, write_config

pytestmark = pytest.mark.gpu


def test_the_trainer_warns_about_the_reference_merge_on_gpus(tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    config = write_config(
        tmp_path / "train.yaml", "topology.cp=2", "topology.bp=2", "training.steps=2"
    )
    proc = torchrun(
        2, "train", "--config", str(config), "--run-dir", str(tmp_path / "run"), cwd=tmp_path
    )
    warning = [line for line in proc.stderr.splitlines() if "kernels: reference" in line]
    assert len(warning) == 1 and warning[0].startswith("warning: bp > 1")  # rank 0 only
