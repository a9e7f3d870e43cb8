"""The tiny decoder under CSBP / CP with FSDP2 equals one rank: loss and every parameter gradient
(also trimmed, the `-trim` cases: the last layer attending from the noisy tokens alone, or for the
autoregressive objective the clean stream alone, `test_csbp_autoregressive`).

Each case runs on real gloo processes: the model is built on the meta device, sharded with FSDP2
over the (dp_shard, context) ranks, materialised with the same seed as the single-rank copy; the
objective corrupts the batch identically on every rank of a context group; `ContextParallel`
shards it; the local loss is divided by the global supervised-token count. The summed loss and the
full gradients must match a single process running every batch whole.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.distributed as dist

from tests.distributed.harness import declare_cases, errors_per_world
from turbo_dllm.config.runspec import ObjectiveSpec
from turbo_dllm.families.decoder.runtime import build_model
from turbo_dllm.registry import get_family
from turbo_dllm.train.attention import ReferenceAttention
from turbo_dllm.train.attention.trim import CLEAN_HALF, LAST_LAYER_QUERIES, LastLayerQueries
from turbo_dllm.train.objectives import NoiseKey, build_objective, score
from turbo_dllm.train.parallel.dims import ParallelDims
from turbo_dllm.train.parallel.layout import CsbpLayout
from turbo_dllm.train.parallel.plan import ContextParallel, WholeSequence
from turbo_dllm.train.weights import materialize

SEQ_LEN, BLOCK, ROWS, MASK_ID = 128, 16, 2, 511
RTOL = 5e-5  # float32, different summation orders (observed ~3e-6)

# (name, cp, bp, objective); the world gives dp = world / max(cp, bp)
TRIMS = frozenset({CLEAN_HALF, LAST_LAYER_QUERIES})
CASES: dict[int, list[tuple[str, int, int, str]]] = {
    2: [
        ("csbp-bp2-cp1-bd3", 1, 2, "block_diffusion"),
        ("csbp-bp2-cp2-bd3", 2, 2, "block_diffusion"),
        ("csbp-bp2-cp2-fastdllm", 2, 2, "fast_dllm_v2"),
        ("cp2-bd3", 2, 1, "block_diffusion"),
        ("cp2-fastdllm", 2, 1, "fast_dllm_v2"),
        ("split-block-bd3", 2, 2, "block_diffusion"),
        # the last layer attends from the noisy tokens alone (train.attention.trim)
        ("csbp-bp2-cp2-bd3-trim", 2, 2, "block_diffusion"),
        ("csbp-bp2-cp1-fastdllm-trim", 1, 2, "fast_dllm_v2"),
        ("cp2-bd3-trim", 2, 1, "block_diffusion"),
    ],
    4: [
        ("csbp-bp4-cp4-bd3", 4, 4, "block_diffusion"),
        ("csbp-bp4-cp2-fastdllm", 2, 4, "fast_dllm_v2"),
        ("csbp-bp4-cp1-fastdllm", 1, 4, "fast_dllm_v2"),
        ("csbp-bp2-cp2-dp2-bd3", 2, 2, "block_diffusion"),
        ("cp4-fastdllm", 4, 1, "fast_dllm_v2"),
        ("cp2-dp2-bd3", 2, 1, "block_diffusion"),
        ("csbp-bp4-cp2-bd3-trim", 2, 4, "block_diffusion"),
    ],
}


def _loader_batch(dp_rank: int, documents: bool = True) -> dict[str, torch.Tensor]:
    """`documents`: row 1 packs two documents (else every row is one document)."""
    gen = torch.Generator().manual_seed(1000 + dp_rank)
    input_ids = torch.randint(0, 500, (ROWS, SEQ_LEN), generator=gen)
    loss_mask = torch.ones(ROWS, SEQ_LEN, dtype=torch.bool)
    loss_mask[0, :10] = False  # a prompt that is not supervised
    doc_ids = torch.zeros(ROWS, SEQ_LEN, dtype=torch.int32)
    if documents:
        doc_ids[1, 50:] = 1  # two packed documents, split mid-block
    return {"input_ids": input_ids, "loss_mask": loss_mask, "doc_ids": doc_ids}


def _key(dp_rank: int, dp: int) -> NoiseKey:
    return NoiseKey(seed=7, step=3, first_sample=dp_rank * ROWS, samples_per_step=ROWS * dp)


def _split_block_plan(plan: ContextParallel) -> None:
    """Ranks 0 and 1 swap half of their first block (every token still has one owner)."""
    layouts = [
        CsbpLayout.build(SEQ_LEN, BLOCK, plan.dims.bp, plan.dims.cp, r) for r in range(plan.dims.bp)
    ]
    rank = plan.ctx_rank
    if rank < 2:
        own, other = layouts[rank], layouts[1 - rank]
        noisy = own.noisy_positions.clone()
        noisy[BLOCK // 2 : BLOCK] = other.noisy_positions[BLOCK // 2 : BLOCK]
        layouts[rank] = CsbpLayout(**{**own.__dict__, "noisy_positions": noisy})
    plan._layouts[(SEQ_LEN, BLOCK, "cpu")] = layouts[rank]  # (seq_len, block, device)


def _run_case(world: int, name: str, cp: int, bp: int, objective_name: str) -> float:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    context = max(cp, bp)
    dp = world // context
    dims = ParallelDims(dp_replicate=1, dp_shard=dp, cp=cp, bp=bp, tp=1, world_size=world)
    dims.build_mesh("cpu")
    dp_rank = dims.get_mesh("dp").get_local_rank()
    config = get_family("qwen3").resolve_config(path=None, from_config="tiny", overrides={})
    objective = build_objective(ObjectiveSpec(name=objective_name, block_size=BLOCK), MASK_ID)
    cpu = torch.device("cpu")
    batches = [_loader_batch(d, documents="-nodocs" not in name) for d in range(dp)]
    denominator = float(sum(objective.supervised_count(b) for b in batches))

    # --- one process, every batch whole --------------------------------------------------------
    reference = ReferenceAttention()
    single = materialize(build_model(config, reference), cpu, seed=5)
    single_loss = torch.zeros(())
    for d, batch in enumerate(batches):
        diffusion = objective.corrupt(batch, _key(d, dp))
        mask = reference.prepare(diffusion.layout, diffusion.doc_ids, cpu)
        positions = diffusion.layout.positions(cpu)
        single_loss = single_loss + single(
            diffusion.input_ids, positions, mask, output=partial(score, diffusion)
        )
    (single_loss / denominator).backward()
    expected = {n: p.grad for n, p in single.named_parameters()}

    # --- the parallel run --------------------------------------------------------------------
    trim = name.endswith("-trim")
    plan = ContextParallel(dims, trims=TRIMS if trim else frozenset())
    # a trimmed autoregressive batch runs the clean stream alone, sharded over the context group
    clean_half = trim and objective_name == "autoregressive"
    last_layer = trim and not clean_half
    if name.startswith("split-block"):
        _split_block_plan(plan)
    model = build_model(config, plan.attention_backend)
    fsdp_mesh = dims.get_mesh("dp_shard_ctx")
    for layer in model.model.layers:
        fully_shard(layer, mesh=fsdp_mesh)
    fully_shard(model, mesh=fsdp_mesh)
    model = materialize(model, cpu, seed=5)
    diffusion = objective.corrupt(batches[dp_rank], _key(dp_rank, dp))
    inputs = plan.prepare(diffusion, cpu)
    assert isinstance(inputs.mask, LastLayerQueries) == last_layer, name
    if clean_half:  # the rank's rows: its share of the clean stream alone
        assert inputs.input_ids.shape[1] == SEQ_LEN // context, name
    # the FLOPs each rank counts for the batch: the trimmed model's, as on one rank
    whole = WholeSequence(reference, plan.trims)
    assert plan.work(diffusion) == whole.work(diffusion), name
    assert ("last_layer" in plan.work(diffusion)) == last_layer, name
    assert (plan.work(diffusion)["stream_tokens"] == diffusion.stream_tokens // 2) == clean_half
    local = model(
        inputs.input_ids, inputs.positions, inputs.mask, output=partial(score, inputs.batch)
    )
    loss = local / denominator
    (loss * fsdp_mesh.size()).backward()  # FSDP averages gradients over its ranks
    total = loss.detach().clone()
    dist.all_reduce(total)
    error = abs(float(total) - float(single_loss) / denominator) / abs(
        float(single_loss) / denominator
    )
    # every scored token is scored by exactly one rank of the context group
    scored = torch.tensor(float(inputs.batch.num_scored))
    dist.all_reduce(scored, group=dims.get_mesh("context").get_group())
    error = max(error, abs(float(scored) - diffusion.num_scored))
    for param_name, param in model.named_parameters():
        grad = param.grad.full_tensor() if isinstance(param.grad, DTensor) else param.grad
        ref = expected[param_name]
        scale = float(ref.abs().max()) or 1.0
        error = max(error, float((grad - ref).abs().max()) / scale)
    return error


declare_cases("model", _run_case, CASES)  # run with the other modules' cases (harness)


@pytest.fixture(scope="module")
def errors(tmp_path_factory):
    return errors_per_world(_run_case, CASES, tmp_path_factory, "model")


@pytest.mark.parametrize(
    "world,name",
    [(w, c[0]) for w, cases in CASES.items() for c in cases if not c[0].startswith("split")],
)
def test_loss_and_every_gradient_equal_single_rank(errors, world, name):
    assert errors[world][name] < RTOL, (name, errors[world][name])


def test_splitting_a_block_changes_loss_or_gradients(errors):
    assert errors[2]["split-block-bd3"] > 1e-2, errors[2]["split-block-bd3"]
