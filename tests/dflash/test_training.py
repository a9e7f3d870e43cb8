"""Distilling a drafter from the tiny stdlib target: it learns, resumes bitwise, and two
data-parallel processes (replicated or FSDP2) train the one-process trace."""

from __future__ import annotations

import re
import shutil

import pytest
import torch

from tests.dflash.helpers import (
    assert_two_processes_train_the_one_process_trace,
    drafter_spec,
)
from tests.train.util import losses, metrics
from turbo_dllm.train.entry import train


def test_drafter_learns_and_resumes_bitwise(world, tmp_path, capsys):
    args = ("training.steps=8", "checkpoint.interval=4")
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train(drafter_spec(world["target"], world["artifact"], *args), straight)
    # the banner names the drafter, not its target's model_type, and a tiny one's real size
    banner = capsys.readouterr().err.splitlines()[0]
    assert re.match(r"training dflash DFlashDraftModel \(\d+\.\dK params\) on 1 x cpu", banner)
    trace = losses(straight)
    assert trace[-1] < 0.8 * trace[0], trace
    from torch.distributed.checkpoint import FileSystemReader

    saved = FileSystemReader(str(straight / "checkpoints/step_00000008")).read_metadata()
    names = set(saved.state_dict_metadata)
    assert "model.fc.weight" in names  # the drafter's own tensors, never the target's:
    assert not {n for n in names if "embed_tokens" in n or "lm_head" in n}
    train(drafter_spec(world["target"], world["artifact"], *args), resumed)
    shutil.rmtree(resumed / "checkpoints/step_00000008")
    train(drafter_spec(world["target"], world["artifact"], *args), resumed)
    assert [r["step"] for r in metrics(resumed)] == list(range(1, 9))
    assert losses(resumed) == trace  # bitwise
    assert [r["grad_norm"] for r in metrics(resumed)] == [r["grad_norm"] for r in metrics(straight)]


@pytest.mark.slow
@pytest.mark.parametrize(
    "topology",
    [
        ("topology.dp=2", "training.micro_batch_size=2"),
        ("topology.fsdp=2", "training.micro_batch_size=2"),
        ("topology.bp=2",),  # both ranks read the same batch, each drafts half its anchors
    ],
    ids=["dp2", "fsdp2", "bp2"],
)
def test_two_processes_train_the_one_process_trace(world, tmp_path, topology):
    assert_two_processes_train_the_one_process_trace(world, tmp_path, topology)


def test_block_parallel_shares_are_disjoint_dual_end_and_cover_the_batch():
    from turbo_dllm.families.dflash.plan import share_anchors
    from turbo_dllm.train.objectives import NoiseKey
    from turbo_dllm.train.objectives.dflash_distillation import DFlashDistillation

    ids = torch.randint(0, 250, (3, 64), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[2, 40:] = False
    objective = DFlashDistillation(block_size=4, max_anchors=9, loss="paper_ce")
    batch = objective.corrupt({"input_ids": ids, "loss_mask": mask}, NoiseKey(0, 0, 0, 3))
    b = batch.block_size

    def slots(part):
        width = part.anchors.shape[1]
        r = part.score_index // (width * b)
        anchor = part.anchors[r, (part.score_index // b) % width]
        return sorted(
            zip(
                r.tolist(),
                anchor.tolist(),
                (part.score_index % b).tolist(),
                part.targets.tolist(),
                strict=True,
            )
        )

    shares = [share_anchors(batch, rank, 2) for rank in range(2)]
    assert sorted(slots(shares[0]) + slots(shares[1])) == slots(batch)
    assert not set(slots(shares[0])) & set(slots(shares[1]))
    row = batch.anchors[0][batch.anchor_valid[0]].tolist()  # 9 anchors: pairs (0,8) (1,7) ...
    mine = shares[0].anchors[0][shares[0].anchor_valid[0]].tolist()
    assert mine == sorted([row[0], row[8], row[2], row[6], row[4]])


def test_block_parallel_shares_add_up_to_every_gradient(world):
    """Each rank's share of the anchors gives part of the loss; the shares' gradients add up to
    the whole batch's, parameter by parameter (what FSDP's reduction then sums over ranks)."""
    from turbo_dllm.families.dflash.plan import DraftPlan
    from turbo_dllm.families.dflash.runtime import build_model, materialize
    from turbo_dllm.families.dflash.target import TargetFeatures
    from turbo_dllm.registry import resolve_model_config
    from turbo_dllm.train.data import build_data
    from turbo_dllm.train.objectives import NoiseKey, build_objective

    spec = drafter_spec(world["target"], world["artifact"], "objective.max_anchors=5")
    config = resolve_model_config(spec.model)
    model = materialize(build_model(config), torch.device("cpu"), seed=0)
    data = build_data(spec, model_vocab_size=config.vocab_size, dp_rank=0, dp_size=1)
    objective = build_objective(spec.objective, data.mask_token_id)
    batch = objective.corrupt(next(data.loader), NoiseKey(0, 0, 0, 4))
    target = TargetFeatures(config.target_path, config, teacher=True, device=torch.device("cpu"))

    def gradients(plan):
        model.zero_grad()
        inputs = plan.prepare(batch, torch.device("cpu"))
        loss = model(inputs.input_ids, inputs.positions, inputs.mask, output=inputs.output)
        loss.backward()
        return loss.detach(), {
            n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None
        }

    whole_loss, whole = gradients(DraftPlan(config, target))
    parts = [gradients(DraftPlan(config, target, rank=r, size=2)) for r in range(2)]
    torch.testing.assert_close(parts[0][0] + parts[1][0], whole_loss, rtol=1e-5, atol=1e-6)
    assert whole.keys() == parts[0][1].keys() and "fc.weight" in whole
    for name, grad in whole.items():
        torch.testing.assert_close(
            parts[0][1][name] + parts[1][1][name], grad, rtol=1e-4, atol=1e-6, msg=name
        )
