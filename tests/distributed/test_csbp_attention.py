"""CSBP and the CP baseline against the single-rank 2L attention, on real gloo processes.

One spawn per world size runs every layout; each rank builds the mesh with `ParallelDims`,
shards a float64 batch by its layout, runs the parallel attention forward and backward, and
scatters its outputs and dq/dk/dv back into full-sequence buffers that are summed over the
context group. Those must equal the single-rank attention with the block-diffusion mask. A layout
that splits a diffusion block across two ranks must NOT match (the harness can fail).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from tests.distributed.harness import declare_cases, errors_per_world
from turbo_dllm.train.parallel.cp import CpAttention
from turbo_dllm.train.parallel.csbp import CsbpAttention
from turbo_dllm.train.parallel.dims import ParallelDims
from turbo_dllm.train.parallel.layout import CpLayout, CsbpLayout
from turbo_dllm.train.parallel.partial_attention import dense_attention_with_lse
from turbo_dllm.train.parallel.visibility import tokens_mask, two_stream_tokens

TOLERANCE = 5e-6  # float64 inputs; the merge op takes float32 log-sum-exps
HEADS, KV_HEADS, HEAD_DIM, BATCH = 4, 2, 16, 2  # head_dim >= 16 for flex on GPU


# --- cases -----------------------------------------------------------------------------------
# (name, mode, cp, bp, seq_len, block_size); the world decides dp = world / max(cp, bp).
CASES: dict[int, list[tuple[str, str, int, int, int, int]]] = {
    2: [
        ("csbp-bp2-cp1", "csbp", 1, 2, 64, 4),
        ("csbp-bp2-cp2", "csbp", 2, 2, 64, 4),
        ("cp-baseline-cp2", "cp", 2, 1, 64, 4),
        ("csbp-bp2-split-block", "broken", 2, 2, 64, 4),
    ],
    4: [
        ("csbp-bp4-cp1", "csbp", 1, 4, 64, 4),
        ("csbp-bp4-cp2", "csbp", 2, 4, 64, 4),
        ("csbp-bp4-cp4", "csbp", 4, 4, 64, 4),
        ("csbp-bp4-cp2-odd-blocks", "csbp", 2, 4, 44, 4),
        ("csbp-bp2-cp2-dp2", "csbp", 2, 2, 64, 4),
        ("cp-baseline-cp4", "cp", 4, 1, 64, 4),
        ("cp-baseline-cp2-dp2", "cp", 2, 1, 64, 4),
        ("csbp-bp4-split-block", "broken", 4, 4, 64, 4),
    ],
}


def _split_block(layouts: list[CsbpLayout], ctx_rank: int) -> CsbpLayout:
    """Ranks 0 and 1 swap the second half of their first block: every token still has one owner,
    but two diffusion blocks are now split across ranks."""
    own = layouts[ctx_rank]
    if ctx_rank > 1:
        return own
    other = layouts[1 - ctx_rank]
    half, size = own.block_size // 2, own.block_size
    noisy = own.noisy_positions.clone()
    noisy[half:size] = other.noisy_positions[half:size]
    return CsbpLayout(**{**own.__dict__, "noisy_positions": noisy})


def _batch(seed: int, seq_len: int):
    gen = torch.Generator().manual_seed(seed)

    def rand(heads):
        return torch.randn(BATCH, heads, 2 * seq_len, HEAD_DIM, generator=gen, dtype=torch.float64)

    q, k, v, grad = rand(HEADS), rand(KV_HEADS), rand(KV_HEADS), rand(HEADS)
    docs = torch.zeros(BATCH, seq_len, dtype=torch.long)
    docs[1, seq_len // 3 :] = 1  # packed documents in row 1, cut mid-block
    docs[1, (2 * seq_len) // 3 :] = 2
    return q, k, v, grad, docs


def _reference(q, k, v, grad, docs, block_size):
    seq_len = docs.shape[1]
    tokens = two_stream_tokens(torch.arange(seq_len), block_size=block_size, doc_ids=docs)
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out, _ = dense_attention_with_lse(q, k, v, tokens_mask(tokens, tokens))
    (out * grad).sum().backward()
    return out.detach(), q.grad, k.grad, v.grad


def _run_case(world, mode, cp, bp, seq_len, block_size, device="cpu", backend="reference") -> float:
    """Max abs difference to the reference over outputs and q/k/v gradients (all ranks).

    The reference is float64 on the CPU; on a GPU the parallel side runs in float32.
    """
    dims = ParallelDims(
        dp_replicate=1, dp_shard=world // max(cp, bp), cp=cp, bp=bp, tp=1, world_size=world
    )
    dims.build_mesh(torch.device(device).type)
    dtype = torch.float64 if torch.device(device).type == "cpu" else torch.float32
    ctx_mesh = dims.get_mesh("context")
    ctx_rank, dp_rank = ctx_mesh.get_local_rank(), dims.get_mesh("dp").get_local_rank()
    q, k, v, grad, docs = _batch(seed=100 + dp_rank, seq_len=seq_len)
    ref = [t.to(device) for t in _reference(q, k, v, grad, docs, block_size)]
    grad, docs = grad.to(device), docs.to(device)
    clean_group = dims.get_mesh("cp").get_group() if cp > 1 else None
    if mode == "cp":
        layout = CpLayout.build(seq_len, block_size, cp, ctx_rank)
        attention = CpAttention(layout, docs, clean_group, backend=backend)
        index = torch.cat([layout.positions, seq_len + layout.positions])
    else:
        layouts = [CsbpLayout.build(seq_len, block_size, bp, cp, r) for r in range(bp)]
        layout = _split_block(layouts, ctx_rank) if mode == "broken" else layouts[ctx_rank]
        attention = CsbpAttention(layout, docs, clean_group, backend=backend)
        index = torch.cat([layout.noisy_positions, seq_len + layout.clean_positions])
    index = index.to(device)
    local = [t.to(device, dtype)[:, :, index].requires_grad_() for t in (q, k, v)]
    out = attention(*local)
    # Tokens held by several ranks (replicated clean stream) share their upstream gradient.
    holders = torch.zeros(2 * seq_len, dtype=torch.float64, device=device)
    holders[index] = 1.0
    dist.all_reduce(holders, group=ctx_mesh.get_group())
    (out * (grad[:, :, index] / holders[index][:, None]).to(dtype)).sum().backward()
    # Replicated outputs count once; gradients are partial sums, so they simply add up.
    shared = (out.detach() / holders[index][:, None], *(t.grad for t in local))
    shared = [t.to(torch.float64) for t in shared]
    full = []
    for local_value, ref_value in zip(shared, ref, strict=True):
        buffer = torch.zeros_like(ref_value)
        buffer.index_add_(2, index, local_value)
        full.append(buffer)
    error = torch.zeros((), dtype=torch.float64, device=device)
    for buffer, ref_value in zip(full, ref, strict=True):
        dist.all_reduce(buffer, group=ctx_mesh.get_group())
        error = torch.maximum(error, (buffer - ref_value).abs().max())
    dist.all_reduce(error, op=dist.ReduceOp.MAX)
    return float(error)


def _named_case(world: int, name: str, *params) -> float:
    return _run_case(world, *params)


declare_cases("attn", _named_case, CASES)  # run with the other modules' cases (harness)


@pytest.fixture(scope="module")
def errors(tmp_path_factory):
    return errors_per_world(_named_case, CASES, tmp_path_factory, "attn")


@pytest.mark.parametrize(
    "world,name", [(w, c[0]) for w, cases in CASES.items() for c in cases if c[1] != "broken"]
)
def test_parallel_attention_equals_single_rank(errors, world, name):
    assert errors[world][name] < TOLERANCE, (name, errors[world][name])


@pytest.mark.parametrize(
    "world,name", [(w, c[0]) for w, cases in CASES.items() for c in cases if c[1] == "broken"]
)
def test_splitting_a_block_across_ranks_is_detected(errors, world, name):
    assert errors[world][name] > 1e-3, (name, errors[world][name])


def test_packed_kv_shards_gather_into_views_of_the_concatenated_sequence():
    from turbo_dllm.train.parallel.csbp import pack_kv, unpack_kv

    world, batch, heads, length, dim = 3, 2, 4, 5, 8
    ks = [torch.randn(batch, heads, length, dim) for _ in range(world)]
    vs = [torch.randn(batch, heads, length, dim) for _ in range(world)]
    shards = [pack_kv(k, v) for k, v in zip(ks, vs, strict=True)]
    assert all(s.is_contiguous() and s.shape == (length, 2, batch, heads, dim) for s in shards)
    gathered = torch.stack(shards)  # what an all-gather along dim 0 produces, (world, *shape)
    k_all, v_all = unpack_kv(gathered)
    assert torch.equal(k_all, torch.cat(ks, dim=2)) and torch.equal(v_all, torch.cat(vs, dim=2))
    # Views, not copies: the gathered buffer is the only storage of the whole K/V.
    assert k_all.untyped_storage().data_ptr() == gathered.untyped_storage().data_ptr()
    assert v_all.untyped_storage().data_ptr() == gathered.untyped_storage().data_ptr()
