"""The objectives' math on small hand-checked cases."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from turbo_dllm.train.objectives import BlockDiffusion, FastDllmV2, NoiseKey, score
from turbo_dllm.train.objectives.base import block_noise_levels

MASK = 99


def batch(rows, L, vocab=50, seed=0, docs=None, loss_mask=None):
    g = torch.Generator().manual_seed(seed)
    out = {
        "input_ids": torch.randint(0, vocab, (rows, L), generator=g),
        "loss_mask": torch.ones(rows, L, dtype=torch.bool) if loss_mask is None else loss_mask,
        "doc_ids": torch.zeros(rows, L, dtype=torch.int32) if docs is None else docs,
    }
    return out


def key(step=0, first=0, per_step=4, seed=0):
    return NoiseKey(seed=seed, step=step, first_sample=first, samples_per_step=per_step)


# --- noise levels --------------------------------------------------------------------------
def test_antithetic_levels_are_evenly_spaced_over_the_whole_step():
    nb, per_step = 4, 6
    parts = [
        block_noise_levels(
            key(first=f, per_step=per_step),
            2,
            nb,
            eps_min=0.0,
            eps_max=1.0,
            antithetic=True,
            generators=[],
        )
        for f in (0, 2, 4)
    ]
    levels = torch.cat(parts).flatten().sort().values
    gaps = levels.diff()
    assert torch.allclose(gaps, torch.full_like(gaps, 1 / (nb * per_step)))
    # each sequence spans the range: its blocks are 1/nb apart (mod 1)
    row = parts[0][0]
    assert torch.allclose(
        torch.remainder(row.diff(), 1.0), torch.full((nb - 1,), 1 / nb, dtype=torch.float64)
    )


def test_levels_are_mapped_into_eps_range():
    t = block_noise_levels(key(), 4, 8, eps_min=0.2, eps_max=0.6, antithetic=True, generators=[])
    assert t.min() >= 0.2 and t.max() < 0.6


def test_noise_does_not_depend_on_how_the_step_is_split():
    objective = BlockDiffusion(block_size=4, mask_token_id=MASK)
    whole = objective.corrupt(batch(4, 16), key(per_step=4))
    b = batch(4, 16)
    second_half = {k: v[2:] for k, v in b.items()}
    half = objective.corrupt(second_half, key(first=2, per_step=4))
    assert torch.equal(half.input_ids, whole.input_ids[2:])
    other_step = objective.corrupt(batch(4, 16), key(step=1, per_step=4))
    assert not torch.equal(other_step.input_ids, whole.input_ids)


# --- BD3-LM ---------------------------------------------------------------------------------
def test_block_diffusion_stream_targets_and_weights():
    L = 16
    lm = torch.ones(2, L, dtype=torch.bool)
    lm[0, :5] = False  # e.g. a prompt: never noised, never scored
    b = batch(2, L, loss_mask=lm)
    objective = BlockDiffusion(block_size=4, mask_token_id=MASK, eps_min=0.25, eps_max=0.25)
    out = objective.corrupt(b, key(per_step=2))
    x_t, x0 = out.input_ids[:, :L], out.input_ids[:, L:]
    assert torch.equal(x0, b["input_ids"])
    masked = x_t == MASK
    assert not masked[~lm].any()
    assert torch.equal(x_t[~masked], x0[~masked])
    row, col = masked.nonzero(as_tuple=True)
    assert torch.equal(out.score_index, row * 2 * L + col)
    assert torch.equal(out.targets, x0[row, col])
    assert torch.allclose(out.weights, torch.full_like(out.weights, 4.0))  # 1 / t
    assert out.exclude_index == MASK
    assert objective.supervised_count(b) == int(lm.sum())


def test_block_diffusion_loss_of_a_uniform_model_is_log_vocab_per_token():
    """Uniform prediction over V-1 tokens: each masked token costs (1/t) ln(V-1); with t the
    masking rate, the expected loss per supervised token is exactly ln(V-1), whatever t."""
    V, H, L = 100, 8, 256
    objective = BlockDiffusion(block_size=16, mask_token_id=V - 1, eps_min=0.3, eps_max=0.3)
    b = batch(8, L, vocab=V - 1)
    out = objective.corrupt(b, key(per_step=8))
    hidden = torch.randn(8, 2 * L, H)
    total = score(out, hidden, torch.zeros(V, H))
    n_masked = int((out.input_ids[:, :L] == V - 1).sum())
    assert math.isclose(float(total), n_masked / 0.3 * math.log(V - 1), rel_tol=1e-5)
    per_token = float(total) / objective.supervised_count(b)
    assert abs(per_token - math.log(V - 1)) < 0.05 * math.log(V - 1)


def test_block_diffusion_masking_rate_follows_t():
    objective = BlockDiffusion(
        block_size=64, mask_token_id=MASK, eps_min=0.1, eps_max=0.9, antithetic=False
    )
    out = objective.corrupt(batch(64, 256), key(per_step=64))
    masked = (out.input_ids[:, :256] == MASK).view(64, 4, 64).float().mean(-1)
    t = 1.0 / out.weights  # weights are 1/t per masked token
    assert 0.1 <= float(t.min()) and float(t.max()) <= 0.9
    assert abs(float(masked.mean()) - 0.5) < 0.03  # E[t] = (0.1 + 0.9) / 2


def test_unit_weighting():
    objective = BlockDiffusion(block_size=4, mask_token_id=MASK, weighting="unit")
    out = objective.corrupt(batch(2, 16), key(per_step=2))
    assert torch.all(out.weights == 1)


# --- Fast-dLLM v2 ---------------------------------------------------------------------------
def test_fast_dllm_v2_complementary_pair_and_shift():
    L = 8
    docs = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1]])
    lm = torch.ones(1, L, dtype=torch.bool)
    lm[0, 5] = False
    b = batch(1, L, docs=docs, loss_mask=lm)
    objective = FastDllmV2(block_size=4, mask_token_id=MASK)
    out = objective.corrupt(b, key(per_step=1))
    assert out.input_ids.shape == (2, 2 * L)  # the sequence and its complement
    x0 = b["input_ids"][0]
    views = out.input_ids[:, :L] == MASK
    assert torch.equal(views[0] | views[1], lm[0])  # every supervised token masked...
    assert not (views[0] & views[1]).any()  # ...in exactly one view
    assert torch.equal(out.input_ids[:, L:], torch.stack([x0, x0]))
    # scored: j in {1, 2, 4, 6, 7} (not 0, not 3 = doc start, not 5 = unsupervised), once each
    rows, outputs = out.score_index // (2 * L), out.score_index % (2 * L)
    targets_pos = outputs + 1
    assert sorted(targets_pos.tolist()) == [1, 2, 4, 6, 7]
    for r, j, t in zip(rows.tolist(), targets_pos.tolist(), out.targets.tolist(), strict=True):
        assert views[r, j] and t == x0[j]
    assert objective.supervised_count(b) == 5
    assert torch.all(out.weights == 1) and out.exclude_index is None
    assert torch.equal(out.doc_ids, torch.cat([docs, docs]))


def test_rows_of_one_document_each_carry_no_document_ids():
    """A row of one document has no boundary: the batch drops its doc_ids on the host, so the
    attention backends never ask the device whether a batch has boundaries."""
    objective = BlockDiffusion(block_size=4, mask_token_id=MASK)
    whole_rows = torch.tensor([[0] * 8, [3] * 8])  # one document per row (ids differ by row)
    assert objective.corrupt(batch(2, 8, docs=whole_rows), key(per_step=2)).doc_ids is None
    packed = torch.tensor([[0] * 8, [0, 0, 0, 1, 1, 1, 1, 1]])
    out = objective.corrupt(batch(2, 8, docs=packed), key(per_step=2))
    assert torch.equal(out.doc_ids, packed)


def test_fast_dllm_v2_loss_is_next_token_ce_at_masked_positions():
    V, H, L = 30, 6, 12
    b = batch(2, L, vocab=V - 1)
    objective = FastDllmV2(block_size=4, mask_token_id=V - 1)
    out = objective.corrupt(b, key(per_step=2))
    hidden = torch.randn(4, 2 * L, H)
    weight = torch.randn(V, H)
    total = score(out, hidden, weight)
    expected = 0.0
    for r in range(4):
        x0 = out.input_ids[r, L:]
        for j in range(1, L):
            if out.input_ids[r, j] == V - 1:  # masked in this view -> predicted from j - 1
                logits = hidden[r, j - 1] @ weight.t()
                expected += float(F.cross_entropy(logits[None], x0[j : j + 1]))
    assert math.isclose(float(total), expected, rel_tol=1e-5)


@pytest.mark.parametrize("name", ["block_diffusion", "fast_dllm_v2"])
def test_build_objective_defaults(name):
    from turbo_dllm.config.runspec import ObjectiveSpec
    from turbo_dllm.train.objectives import build_objective

    objective = build_objective(ObjectiveSpec(name=name, block_size=8), mask_token_id=7)
    assert objective.name == name
    assert objective.weighting == ("inverse_t" if name == "block_diffusion" else "unit")
