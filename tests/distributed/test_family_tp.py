"""The qwen3_8 and nemotron_diffusion families split over ranks equal one process.

Real gloo processes build each family's tiny model the trainer's way (meta model -> the family's
tensor-parallel plan -> FSDP2 -> materialise with the single-process seed), run an objective on
their share of the batches (data parallel: their own batch; context parallel: their tokens) and
backpropagate; the summed loss and every full gradient must match one process.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch

from tests.distributed.harness import declare_cases, errors_per_world
from turbo_dllm.config.runspec import ObjectiveSpec
from turbo_dllm.registry import get_family
from turbo_dllm.train.attention import build_attention
from turbo_dllm.train.distributed import replicate_partial_grads
from turbo_dllm.train.objectives import NoiseKey, build_objective, score
from turbo_dllm.train.parallel.dims import ParallelDims
from turbo_dllm.train.parallel.plan import build_sequence_plan
from turbo_dllm.train.weights import materialize

SEQ_LEN, BLOCK, ROWS, MASK_ID = 32, 8, 2, 100
RTOL = 5e-5
QWEN = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 96}
NEMOTRON = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "head_dim": 16,
    # every attention variant, so each topology splits them too
    "qk_norm": True,
    "v_norm": True,
    "attn_output_gate": True,
}
# (name, family, objective, overrides, fsdp, cp, bp); "-dp2" in the name: two data-parallel
# replicas; tp = world / (dp * fsdp * max(cp, bp)); "-sp": sequence parallelism on
CASES = {
    2: [
        ("qwen3_8-tp2", "qwen3_8", "fast_dllm_v2", QWEN, 1, 1, 1),
        ("qwen3_8-tp2-bd", "qwen3_8", "block_diffusion", QWEN, 1, 1, 1),
        ("qwen3_8-tp2-sp", "qwen3_8", "fast_dllm_v2", QWEN, 1, 1, 1),
        ("qwen3_8-dp2", "qwen3_8", "fast_dllm_v2", QWEN, 1, 1, 1),
        # cp: the clean state handed rank 0 -> 1 -> 1 -> 0 over the zigzag chunks
        ("qwen3_8-cp2", "qwen3_8", "fast_dllm_v2", QWEN, 1, 2, 1),
        ("qwen3_8-cp2-bd", "qwen3_8", "block_diffusion", QWEN, 1, 2, 1),
        ("qwen3_8-fsdp2", "qwen3_8", "fast_dllm_v2", QWEN, 2, 1, 1),
        ("qwen3_8-csbp-bp2", "qwen3_8", "fast_dllm_v2", QWEN, 1, 1, 2),
        ("qwen3_8-csbp-bp2-bd", "qwen3_8", "block_diffusion", QWEN, 1, 1, 2),
        ("nemotron-tp2", "nemotron_diffusion", "block_diffusion", NEMOTRON, 1, 1, 1),
        ("nemotron-tp2-sp", "nemotron_diffusion", "block_diffusion", NEMOTRON, 1, 1, 1),
        ("nemotron-fsdp2", "nemotron_diffusion", "block_diffusion", NEMOTRON, 2, 1, 1),
        ("nemotron-dp2", "nemotron_diffusion", "block_diffusion", NEMOTRON, 1, 1, 1),
        ("nemotron-cp2", "nemotron_diffusion", "block_diffusion", NEMOTRON, 1, 2, 1),
        ("nemotron-csbp-bp2", "nemotron_diffusion", "block_diffusion", NEMOTRON, 1, 1, 2),
    ],
    4: [
        # FSDP2 over tp-sharded heads (dt_bias / A_log Shard(0), the Partial conv and norm grads)
        ("qwen3_8-fsdp2-tp2", "qwen3_8", "fast_dllm_v2", QWEN, 2, 1, 1),
        # the clean state handed over cp while each rank runs half the heads
        ("qwen3_8-cp2-tp2", "qwen3_8", "fast_dllm_v2", QWEN, 1, 2, 1),
        ("nemotron-csbp-cp2-bp2", "nemotron_diffusion", "block_diffusion", NEMOTRON, 1, 2, 2),
    ],
}


def _batch(dp_rank: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(7 + dp_rank)
    loss_mask = torch.ones(ROWS, SEQ_LEN, dtype=torch.bool)
    loss_mask[0, :5] = False
    return {
        "input_ids": torch.randint(0, 500, (ROWS, SEQ_LEN), generator=gen),
        "loss_mask": loss_mask,
    }


def _forward(runtime, model, inputs):
    mask = getattr(runtime, "model_mask", lambda i: i.mask)(inputs)
    return model(inputs.input_ids, inputs.positions, mask, output=partial(score, inputs.batch))


def _key(dp_rank: int, dp: int) -> NoiseKey:
    return NoiseKey(seed=1, step=0, first_sample=dp_rank * ROWS, samples_per_step=ROWS * dp)


def _value_heads_seen(run) -> dict:
    """run() with the qwen3_8 gated delta rule watched: the most value heads one call got."""
    from turbo_dllm.families.qwen3_8 import model as hybrid

    rule, seen = hybrid.gated_delta_rule, [0]

    def watched(q, k, v, *args, **kwargs):
        seen[0] = max(seen[0], v.shape[2])
        return rule(q, k, v, *args, **kwargs)

    hybrid.gated_delta_rule = watched
    try:
        result = run()
    finally:
        hybrid.gated_delta_rule = rule
    return {"result": result, "value_heads": seen[0]}


def _run_case(
    world: int, name: str, family_name: str, objective_name: str, overrides, fsdp, cp, bp
) -> dict:
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from turbo_dllm.train.distributed import apply_fsdp

    cpu = torch.device("cpu")
    family = get_family(family_name)
    runtime = family.runtime()
    config = family.resolve_config(path=None, from_config="tiny", overrides=overrides)
    objective = build_objective(ObjectiveSpec(name=objective_name, block_size=BLOCK), MASK_ID)
    dp = 2 if "-dp2" in name else 1
    data = dp * fsdp  # data-parallel ranks: each its own batch
    batches = [_batch(d) for d in range(data)]
    denominator = float(sum(objective.supervised_count(b) for b in batches))

    # --- one process, every batch whole ------------------------------------------------------
    single_plan = build_sequence_plan(None, build_attention("reference", cpu))
    single = materialize(runtime.build_model(config, single_plan.attention_backend), cpu, seed=5)
    single_loss = sum(
        _forward(runtime, single, single_plan.prepare(objective.corrupt(b, _key(d, data)), cpu))
        for d, b in enumerate(batches)
    )
    (single_loss / denominator).backward()
    want = float(single_loss) / denominator

    # --- the parallel run (the trainer's order) ----------------------------------------------
    tp = world // (data * max(cp, bp))
    dims = ParallelDims(dp_replicate=dp, dp_shard=fsdp, cp=cp, bp=bp, tp=tp, world_size=world)
    fsdp_mesh = dims.build_mesh(cpu.type)
    plan = build_sequence_plan(dims, build_attention("reference", cpu))
    model = runtime.build_model(config, plan.attention_backend)
    if tp > 1:
        runtime.apply_tensor_parallel(
            model, dims.get_mesh("tp"), sequence_parallel=name.endswith("-sp")
        )
    if fsdp_mesh is not None:
        apply_fsdp(model, runtime.layers(model), fsdp_mesh)
    model = materialize(model, cpu, seed=5)
    diffusion = objective.corrupt(batches[dims.dp_rank], _key(dims.dp_rank, data))
    heads = _value_heads_seen(lambda: _forward(runtime, model, plan.prepare(diffusion, cpu)))
    loss, errors = heads.pop("result") / denominator, heads
    (loss * dims.grad_average_size).backward()
    replicate_partial_grads(model.parameters())
    total = loss.detach().clone()
    dist.all_reduce(total, group=dims.loss_group())
    errors["loss"] = abs(float(total) - want) / abs(want)
    reference = dict(single.named_parameters())
    worst, sharded = 0.0, 0
    for param_name, param in model.named_parameters():
        sharded += isinstance(param, DTensor)
        grad = param.grad.full_tensor() if isinstance(param.grad, DTensor) else param.grad
        ref = reference[param_name].grad
        error = float((grad - ref).abs().max()) / (float(ref.abs().max()) or 1.0)
        if error >= worst:
            worst, errors["worst_grad"] = error, param_name
    errors["grads"] = worst
    errors["sharded"] = sharded
    return errors


declare_cases("family-tp", _run_case, CASES)  # run with the other modules' cases (harness)


@pytest.fixture(scope="module")
def errors(tmp_path_factory):
    return errors_per_world(_run_case, CASES, tmp_path_factory, "family-tp")


@pytest.mark.parametrize(
    "world,name", [(world, case[0]) for world, cases in CASES.items() for case in cases]
)
def test_family_split_over_ranks_equals_one_process(errors, world, name):
    found = errors[world][name]
    if "-tp" in name or "-fsdp" in name or "-dp" in name:
        assert found["sharded"] > 0, found
    if name.startswith("qwen3_8"):  # the delta rule runs this rank's heads only under tp
        heads = 4 // (2 if "-tp2" in name else 1)  # the tiny preset: 4 value heads
        assert found["value_heads"] == heads, found
    assert found["loss"] < RTOL and found["grads"] < RTOL, (name, found)
