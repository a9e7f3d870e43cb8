"""DiffusionGemma context and block parallelism (gloo, 2 processes) equal one process.

Model level: the same weights (deterministic init), the same 2-row batch on both ranks (a
context group shares its sequences), native-SFT loss with self-conditioning, a canvas that
starts mid-block (response start 2, block 8) and sliding windows shorter than the stream.
cp 2: each rank feeds its zigzag share of [canvas ; clean] and all-gathers K/V per layer; bp 2:
each rank its dual-end pair of canvas blocks and the whole clean stream (scoring half of its
next-token loss). Summed over the ranks the loss and every gradient (FSDP2 over the two ranks,
as the trainer shards) equal one process's, alone and with the experts sharded over the same two
ranks (ep 2: each rank dispatches the tokens it holds). Then `dllm train` at cp 2 + ep 2 and at
bp 2 trains the single-process trace.
"""

from __future__ import annotations

import json
from functools import cache, partial

import pytest
import torch

from tests.distributed.harness import declare_cases, errors_per_world


def _batch():
    torch.manual_seed(0)
    ids = torch.randint(0, 512, (2, 32))
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[:, 2:] = True  # the response (canvas) starts mid-block: 4 blocks of 8 from position 2
    return {"input_ids": ids, "loss_mask": mask}


def _loss_and_grads(world: int, cp: int = 1, bp: int = 1, ep: int = 1):
    from torch.distributed.tensor import DTensor

    from turbo_dllm.config.topology import ParallelLayout
    from turbo_dllm.families.diffusion_gemma import runtime
    from turbo_dllm.families.diffusion_gemma.attention import StreamAttention
    from turbo_dllm.families.diffusion_gemma.config import PRESETS, DiffusionGemmaConfig
    from turbo_dllm.train.attention import ReferenceAttention
    from turbo_dllm.train.distributed import apply_fsdp
    from turbo_dllm.train.objectives import NoiseKey, score
    from turbo_dllm.train.objectives.diffusiongemma_sft import DiffusionGemmaSft
    from turbo_dllm.train.parallel.dims import ParallelDims
    from turbo_dllm.train.parallel.ep import expert_parameters, reduce_expert_grads
    from turbo_dllm.train.weights import materialize, named_parameters_clean

    hf = json.loads(json.dumps(PRESETS["tiny"]))
    hf["text_config"]["sliding_window"] = 12  # shorter than the clean stream and the prefixes
    config = DiffusionGemmaConfig.from_hf_dict(hf)
    layout = ParallelLayout(cp=cp, bp=bp, ep=ep)
    dims = ParallelDims.from_layout(layout, world) if world > 1 else None
    mesh = dims.build_mesh("cpu") if dims else None
    plan = runtime.build_sequence_plan(
        dims, StreamAttention(ReferenceAttention(), config), spec=None, config=config, device=None
    )
    model = runtime.build_model(config, plan.attention_backend)
    experts = None
    if ep > 1:  # as the trainer: experts sharded before FSDP2, which then leaves them alone
        replicas = dims.get_mesh("ep_replica")
        runtime.apply_expert_parallel(
            model,
            dims.get_mesh("ep"),
            replicas.get_group() if replicas.size() > 1 else None,
            dims.grad_average_size,
        )
        experts = expert_parameters(model)
    if mesh is not None:
        apply_fsdp(model, runtime.layers(model), mesh, ignored_params=experts)
    model = materialize(model, torch.device("cpu"), seed=0)
    assert model._dispatching() == (ep > 1)
    objective = DiffusionGemmaSft(block_size=8, vocab_size=512, self_conditioning_probability=0.5)
    batch = _batch()
    examples, pairs = objective.supervised_count(batch)
    d = objective.corrupt(batch, NoiseKey(seed=0, step=0, first_sample=0, samples_per_step=2))
    inputs = plan.prepare(d, torch.device("cpu"))
    sums = model(
        inputs.input_ids,
        inputs.positions,
        inputs.mask,
        output=partial(score, inputs.batch),
        **d.model_kwargs,
    )
    loss = (sums / torch.tensor([examples, pairs], dtype=torch.float32)).sum()
    (loss * (dims.grad_average_size if dims else 1)).backward()
    if ep > 1:
        reduce_expert_grads(model)
    grads = {}
    for name, param in named_parameters_clean(model):
        if param.grad is not None:
            g = param.grad
            grads[name] = (g.full_tensor() if isinstance(g, DTensor) else g).detach()
    return loss.detach(), grads


# name -> (cp, bp, ep), on 2 processes
CASES = {"cp2": (2, 1, 1), "cp2-ep2": (2, 1, 2), "bp2": (1, 2, 1), "bp2-ep2": (1, 2, 2)}


@cache
def _single_process():
    """One process's loss and gradients (rank 0 computes it once)."""
    return _loss_and_grads(1)


def _run_case(world: int, name: str, cp: int, bp: int, ep: int) -> list[str]:
    """On every rank; rank 0 compares the summed loss and every gradient with one process's
    and returns the differences."""
    import torch.distributed as dist

    loss, grads = _loss_and_grads(world, cp, bp, ep)
    dist.all_reduce(loss)
    if dist.get_rank() != 0:
        return []
    return _differences(loss, grads, *_single_process())


def _differences(loss, grads, single_loss, single) -> list[str]:
    errors = []
    if not torch.allclose(loss, single_loss, rtol=1e-5, atol=1e-6):
        errors.append(f"loss {float(loss)} != {float(single_loss)}")
    if sorted(grads) != sorted(single):
        errors.append(f"gradients of {sorted(set(grads) ^ set(single))}")
    for key, want in single.items():
        # float32 sums in another order (gathered keys, split chunks): relative to the tensor's
        # scale, not elementwise (an elementwise 1e-4 flags ~1e-5 relative differences)
        if key not in grads:
            continue
        error, scale = float((grads[key] - want).abs().max()), float(want.abs().max())
        if error > 5e-5 * scale + 1e-7:
            errors.append(f"{key}: {error:.3g} of {scale:.3g}")
    return errors


# world -> [(name, cp, bp, ep)]: run on the processes tests/distributed shares (harness)
WORLD_CASES = {2: [(name, *layout) for name, layout in CASES.items()]}
declare_cases("gemma-cp", _run_case, WORLD_CASES)


@pytest.fixture(scope="module")
def errors(tmp_path_factory):
    return errors_per_world(_run_case, WORLD_CASES, tmp_path_factory, "gemma-cp")[2]


@pytest.mark.slow
def test_cp2_and_bp2_alone_and_with_ep2_equal_one_process_in_loss_and_every_gradient(errors):
    assert errors == {name: [] for name in CASES}


SFT = {
    "launch": {"seed": 0},
    "model": {"family": "diffusion_gemma", "from_config": "tiny"},
    "objective": {"name": "diffusiongemma_sft", "block_size": 16},
    "data": {"synthetic": {"num_sequences": 16, "vocab_size": 512}, "seq_len": 64},
    "training": {"micro_batch_size": 2, "steps": 3},
    "optimizer": {"lr": 0.003},
    "scheduler": {"name": "constant", "warmup_steps": 0},
    "checkpoint": {"interval": None},
    "logging": {"console": False},
}


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """The single-process trace both layouts must reproduce (one run for both)."""
    from tests.train.util import tiny_spec
    from turbo_dllm.train.entry import train

    run_dir = tmp_path_factory.mktemp("gemma-single") / "single"
    train(tiny_spec(base=SFT), run_dir)
    return run_dir


@pytest.mark.slow
@pytest.mark.parametrize("topology", [("cp=2", "ep=2"), ("bp=2",)], ids=["cp2-ep2", "bp2"])
def test_dllm_train_at_cp2_ep2_and_bp2_trains_the_single_process_trace(tmp_path, topology, single):
    """The trainer's path: the family's plan hook, the rules, FSDP2 over the context ranks and
    the expert meshes on a context-parallel layout (the other mixes: the model-level test)."""
    from tests.train.util import losses, metrics, torchrun, write_config

    cp2 = tmp_path / "cp2"
    config = write_config(tmp_path / "train.yaml", base=SFT)
    sets = [arg for axis in topology for arg in ("--set", f"topology.{axis}")]
    torchrun(2, "train", "--config", str(config), "--run-dir", str(cp2), *sets, cwd=tmp_path)
    tol = {"rtol": 5e-5, "atol": 5e-5}
    torch.testing.assert_close(losses(cp2), losses(single), **tol)
    grad_norms = [[r["grad_norm"] for r in metrics(d)] for d in (cp2, single)]
    torch.testing.assert_close(grad_norms[0][0], grad_norms[1][0], **tol)
    # Later steps: float32 reordering, which Adam's normalised updates amplify (since the
    # MoE branch's norms start at one, as transformers', that branch is live and its reordered
    # sums reach step 3's grad norm at ~1e-3; step 1's gradients above and every step's loss
    # hold 5e-5, and the model-level test holds every gradient).
    torch.testing.assert_close(grad_norms[0], grad_norms[1], rtol=2e-3, atol=2e-3)


def test_the_cp_ep_recipe_passes_every_rule_but_its_data_folder():
    import yaml

    from turbo_dllm.config.recipe_catalog import find_recipe
    from turbo_dllm.config.runspec import RunSpec
    from turbo_dllm.config.validate import problems

    recipe = find_recipe("2xh200/diffusiongemma-sft-32k-cp2-ep2")
    spec = RunSpec.model_validate(yaml.safe_load(recipe.text))
    assert (spec.topology.cp, spec.topology.ep) == (2, 2)
    assert [p for p in problems(spec) if p.path != "data.artifact"] == []
