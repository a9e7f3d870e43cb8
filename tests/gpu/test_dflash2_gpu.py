"""DFlash2 on a GPU: the drafter (grouped convolutions, candidate selector, D-PACE + selector
loss) trains under bf16 autocast with online bf16 target features, and its export decodes
losslessly on CUDA through the selector."""

from __future__ import annotations

import pytest
import torch

from tests.dflash.helpers import drafter_spec, stdlib_artifact, train_target
from tests.dflash.test_dflash2_training import DFLASH2
from tests.train.util import losses
from turbo_dllm.families.dflash.export import export_drafter
from turbo_dllm.families.dflash.speculative import evaluate
from turbo_dllm.train.entry import train

pytestmark = pytest.mark.gpu


def test_dflash2_trains_under_autocast_and_decodes_losslessly_on_cuda(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    artifact = stdlib_artifact(tmp_path)
    target = train_target(artifact, tmp_path, steps=30)
    spec = drafter_spec(target, artifact, *DFLASH2, "training.steps=10", "checkpoint.interval=null")
    run = tmp_path / "drafter"
    train(spec, run)
    trace = losses(run)
    print("dflash2 cuda losses:", [round(x, 4) for x in trace], flush=True)
    assert all(torch.isfinite(torch.tensor(trace))) and trace[-1] < trace[0]
    out = export_drafter(run / "checkpoints", tmp_path / "export", target=target)
    report = evaluate(str(target), str(out), str(artifact), max_new_tokens=32, num_prompts=4)
    print(f"dflash2 cuda eval: tau {report.tau:.2f}, lossless {report.lossless}", flush=True)
    assert report.lossless and report.tau >= 1.0
