"""`objective.greedy_path`: a slot is scored only where the true tokens between its anchor and it
are the target's greedy choices, the only prefixes speculative decoding asks a slot about; and
`dflash_loss: greedy_ce`, cross-entropy against the target's greedy token."""

from __future__ import annotations

import pytest
import torch

from tests.dflash.helpers import drafter_spec
from tests.train.util import losses
from turbo_dllm.families.dflash.losses import frozen_linear_argmax
from turbo_dllm.families.dflash.plan import draft_score, greedy_path, share_anchors, target_guesses
from turbo_dllm.train.entry import train
from turbo_dllm.train.losses import linear_cross_entropy
from turbo_dllm.train.objectives import NoiseKey
from turbo_dllm.train.objectives.dflash_distillation import DFlashDistillation

VOCAB = 13


def _world(seed: int, rows: int = 3, length: int = 48):
    """Token ids, and a teacher + identity head whose greedy guess after position p is the true
    next token 70 % of the time (so paths of every length occur)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (rows, length), generator=g)
    guess = ids.roll(-1, dims=1)
    wrong = torch.rand(rows, length, generator=g) < 0.3
    guess = torch.where(
        wrong, (guess + 1 + torch.randint(0, VOCAB - 1, guess.shape, generator=g)) % VOCAB, guess
    )
    teacher = torch.nn.functional.one_hot(guess, VOCAB).float() * 3 + 0.1 * torch.randn(
        rows, length, VOCAB, generator=g
    )
    return ids, guess, teacher, torch.eye(VOCAB)


def _expected(batch, ids, guess) -> list[float]:
    """By the definition, slot by slot: tokens a+1 .. t-1 all equal the greedy guess before them."""
    b, width, length = batch.block_size, batch.anchors.shape[1], ids.shape[1]
    out = []
    for index, teacher_index in zip(
        batch.score_index.tolist(), batch.teacher_index.tolist(), strict=True
    ):
        row, block = teacher_index // length, index // b
        anchor = int(batch.anchors[block // width, block % width])
        drafted = teacher_index % length + 1
        ok = all(int(guess[row, s - 1]) == int(ids[row, s]) for s in range(anchor + 1, drafted))
        out.append(float(ok))
    return out


@pytest.mark.parametrize("from_anchor", [False, True])
def test_greedy_path_scores_exactly_the_slots_on_the_targets_greedy_path(from_anchor):
    ids, guess, teacher, head = _world(0)
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[1, 30:] = False
    objective = DFlashDistillation(
        block_size=6, max_anchors=10, sample_from_anchor=from_anchor, greedy_path=True
    )
    batch = objective.corrupt({"input_ids": ids, "loss_mask": mask}, NoiseKey(0, 0, 0, 3))
    assert batch.greedy_path
    assert torch.equal(target_guesses(teacher, head), guess)
    got = greedy_path(batch, guess)
    want = _expected(batch, ids, guess)
    assert got.tolist() == want
    # every length of path occurs: the first slot is always on it, later ones only sometimes
    assert 0 < sum(want) < len(want)
    # block parallelism: each rank's share keeps its slots' marks
    for rank in range(2):
        share = share_anchors(batch, rank, 2)
        assert greedy_path(share, guess).tolist() == _expected(share, ids, guess)


def test_greedy_path_needs_the_teachers_outputs():
    with pytest.raises(ValueError, match="paper_ce's labels are the true tokens"):
        DFlashDistillation(block_size=4, max_anchors=4, loss="paper_ce", greedy_path=True)
    # DFlash2's hard labels take the target's greedy tokens instead: the target must run
    for loss in ("dflash", "dpace"):
        assert not DFlashDistillation(block_size=4, max_anchors=4, loss=loss).needs_teacher
        on_path = DFlashDistillation(block_size=4, max_anchors=4, loss=loss, greedy_path=True)
        assert on_path.needs_teacher


def test_frozen_linear_argmax_walks_chunks_to_the_dense_argmax():
    g = torch.Generator().manual_seed(1)
    hidden, weight = torch.randn(300, 16, generator=g), torch.randn(50, 16, generator=g)
    dense = (hidden @ weight.t()).argmax(-1)
    assert torch.equal(frozen_linear_argmax(hidden, weight, chunk_size=64), dense)
    assert torch.equal(frozen_linear_argmax(hidden, weight), dense)


@pytest.mark.parametrize("on_path", [False, True])
def test_greedy_ce_is_the_cross_entropy_to_the_targets_greedy_token(on_path):
    ids, guess, teacher, head = _world(2)
    objective = DFlashDistillation(
        block_size=4, max_anchors=8, loss="greedy_ce", greedy_path=on_path
    )
    assert objective.needs_teacher
    batch = objective.corrupt(
        {"input_ids": ids, "loss_mask": torch.ones_like(ids, dtype=torch.bool)},
        NoiseKey(0, 0, 0, 3),
    )
    hidden = torch.randn(ids.shape[0], batch.anchors.shape[1] * 4, VOCAB, requires_grad=True)
    loss = draft_score(batch, teacher, hidden, head)
    flat = hidden.reshape(-1, VOCAB)[batch.score_index]
    labels = guess.flatten()[batch.teacher_index]  # the greedy token after position t - 1
    weights = batch.weights * (greedy_path(batch, guess) if on_path else 1)
    dense = (
        torch.nn.functional.cross_entropy(flat @ head.t(), labels, reduction="none") * weights
    ).sum()
    torch.testing.assert_close(loss, dense)
    torch.testing.assert_close(loss, linear_cross_entropy(flat, head, labels, weights))
    # not the true tokens' cross-entropy: the labels are the target's, which differ 30 % of the time
    truth = (
        torch.nn.functional.cross_entropy(flat @ head.t(), batch.targets, reduction="none")
        * weights
    ).sum()
    assert not torch.allclose(loss, truth)


def test_a_greedy_path_drafter_learns_and_weighs_at_most_the_plain_loss(world, tmp_path):
    args = ("training.steps=6", "checkpoint.interval=null")
    plain, greedy = tmp_path / "plain", tmp_path / "greedy"
    train(drafter_spec(world["target"], world["artifact"], *args), plain)
    train(
        drafter_spec(world["target"], world["artifact"], *args, "objective.greedy_path=true"),
        greedy,
    )
    first, trace = losses(plain)[0], losses(greedy)
    # same init, same anchors, same divisor: the greedy-path loss drops the off-path slots' terms
    assert 0 < trace[0] < first
    assert trace[-1] < trace[0], trace


def test_a_greedy_ce_drafter_on_the_greedy_path_learns(world, tmp_path):
    """greedy_ce needs the target's last hidden states: online the target runs all its layers."""
    args = ("training.steps=6", "checkpoint.interval=null", "objective.dflash_loss=greedy_ce")
    run = tmp_path / "greedy-ce"
    train(
        drafter_spec(world["target"], world["artifact"], *args, "objective.greedy_path=true"), run
    )
    trace = losses(run)
    assert trace[-1] < trace[0], trace
