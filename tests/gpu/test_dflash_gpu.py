"""DFlash on a GPU: the frozen target's features run in bf16 inside training, the drafter trains
under bf16 autocast, and speculative decoding on CUDA stays lossless."""

from __future__ import annotations

import pytest
import torch

from tests.dflash.helpers import drafter_spec, stdlib_artifact, train_target
from tests.train.util import losses
from turbo_dllm.families.dflash.speculative import evaluate
from turbo_dllm.families.dflash.target import TargetFeatures
from turbo_dllm.registry import resolve_model_config
from turbo_dllm.train.entry import train
from turbo_dllm.train.export import export_checkpoint

pytestmark = pytest.mark.gpu


def test_online_features_train_and_eval_is_lossless_on_cuda(tmp_path):
    artifact = stdlib_artifact(tmp_path)
    target = train_target(artifact, tmp_path, steps=30)
    spec = drafter_spec(target, artifact, "training.steps=10", "checkpoint.interval=null")
    features = TargetFeatures(
        str(target), resolve_model_config(spec.model), teacher=True, device=torch.device("cuda")
    )
    assert features.model.model.embed_tokens.weight.dtype == torch.bfloat16
    assert not any(p.requires_grad for p in features.model.parameters())
    run = tmp_path / "drafter"
    train(spec, run)
    trace = losses(run)
    assert all(torch.isfinite(torch.tensor(trace))) and trace[-1] < trace[0]
    drafter = export_checkpoint(run / "checkpoints", tmp_path / "export")
    report = evaluate(str(target), str(drafter), str(artifact), max_new_tokens=32, num_prompts=4)
    assert report.lossless and report.tau >= 1.0
