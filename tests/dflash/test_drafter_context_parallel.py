"""Drafters under context parallelism, 2 gloo processes against one: the context sharded over
cp (each rank projects its shard, the layers all-gather the context K/V) and the anchors spread
over the context group in dual-end order. The ranks' losses add up to the one-process loss and
their gradients, summed as FSDP's reduction does, to every one-process gradient."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.dflash.helpers import assert_two_processes_train_the_one_process_trace, drafter_spec
from tests.dflash.test_dflash2_training import DFLASH2
from tests.distributed.harness import run_gloo

CASES = [
    # name, overrides, cp, bp
    ("cp2-dflash-kl", ("objective.dflash_loss=speculators_kl",), 2, 1),
    (
        "cp2-dflash-paper-ce-from-anchor",
        (
            "objective.dflash_loss=paper_ce",
            "model.dflash.sample_from_anchor=true",
            "objective.sample_from_anchor=true",
        ),
        2,
        1,
    ),  # fmt: skip
    ("cp2-bp2-dflash2-dpace", DFLASH2, 2, 2),
    # the greedy path reads the whole context's target outputs on every rank, anchors shared
    (
        "cp2-bp2-greedy-ce-on-path",
        ("objective.dflash_loss=greedy_ce", "objective.greedy_path=true"),
        2,
        2,
    ),
]


def _gradients(model, plan, batch):
    model.zero_grad()
    inputs = plan.prepare(batch, torch.device("cpu"))
    loss = model(inputs.input_ids, inputs.positions, inputs.mask, output=inputs.output)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


def _worker(rank: int, world: int, target: str, artifact: str, results: str, cases) -> None:
    import torch.distributed as dist

    from turbo_dllm.families.dflash.plan import DraftPlan
    from turbo_dllm.families.dflash.runtime import build_model, build_sequence_plan, materialize
    from turbo_dllm.families.dflash.target import TargetFeatures
    from turbo_dllm.registry import resolve_model_config
    from turbo_dllm.train.data import build_data
    from turbo_dllm.train.objectives import NoiseKey, build_objective
    from turbo_dllm.train.parallel.dims import ParallelDims

    cpu = torch.device("cpu")
    errors = {}
    for name, overrides, cp, bp in cases:
        spec = drafter_spec(Path(target), Path(artifact), "objective.max_anchors=6", *overrides)
        config = resolve_model_config(spec.model)
        model = materialize(build_model(config), cpu, seed=0)
        data = build_data(spec, model_vocab_size=config.vocab_size, dp_rank=0, dp_size=1)
        objective = build_objective(spec.objective, data.mask_token_id)
        batch = objective.corrupt(next(data.loader), NoiseKey(0, 2, 0, 4))  # selector on
        features = TargetFeatures(
            config.target_path, config, teacher=objective.needs_teacher, device=cpu
        )
        whole_loss, whole = _gradients(model, DraftPlan(config, features), batch)
        dims = ParallelDims(dp_replicate=1, dp_shard=1, cp=cp, bp=bp, tp=1, world_size=world)
        dims.build_mesh("cpu")
        plan = build_sequence_plan(dims, None, spec=spec, config=config, device=cpu)
        assert plan.cp_size == cp and plan.context_size == world
        loss, grads = _gradients(model, plan, batch)
        dist.all_reduce(loss)
        problems = []
        if not torch.allclose(loss, whole_loss, rtol=1e-5, atol=1e-6):
            problems.append(f"loss {float(loss)} != {float(whole_loss)}")
        if grads.keys() != whole.keys():
            problems.append(f"gradients of {sorted(grads.keys() ^ whole.keys())}")
        for param, grad in sorted(whole.items()):
            got = grads.get(param, torch.zeros_like(grad))
            dist.all_reduce(got)
            if not torch.allclose(got, grad, rtol=1e-4, atol=1e-6):
                problems.append(f"{param}: max error {float((got - grad).abs().max()):.3g}")
        if bp == 1 and "fc.weight" in whole:  # the shard really was local: fc saw half the rows
            alone = _gradients(model, DraftPlan(config, features), batch)[1]["fc.weight"]
            if torch.allclose(grads["fc.weight"], alone):
                problems.append("fc.weight gradient is the whole context's on one rank")
        errors[name] = problems
    if rank == 0:
        Path(results).write_text(json.dumps(errors))


@pytest.fixture(scope="module")
def offline(world, small_artifact, tmp_path_factory):
    """A feature artifact (with teacher rows) of the world's target over the small data (the
    target's forward of every row is its time): training from it reads that data."""
    from turbo_dllm.families.dflash.features import prepare_features

    out = tmp_path_factory.mktemp("cp-features") / "features"
    spec = drafter_spec(world["target"], small_artifact, "objective.max_anchors=6")
    prepare_features(spec, out, rows_per_shard=8, progress=False)
    return out


def test_a_cp_rank_reads_only_its_span_of_offline_features(offline):
    from turbo_dllm.families.dflash.features import FeatureStore

    store = FeatureStore(offline)
    rows = torch.tensor([0, 9, 3])  # across shards
    whole, teacher = store.lookup(rows, torch.device("cpu"))
    for span in (slice(0, 32), slice(32, 64), slice(16, 48)):
        part, part_teacher = store.lookup(rows, torch.device("cpu"), span=span)
        assert torch.equal(part, whole[:, span]) and torch.equal(part_teacher, teacher)


@pytest.mark.slow
def test_two_cp_processes_give_the_one_process_loss_and_every_gradient(
    world, small_artifact, offline, tmp_path
):
    results = tmp_path / "errors.json"
    features = (f"data.artifact={small_artifact}", f"model.dflash.features={offline}")
    cases = [*CASES, ("cp2-offline-features", features, 2, 1)]
    run_gloo(
        _worker, 2, tmp_path, str(world["target"]), str(world["artifact"]), str(results), cases,
        timeout_s=120,
    )  # fmt: skip
    errors = json.loads(results.read_text())
    assert errors == {name: [] for name, *_ in cases}


@pytest.mark.slow
def test_dllm_train_of_a_dflash2_drafter_under_cp_trains_the_one_process_trace(world, tmp_path):
    assert_two_processes_train_the_one_process_trace(
        world, tmp_path, ("topology.cp=2",), common=DFLASH2
    )
