"""A DFlash2 drafter distilled from the tiny stdlib target: it trains with D-PACE and the
selector loss, `dllm dflash export` holds the DFlash2 serving contract (config keys, tensor
names and shapes) and reloads bit-exactly; misfits are refused at validation."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil

import pytest
import torch
from safetensors import safe_open

from tests.dflash.helpers import drafter_document, drafter_spec
from tests.dflash.test_export import _layer_shapes
from tests.train.util import losses, metrics
from turbo_dllm.config.runspec import RunSpec
from turbo_dllm.config.validate import check
from turbo_dllm.families.dflash.config import DFlashConfig
from turbo_dllm.families.dflash.runtime import build_model, materialize
from turbo_dllm.train.entry import train
from turbo_dllm.train.export import export_checkpoint
from turbo_dllm.train.weights import full_state_dict

DFLASH2 = (
    "model.dflash.architecture=DFlash2DraftModel",
    "model.dflash.selector_rank=8",
    "model.dflash.selector_top_k=16",
    "objective.dflash_loss=dpace",
    "objective.selector_warmup_steps=1",
    "objective.selector_ramp_steps=2",
)


def _dflash2_shapes(config: DFlashConfig) -> dict[str, tuple[int, ...]]:
    """REFERENCE-FAMILIES §1(5): the DFlash tensors plus the convolutions and the selector."""
    h, taps = config.hidden_size, config.conv_kernel_size
    groups = h // config.conv_group_size
    shapes = _layer_shapes(config)
    shapes.update(
        {
            "candidate_selector.predecessor_codebook": (config.vocab_size, config.selector_rank),
            "candidate_selector.successor_codebook": (config.vocab_size, config.selector_rank),
            "candidate_selector.hidden_projection.weight": (config.selector_rank, h),
        }
    )
    for n in range(config.num_hidden_layers):
        for conv in ("attention_conv", "mlp_conv"):
            shapes[f"layers.{n}.{conv}.base_kernel"] = (2, taps, h)
            shapes[f"layers.{n}.{conv}.kernel_projection.weight"] = (2 * taps * groups, h)
    return shapes


def test_dflash2_trains_and_exports_to_the_serving_contract_bit_exactly(cli, world, tmp_path):
    run, resumed = tmp_path / "run", tmp_path / "resumed"
    args = (*DFLASH2, "training.steps=4", "checkpoint.interval=2")
    train(drafter_spec(world["target"], world["artifact"], *args), run)
    trace = losses(run)
    assert len(trace) == 4 and all(math.isfinite(x) and x > 0 for x in trace), trace
    # resumed at step 2 (inside the selector's ramp): the same trace, bit for bit
    shutil.copytree(run / "checkpoints/step_00000002", resumed / "checkpoints/step_00000002")
    train(drafter_spec(world["target"], world["artifact"], *args), resumed)
    assert [r["step"] for r in metrics(resumed)] == [3, 4]
    assert losses(resumed) == trace[2:]
    assert [r["grad_norm"] for r in metrics(resumed)] == [r["grad_norm"] for r in metrics(run)][2:]
    out = tmp_path / "serve"
    result = cli(
        "dflash", "export", "--checkpoint", run / "checkpoints", "--out", out,
        "--target", world["target"],
    )  # fmt: skip
    assert result.code == 0, result.err
    hf = json.loads((out / "config.json").read_text())
    assert hf["architectures"] == ["DFlash2DraftModel"] and hf["model_type"]
    assert "auto_map" not in hf
    target = json.loads((world["target"] / "config.json").read_text())
    assert hf["rope_theta"] == target["rope_theta"]
    dflash = hf["dflash_config"]
    for key in (
        "block_size",
        "conv_group_size",
        "conv_kernel_size",
        "selector_rank",
        "selector_top_k",
    ):
        assert isinstance(dflash[key], int) and dflash[key] > 0, key
    assert (dflash["block_size"], dflash["selector_rank"], dflash["selector_top_k"]) == (4, 8, 16)
    assert dflash["attention_mode"] in ("gqa", "mha") and dflash["causal"] is False
    assert dflash["mask_token_id"] == 259 and dflash["target_layer_ids"] == [1]
    config = DFlashConfig.from_hf_dict(hf)
    assert config.is_dflash2 and config.conv_group_size == 16 and config.conv_kernel_size == 4
    with safe_open(str(out / "model.safetensors"), framework="pt") as handle:
        shapes = {name: tuple(handle.get_slice(name).get_shape()) for name in handle.keys()}  # noqa: SIM118
    assert shapes == _dflash2_shapes(config)  # and nothing of the target's
    record = json.loads((out / "training_export.json").read_text())
    assert record["architecture"] == "DFlash2DraftModel" and record["checkpoint_step"] == 4
    # bit-exact: the serving folder loads back as the checkpoint's weights
    config = dataclasses.replace(config, target_path=str(world["target"]))
    exported = full_state_dict(
        materialize(build_model(config), torch.device("cpu"), seed=7, weights_from=str(out))
    )
    plain = export_checkpoint(run / "checkpoints", tmp_path / "plain")
    saved = full_state_dict(
        materialize(build_model(config), torch.device("cpu"), seed=7, weights_from=str(plain))
    )
    assert exported.keys() == saved.keys() == set(shapes)
    for name, tensor in exported.items():
        assert torch.equal(tensor, saved[name]), name
    # `dllm dflash eval` decodes through the selector and stays lossless
    from turbo_dllm.families.dflash.speculative import evaluate

    report = evaluate(
        str(world["target"]), str(out), str(world["artifact"]), max_new_tokens=12, num_prompts=2
    )
    assert report.lossless is True and report.drafter_kind == "dflash"
    # trained: the convolutions and the selector moved off their initial values
    layer = exported["layers.0.attention_conv.kernel_projection.weight"]
    assert float(layer.abs().sum()) > 0.0
    assert float(exported["candidate_selector.successor_codebook"].abs().sum()) > 0.0


def test_a_dflash2_drafter_on_the_greedy_path_learns(world, tmp_path):
    """greedy_path with hard labels: the target runs all its layers online for its greedy
    tokens, which become the labels of the on-path slots."""
    args = (*DFLASH2, "objective.greedy_path=true", "training.steps=6", "checkpoint.interval=null")
    train(drafter_spec(world["target"], world["artifact"], *args), tmp_path / "run")
    trace = losses(tmp_path / "run")
    assert all(math.isfinite(x) and x > 0 for x in trace) and trace[-1] < trace[0], trace


@pytest.mark.parametrize(
    "overrides,message",
    [
        (("model.dflash.architecture=DFlash2DraftModel",), "does not train a DFlash2DraftModel"),
        (("objective.dflash_loss=dpace",), "does not train a DFlashDraftModel"),
        ((*DFLASH2, "model.dflash.conv_group_size=5"), "must divide hidden_size"),
        ((*DFLASH2, "model.dflash.selector_top_k=999"), "exceeds the vocabulary"),
        (("model.dflash.selector_rank=8",), "shape a DFlash2 drafter, but"),
        (("topology.ep=2", "topology.dp=2"), "ep is not supported here: a drafter has no experts"),
        (("topology.tp=2",), "tp is not supported here: a drafter is small and replicated"),
        (("topology.tp=2", "topology.sp=true"), "sp is not supported here: a drafter is small"),
    ],
)
def test_dflash2_misfits_are_refused_at_validation(world, overrides, message):
    document = drafter_document(world["target"], world["artifact"], *overrides)
    with pytest.raises(Exception, match=message):
        check(RunSpec.model_validate(document))


def test_cp_and_fused_cp_bp_drafters_validate(world):
    for topology in (("topology.cp=2",), ("topology.cp=2", "topology.bp=4")):
        spec = drafter_spec(world["target"], world["artifact"], *topology)
        assert spec.topology.cp == 2
