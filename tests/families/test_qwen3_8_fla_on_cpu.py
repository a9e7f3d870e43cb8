"""`model.linear_attention: fla` on a host without CUDA is refused when the model is built,
before anything is written: it was refused at the first step's forward, after `dllm train` had
made the run dir (a fresh stamped one per attempt) and its checkpoints/ folder, which it left."""

from __future__ import annotations

import pytest
import torch

from tests.train.test_qwen3_8_training import HYBRID
from tests.train.util import write_config

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU refusal")

FLA = ("model.linear_attention=fla", "objective.block_size=64", "data.seq_len=64")


def test_fla_without_cuda_is_refused_before_the_run_dir_is_written(cli, tmp_path):
    config = write_config(tmp_path / "train.yaml", "training.steps=2", *FLA, base=HYBRID)
    result = cli("train", "--config", config, "--run-dir", tmp_path / "run")
    assert result.code == 2, result.err
    assert "model.linear_attention 'fla' runs on CUDA GPUs only" in result.err
    assert "set model.linear_attention: torch" in result.err
    assert not (tmp_path / "run").exists()  # no run dir, no checkpoints/ folder left behind


def test_the_family_refuses_fla_when_it_builds_the_model():
    from turbo_dllm.errors import DllmError
    from turbo_dllm.families.qwen3_8.config import PRESETS, Qwen38Config
    from turbo_dllm.families.qwen3_8.runtime import build_model

    config = Qwen38Config.from_hf_dict(PRESETS["tiny"])
    with pytest.raises(DllmError, match="CUDA GPUs only"):
        build_model(config, None, linear_attention="fla")
    build_model(config, None, linear_attention="torch")  # the reference builds anywhere
