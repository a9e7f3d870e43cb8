"""A drafter that reads the target's last layer is exported with a warning: SGLang and vLLM
capture a layer's output as it enters the next one, so they cannot serve it (docs/dflash.md,
'Which hidden state'); one that reads an inner layer is exported without one."""

from __future__ import annotations

from tests.dflash.helpers import drafter_spec
from turbo_dllm.train.entry import train


def test_a_last_layer_drafter_is_exported_with_a_warning_an_inner_one_without(
    cli, world, tmp_path
):
    warning = "which SGLang and vLLM cannot capture"
    for layers, warned in (("[1]", True), ("[0]", False)):  # the world's target has 2 layers
        run = tmp_path / f"run-{layers}"
        spec = drafter_spec(
            world["target"],
            world["artifact"],
            f"model.dflash.target_layer_ids={layers}",
            "training.steps=2",
            "checkpoint.interval=null",
        )
        train(spec, run)
        out = tmp_path / f"serve-{layers}"
        result = cli("dflash", "export", "--checkpoint", run / "checkpoints", "--out", out)
        assert result.code == 0, result.err
        assert (warning in result.err) is warned, result.err
        assert (out / "config.json").is_file()
