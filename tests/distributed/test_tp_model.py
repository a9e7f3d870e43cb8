"""Tensor parallelism equals one rank: loss, every parameter gradient and the clipped grad norm.

Real gloo processes build the tiny decoder the trainer's way (meta model -> tensor parallelism ->
FSDP2 over the sliced dp mesh -> materialise with the single-rank seed), run the block-diffusion
objective on their share of the batch and backpropagate. The summed loss, the full gradients and
`clip_grad_norm` (mixed 2-D dp x tp and 1-D dp DTensors) must match a single process.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.distributed as dist

from tests.distributed.harness import declare_cases, errors_per_world
from turbo_dllm.config.runspec import ObjectiveSpec
from turbo_dllm.errors import DllmError
from turbo_dllm.families.decoder.runtime import (
    apply_tensor_parallel,
    build_model,
    check_tensor_parallel,
)
from turbo_dllm.registry import get_family
from turbo_dllm.train.attention import build_attention
from turbo_dllm.train.distributed import (
    apply_fsdp,
    apply_mlp_chunking,
    clip_grad_norm,
    replicate_partial_grads,
)
from turbo_dllm.train.objectives import NoiseKey, build_objective, score
from turbo_dllm.train.parallel.dims import ParallelDims
from turbo_dllm.train.parallel.plan import build_sequence_plan
from turbo_dllm.train.weights import materialize

SEQ_LEN, BLOCK, ROWS, MASK_ID = 64, 8, 2, 511
RTOL = 5e-5  # float32, different summation orders
# The tiny preset with 2 layers: 4 query heads, 2 key/value heads, intermediate 384.
OVERRIDES = {"num_hidden_layers": 2}

# (name, fsdp, cp, bp); tp = world / (fsdp * max(cp, bp)); "-sp": sequence parallelism on,
# "-chunks": the MLPs run in 3 token pieces
CASES: dict[int, list[tuple[str, int, int, int]]] = {
    2: [("tp2", 1, 1, 1), ("tp2-sp", 1, 1, 1)],
    4: [
        ("tp2-fsdp2", 2, 1, 1),
        ("tp2-csbp-cp2-bp2", 1, 2, 2),
        ("tp2-sp-fsdp2", 2, 1, 1),
        ("tp2-sp-csbp-cp2-bp2", 1, 2, 2),
        ("tp2-sp-chunks-fsdp2", 2, 1, 1),
        ("tp2-sp-cp2", 1, 2, 1),
    ],
}


def _loader_batch(dp_rank: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(2000 + dp_rank)
    input_ids = torch.randint(0, 500, (ROWS, SEQ_LEN), generator=gen)
    loss_mask = torch.ones(ROWS, SEQ_LEN, dtype=torch.bool)
    loss_mask[0, :6] = False
    doc_ids = torch.zeros(ROWS, SEQ_LEN, dtype=torch.int32)
    doc_ids[1, 30:] = 1
    return {"input_ids": input_ids, "loss_mask": loss_mask, "doc_ids": doc_ids}


def _key(dp_rank: int, dp: int) -> NoiseKey:
    return NoiseKey(seed=3, step=1, first_sample=dp_rank * ROWS, samples_per_step=ROWS * dp)


def _run_case(
    world: int,
    name: str,
    fsdp: int,
    cp: int,
    bp: int,
    device: str = "cpu",
    attention: str = "reference",
) -> dict[str, float]:
    """Errors of the parallel run against one process (relative; `tp_sharded_params` a count)."""
    from torch.distributed.tensor import DTensor

    tp = world // (fsdp * max(cp, bp))
    dims = ParallelDims(dp_replicate=1, dp_shard=fsdp, cp=cp, bp=bp, tp=tp, world_size=world)
    cpu = torch.device(device)
    fsdp_mesh = dims.build_mesh(cpu.type)
    dp_rank = dims.dp_rank
    config = get_family("qwen3").resolve_config(path=None, from_config="tiny", overrides=OVERRIDES)
    objective = build_objective(ObjectiveSpec(name="block_diffusion", block_size=BLOCK), MASK_ID)
    batches = [_loader_batch(d) for d in range(fsdp)]
    denominator = float(sum(objective.supervised_count(b) for b in batches))

    # --- one process, every batch whole ------------------------------------------------------
    reference = build_attention(attention, cpu)
    single = materialize(build_model(config, reference), cpu, seed=5)
    single_loss = torch.zeros((), device=cpu)
    for d, batch in enumerate(batches):
        diffusion = objective.corrupt(batch, _key(d, fsdp)).to(cpu)
        mask = reference.prepare(diffusion.layout, diffusion.doc_ids, cpu)
        positions = diffusion.layout.positions(cpu)
        single_loss = single_loss + single(
            diffusion.input_ids, positions, mask, output=partial(score, diffusion)
        )
    single_loss = single_loss / denominator
    single_loss.backward()
    expected = {n: p.grad.clone() for n, p in single.named_parameters()}
    expected_norm = float(clip_grad_norm(list(single.parameters()), 0.5))

    # --- the parallel run (the trainer's order) ----------------------------------------------
    plan = build_sequence_plan(dims, build_attention(attention, cpu))
    model = build_model(config, plan.attention_backend)
    apply_tensor_parallel(model, dims.get_mesh("tp"), sequence_parallel="sp" in name.split("-"))
    if "chunks" in name.split("-"):
        apply_mlp_chunking(
            model.model.layers, 3
        )  # pieces of 16 of a rank's 48 local tokens (uneven split)
    if fsdp_mesh is not None:
        apply_fsdp(model, model.model.layers, fsdp_mesh)
    model = materialize(model, cpu, seed=5)
    diffusion = objective.corrupt(batches[dp_rank], _key(dp_rank, fsdp)).to(cpu)
    inputs = plan.prepare(diffusion, cpu)
    # How many of this rank's tokens the residual stream holds between blocks (1/tp with SP).
    seen = []
    norm = model.model.layers[0].post_attention_layernorm
    norm.register_forward_hook(
        lambda _m, _args, out: seen.append(
            (out.to_local() if isinstance(out, DTensor) else out).shape[1]
        )
    )
    local = model(
        inputs.input_ids, inputs.positions, inputs.mask, output=partial(score, inputs.batch)
    )
    loss = local / denominator
    (loss * dims.grad_average_size).backward()  # FSDP averages over the non-tp ranks
    replicate_partial_grads(model.parameters())  # as the trainer does before clipping
    pending = [
        n
        for n, p in model.named_parameters()
        if isinstance(p.grad, DTensor) and p.grad.placements != p.placements
    ]
    assert not pending, pending  # every gradient in its parameter's layout for the optimizer
    total = loss.detach().clone()
    dist.all_reduce(total, group=dims.loss_group())
    want = float(single_loss.detach())
    errors = {"loss": abs(float(total) - want) / abs(want)}
    errors["stream_fraction"] = seen[0] / inputs.input_ids.shape[1]
    grad_error = 0.0
    sharded = 0
    for param_name, param in model.named_parameters():
        grad = param.grad.full_tensor() if isinstance(param.grad, DTensor) else param.grad
        if isinstance(param, DTensor) and "tp" in (param.device_mesh.mesh_dim_names or ()):
            sharded += 1
        ref = expected[param_name]
        scale = float(ref.abs().max()) or 1.0
        grad_error = max(grad_error, float((grad - ref).abs().max()) / scale)
    errors["grads"] = grad_error
    errors["tp_sharded_params"] = sharded
    norm = float(clip_grad_norm(list(model.parameters()), 0.5))
    errors["norm"] = abs(norm - expected_norm) / expected_norm
    # After clipping every gradient is scaled by the same factor as the single-rank one.
    clipped = 0.0
    for param_name, param in model.named_parameters():
        grad = param.grad.full_tensor() if isinstance(param.grad, DTensor) else param.grad
        ref = dict(single.named_parameters())[param_name].grad
        clipped = max(clipped, float((grad - ref).abs().max()) / (float(ref.abs().max()) or 1.0))
    errors["clipped"] = clipped
    # An optimizer step over the mixed meshes runs: foreach (CPU) and fused (the trainer on CUDA).
    # With tp alone the replicated parameters stay plain: the trainer loops over tensors there.
    mixed = len({isinstance(p, DTensor) for p in model.parameters()}) > 1
    for fused, foreach in [(False, False)] if mixed else [(False, True), (True, False)]:
        torch.optim.AdamW(model.parameters(), lr=1e-3, fused=fused, foreach=foreach).step()
    return errors


declare_cases("tp-model", _run_case, CASES)  # run with the other modules' cases (harness)


@pytest.fixture(scope="module")
def errors(tmp_path_factory):
    return errors_per_world(_run_case, CASES, tmp_path_factory, "tp-model")


@pytest.mark.parametrize("world,name", [(w, c[0]) for w, cases in CASES.items() for c in cases])
def test_tensor_parallel_loss_gradients_and_norm_equal_single_rank(errors, world, name):
    found = errors[world][name]
    # 7 projections and the q/k norms (replicated, head-sharded inputs) per layer; with
    # sequence parallelism also both layer norms and the final norm (sequence-sharded inputs)
    layers = OVERRIDES["num_hidden_layers"]
    expected = 11 * layers + 1 if "sp" in name.split("-") else 9 * layers
    assert found["tp_sharded_params"] == expected, found
    assert found["stream_fraction"] == (0.5 if "sp" in name.split("-") else 1.0), found
    for key in ("loss", "grads", "norm", "clipped"):
        assert found[key] < RTOL, (name, key, found)


def test_heads_not_divisible_by_tp_is_a_clear_error():
    config = get_family("qwen3").resolve_config(
        path=None, from_config="tiny", overrides={"num_attention_heads": 6, "head_dim": 16}
    )
    with pytest.raises(DllmError, match="num_key_value_heads = 2 is not divisible by") as info:
        check_tensor_parallel(config, 4)
    message = info.value.message
    assert "num_attention_heads = 6 is not divisible by topology.tp = 4" in message
    assert "intermediate_size" not in message  # 384 divides by 4
    assert "6" in info.value.hint and "384" in info.value.hint
    check_tensor_parallel(config, 2)  # 6, 2 and 384 all divide by 2
