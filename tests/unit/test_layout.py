"""Sharding layouts, the visibility rule and the reference partial attention (no processes)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from turbo_dllm.config.topology import ParallelLayout
from turbo_dllm.errors import DllmError
from turbo_dllm.train.parallel.dims import ParallelDims
from turbo_dllm.train.parallel.layout import (
    CpLayout,
    CsbpLayout,
    contiguous_block_assignment,
    dual_end_block_assignment,
    noisy_prefix_cost,
    zigzag_positions,
)
from turbo_dllm.train.parallel.partial_attention import dense_attention_with_lse
from turbo_dllm.train.parallel.visibility import tokens_mask, two_stream_tokens


# --- zigzag -----------------------------------------------------------------------------------
@pytest.mark.parametrize("world", [1, 2, 4])
def test_zigzag_partitions_and_balances_causal_work(world):
    length = 16 * world
    shards = [zigzag_positions(length, world, r) for r in range(world)]
    assert sorted(torch.cat(shards).tolist()) == list(range(length))
    chunk = length // (2 * world)
    assert shards[0][:chunk].tolist() == list(range(chunk))
    assert shards[0][chunk:].tolist() == list(range(length - chunk, length))
    # Causal work of a query is its position + 1: every rank gets the same total.
    assert len({int((s + 1).sum()) for s in shards}) == 1


def test_zigzag_rejects_lengths_that_do_not_split():
    with pytest.raises(ValueError, match="length % "):
        zigzag_positions(30, 4, 0)


# --- dual-end block assignment ----------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(ranks=st.integers(1, 8), extra=st.integers(0, 40))
def test_dual_end_covers_every_block_once_in_pairs(ranks, extra):
    blocks = 2 * ranks + extra
    owned = dual_end_block_assignment(blocks, ranks)
    assert len(owned) == ranks
    assert sorted(b for o in owned for b in o) == list(range(blocks))
    where = {b: r for r, o in enumerate(owned) for b in o}
    for b in range(blocks // 2):
        assert where[b] == where[blocks - 1 - b], "a dual-end pair was split"
    # Balance: ranks differ by at most one pair (plus the odd middle block).
    costs = [noisy_prefix_cost(o) for o in owned]
    assert max(costs) - min(costs) <= (blocks + 1) + (blocks // 2 + 1)
    if blocks % (2 * ranks) == 0:
        assert len(set(costs)) == 1


def test_dual_end_is_zigzag_at_block_granularity_when_pairs_divide():
    owned = dual_end_block_assignment(16, 4)
    assert owned[0] == (0, 1, 14, 15)
    assert owned[3] == (6, 7, 8, 9)


def test_odd_middle_block_goes_to_least_loaded_rank():
    owned = dual_end_block_assignment(11, 2)  # 5 pairs: rank 0 gets 3, rank 1 gets 2 + middle
    assert 5 in owned[1]
    assert len(owned[0]) == 6 and len(owned[1]) == 5


def test_dual_end_beats_contiguous_balance():
    def spread(owned):
        costs = [noisy_prefix_cost(o) for o in owned]
        return max(costs) / min(costs)

    assert spread(dual_end_block_assignment(64, 4)) == 1.0
    assert spread(contiguous_block_assignment(64, 4)) > 3.0


def test_too_few_blocks_for_pairs_is_rejected():
    with pytest.raises(ValueError, match="dual-end pair"):
        dual_end_block_assignment(7, 4)


# --- rank layouts -----------------------------------------------------------------------------
@pytest.mark.parametrize("bp,cp", [(2, 1), (2, 2), (4, 1), (4, 2), (4, 4)])
def test_csbp_layout_owns_every_noisy_token_once_and_shards_clean(bp, cp):
    seq_len, block = 128, 4
    layouts = [CsbpLayout.build(seq_len, block, bp, cp, r) for r in range(bp)]
    noisy = torch.cat([lay.noisy_positions for lay in layouts])
    assert sorted(noisy.tolist()) == list(range(seq_len))
    for lay in layouts:  # blocks are whole
        assert torch.equal(
            lay.noisy_positions.view(-1, block)[:, 0] // block, torch.tensor(lay.noisy_blocks)
        )
    if cp == 1:
        for lay in layouts:
            assert lay.clean_positions.tolist() == list(range((max(lay.noisy_blocks) + 1) * block))
    else:
        for start in range(0, bp, cp):  # each clean group covers the clean stream exactly once
            group = torch.cat([layouts[r].clean_positions for r in range(start, start + cp)])
            assert sorted(group.tolist()) == list(range(seq_len))
            assert torch.equal(group, layouts[start].gathered_clean_positions)


def test_csbp_layout_rules():
    with pytest.raises(ValueError, match="bp >= cp"):
        CsbpLayout.build(128, 4, 2, 4, 0)
    with pytest.raises(ValueError, match="bp % cp"):
        CsbpLayout.build(128, 4, 6, 4, 0)
    with pytest.raises(ValueError, match="exactly once"):
        CsbpLayout.build(32, 4, 2, 1, 0, assignment=((0, 1, 2, 3), (3, 4, 5, 6)))


def test_cp_layout_is_zigzag_of_whole_blocks():
    layouts = [CpLayout.build(64, 4, 4, r) for r in range(4)]
    assert sorted(torch.cat([lay.positions for lay in layouts]).tolist()) == list(range(64))
    assert torch.equal(layouts[2].gathered_positions, torch.cat([lay.positions for lay in layouts]))
    with pytest.raises(ValueError, match="whole blocks"):
        CpLayout.build(48, 4, 4, 0)


# --- visibility -------------------------------------------------------------------------------
def _naive_visible(q, k, seq_len, block, docs):
    """The rule exactly as docs/architecture.md states it, on 2L stream indices (noisy first)."""
    qn, kn = q < seq_len, k < seq_len
    qp, kp = q % seq_len, k % seq_len
    qb, kb = qp // block, kp // block
    if docs[qp] != docs[kp]:
        return False
    if qn and kn:
        return qb == kb
    if qn and not kn:
        return kb < qb
    if not qn and not kn:
        return kb <= qb
    return False


def test_dense_mask_matches_the_stated_rule():
    seq_len, block = 12, 4
    docs = torch.tensor([[0] * 5 + [1] * 7])
    tokens = two_stream_tokens(torch.arange(seq_len), block_size=block, doc_ids=docs)
    mask = tokens_mask(tokens, tokens)[0, 0]
    for q in range(2 * seq_len):
        for k in range(2 * seq_len):
            assert bool(mask[q, k]) == _naive_visible(q, k, seq_len, block, docs[0]), (q, k)


def test_stream_mask_and_token_mask_are_one_rule():
    """The index-based stream mask (FlexAttention, reference backend) and the tag-based token
    mask (CSBP, CP, the Triton op's reference) come from the same definition."""
    from turbo_dllm.train.attention.layout import BlockDiffusionLayout
    from turbo_dllm.train.attention.layout import dense_mask as stream_mask

    docs = torch.tensor([[0] * 5 + [1] * 11, [0] * 16])
    tokens = two_stream_tokens(torch.arange(16), block_size=4, doc_ids=docs)
    assert torch.equal(stream_mask(BlockDiffusionLayout(16, 4), docs), tokens_mask(tokens, tokens))


# --- partial attention ------------------------------------------------------------------------
def test_dense_attention_matches_sdpa_and_survives_empty_rows():
    torch.manual_seed(0)
    q = torch.randn(2, 4, 6, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, 5, 8, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 2, 5, 8, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(2, 1, 6, 5) > 0.4
    mask[:, :, 0] = False  # a query that sees nothing
    mask[:, :, 1:, 0] = True
    out, lse = dense_attention_with_lse(q, k, v, mask)
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    expect = torch.nn.functional.scaled_dot_product_attention(q, kk, vv, attn_mask=mask)
    assert torch.allclose(out[:, :, 1:], expect[:, :, 1:])
    assert torch.all(out[:, :, 0] == 0) and torch.all(torch.isneginf(lse[:, :, 0]))
    scores = (q @ kk.transpose(-1, -2)) / math.sqrt(8)
    expect_lse = scores.masked_fill(~mask, float("-inf")).logsumexp(-1)
    assert torch.allclose(lse[:, :, 1:], expect_lse[:, :, 1:])
    (out.sum() + lse[:, :, 1:].sum()).backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


# --- parallel dims ----------------------------------------------------------------------------
def test_parallel_dims_modes_and_degrees():
    csbp = ParallelDims(dp_replicate=1, dp_shard=2, cp=2, bp=4, tp=1, world_size=8)
    assert (csbp.mode, csbp.context, csbp.clean_replica, csbp.dp_size) == ("csbp", 4, 2, 2)
    assert csbp.grad_average_size == 8 and csbp.dp_rank == 0
    assert csbp.mesh_shape == (1, 2, 2, 2, 1)
    cp = ParallelDims(dp_replicate=1, dp_shard=1, cp=4, bp=1, tp=1, world_size=4)
    assert (cp.mode, cp.clean_replica) == ("cp", 1)
    assert ParallelDims(1, 1, 1, 1, 1, 1).mode == "none"


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        ({"cp": 4, "bp": 2}, "bp >= cp"),
        ({"cp": 2, "bp": 3}, "bp % cp"),
        ({"cp": 1, "bp": 2, "world_size": 4}, "launch has 4 processes"),
    ],
)
def test_parallel_dims_rejections_explain_themselves(kwargs, needle):
    args = {"dp_replicate": 1, "dp_shard": 1, "tp": 1, "world_size": 2, **kwargs}
    args.setdefault("world_size", 2)
    with pytest.raises(DllmError, match=needle):
        ParallelDims(**args)
    if "world_size" not in kwargs:
        assert ParallelLayout(cp=kwargs["cp"], bp=kwargs["bp"]).problems()


def test_get_mesh_before_build_is_an_error():
    with pytest.raises(RuntimeError, match="build_mesh"):
        ParallelDims(1, 1, 1, 1, 1, 1).get_mesh("cp")


def test_flex_backend_mask_matches_the_dense_reference(monkeypatch):
    """The FlexAttention mask_mod (run eagerly, forward only, on CPU) equals the dense mask,
    including queries that see nothing (lse -inf)."""
    from torch.nn.attention.flex_attention import flex_attention

    from turbo_dllm.train.parallel import partial_attention
    from turbo_dllm.train.parallel.partial_attention import build_partial_attention
    from turbo_dllm.train.parallel.visibility import TokenSet

    monkeypatch.setattr(partial_attention, "_compiled_flex", flex_attention)
    torch.manual_seed(0)
    seq_len, block = 256, 16
    layout = CsbpLayout.build(seq_len, block, 2, 2, 1)
    docs = torch.zeros(2, seq_len, dtype=torch.long)
    docs[1, 100:] = 1

    def tokens(positions, noisy):
        return TokenSet.from_positions(positions, noisy=noisy, block_size=block, doc_ids=docs)

    queries = TokenSet.concat(
        tokens(layout.noisy_positions, True), tokens(layout.clean_positions, False)
    )
    keys = tokens(layout.gathered_clean_positions, False)
    q = torch.randn(2, 4, len(queries), 16)
    k, v = torch.randn(2, 2, len(keys), 16), torch.randn(2, 2, len(keys), 16)
    out_flex, lse_flex = build_partial_attention(queries, keys, "flex")(q, k, v)
    out_dense, lse_dense = build_partial_attention(queries, keys, "reference")(q, k, v)
    assert torch.allclose(out_flex, out_dense, atol=1e-5)
    assert torch.equal(torch.isneginf(lse_flex), torch.isneginf(lse_dense))
    assert torch.isneginf(lse_dense).any()
    finite = torch.isfinite(lse_dense)
    assert torch.allclose(lse_flex[finite], lse_dense[finite], atol=1e-5)


# --- RunSpec rules for cp/bp ------------------------------------------------------------------
def _topology_spec(**topology):
    from turbo_dllm.config.runspec import RunSpec

    return RunSpec.model_validate({"topology": topology, "data": {"seq_len": 256, "synthetic": {}}})


def test_runspec_accepts_the_supported_layouts():
    from turbo_dllm.config.validate import problems

    for topology in ({"cp": 2}, {"bp": 2}, {"cp": 2, "bp": 2}, {"cp": 2, "bp": 4}, {"bp": 4}):
        assert problems(_topology_spec(**topology), world_size=max(topology.values())) == []


@pytest.mark.parametrize(
    "topology,path,needle",
    [
        ({"cp": 2, "bp": 3}, "topology.bp", "bp/cp groups"),
        ({"cp": 4, "bp": 2}, "topology.bp", "bp >= cp"),
        ({"cp": 16}, "data.seq_len", "multiple of 512"),
        ({"bp": 16}, "data.seq_len", "at least 32 blocks"),
    ],
)
def test_runspec_rejects_layouts_with_the_reason(topology, path, needle):
    from turbo_dllm.config.validate import problems

    found = {p.path: p.message for p in problems(_topology_spec(**topology))}
    assert path in found and needle in found[path], found


# --- the torch-free parallel layout -------------------------------------------------------------
def test_layout_coordinates_are_the_device_mesh_order():
    """`init_device_mesh` lays ranks out as arange(world).view(mesh_shape): the plan's
    rank -> coordinates map must be exactly that unravelling, tp fastest."""
    layout = ParallelLayout(dp=2, fsdp=2, cp=2, bp=4, tp=2)
    assert layout.mesh_shape == (2, 2, 2, 2, 2) and layout.world_size == 32
    grid = torch.arange(layout.world_size).view(layout.mesh_shape)
    for rank in range(layout.world_size):
        where = [int(i[0]) for i in torch.nonzero(grid == rank, as_tuple=True)]
        assert list(layout.coordinates(rank).values()) == where
    assert layout.coordinates(1)["tp"] == 1 and layout.coordinates(2)["cp"] == 1
    assert layout.dp_rank(31) == 3
    with pytest.raises(ValueError, match="outside a world of 32"):
        layout.coordinates(32)


def test_layout_round_trips_and_resizes_the_elastic_axis():
    layout = ParallelLayout(dp=3, fsdp=2, tp=2, sp=True)
    assert ParallelLayout.from_dict(layout.to_dict()) == layout
    assert layout.resized("fsdp", 24) == ParallelLayout(dp=3, fsdp=4, tp=2, sp=True)
    with pytest.raises(DllmError, match="world size 10: not a multiple of the fixed"):
        layout.resized("dp", 10)
    assert layout.problems(12) == []
    assert layout.problems(8) == [
        (
            "topology",
            "dp*fsdp*max(cp,bp)*tp = 3*2*1*2 = 12 but the launch has 8 processes "
            "(topology.dp=2 fits 8)",
        )
    ]
    assert layout.problems(6)[0][1].endswith(
        "6 processes (6 is not a multiple of fsdp*max(cp,bp)*tp = 4, so no dp fits it; "
        "4 or 8 processes do)"
    )
    assert layout.problems(3)[0][1].endswith("no dp fits it; 4 processes do)")
