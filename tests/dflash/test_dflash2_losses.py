"""DFlash2's hard-label losses on a tiny case worked by hand: the dflash and D-PACE weights,
the selector loss with its warmup/ramp, and their sum through the drafter's frozen head."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from tests.dflash.test_dflash2_model import TINY2, _drafter
from turbo_dllm.families.dflash.config import HARD_LABEL_LOSSES as CONFIG_KINDS
from turbo_dllm.families.dflash.hard_labels import dpace_weights, hard_label_loss, selector_loss
from turbo_dllm.families.dflash.plan import draft_score, target_guesses
from turbo_dllm.train.objectives.dflash_distillation import (
    HARD_LABEL_LOSSES,
    DraftBatch,
    selector_weight,
)


def test_the_selector_weight_is_off_through_the_warmup_then_ramps_linearly():
    got = [selector_weight(step, 2.0, 2, 4) for step in range(8)]
    assert got == [0.0, 0.0, 0.5, 1.0, 1.5, 2.0, 2.0, 2.0]
    assert [selector_weight(s, 1.0, 3, 0) for s in range(5)] == [0, 0, 0, 1.0, 1.0]
    assert CONFIG_KINDS == HARD_LABEL_LOSSES  # the torch-free copy validation uses


def test_dpace_weights_by_hand():
    # one block of 4 slots: slot 0 unsupervised (the anchor), slots 1..3 with p = .5, .8, .2
    p = torch.tensor([[0.0, 0.5, 0.8, 0.2]])
    supervised = torch.tensor([[False, True, True, True]])
    alpha = 0.5
    s = [1.0, 0.75, 0.9, 0.6]  # (1 - a) p + a, 1 where unsupervised
    prefix = [1.0, 0.75, 0.75 * 0.9, 0.75 * 0.9 * 0.6]
    mask = [0, 1, 1, 1]
    cont = [sum(prefix[j] * mask[j] for j in range(k, 4)) for k in range(4)]
    assert math.isclose(prefix[1] * s[2], prefix[2])
    want = {
        "dpace": [cont[k] * mask[k] for k in range(4)],
        "dpace-cumulative-confidence-only": [prefix[k] * mask[k] for k in range(4)],
        "dpace-continuation-value-only": [cont[k] / prefix[k] * mask[k] for k in range(4)],
    }
    for kind, weights in want.items():
        got = dpace_weights(kind, p, supervised, alpha)[0].tolist()
        assert got == pytest.approx(weights), kind


# --- the whole hard-label loss on a hand-made batch -------------------------------------------
# one row of 8 tokens, anchors 1 and 4, block 4 (slot 0 = the anchor, unscored); position 7 is
# not supervised, so block 1 scores slots 1, 2 (positions 5, 6) and block 0 slots 1..3.
IDS = torch.tensor([[3, 7, 1, 4, 9, 2, 6, 0]])
SCORED = [(0, 1), (0, 2), (0, 3), (1, 1), (1, 2)]  # (block, slot)
ANCHORS = [1, 4]
GAMMA = 2.0


def _batch(loss: str, selector: float) -> DraftBatch:
    position = [ANCHORS[n] + k for n, k in SCORED]
    return DraftBatch(
        context_ids=IDS,
        doc_ids=None,
        anchors=torch.tensor([ANCHORS]),
        anchor_valid=torch.tensor([[True, True]]),
        score_index=torch.tensor([n * 4 + k for n, k in SCORED]),
        targets=IDS[0, position],
        weights=torch.tensor([math.exp(-(k - 1) / GAMMA) for _, k in SCORED]),
        teacher_index=torch.tensor(position) - 1,
        block_size=4,
        loss=loss,
        dpace_alpha=0.3,
        selector_weight=selector,
    )


def _by_hand(model, hidden, loss: str, selector: float) -> torch.Tensor:
    """Dense logits, per-slot loops: what the chunked, vectorised loss must equal."""
    config = model.config
    head = model.lm_head.weight
    cap, m = config.final_logit_softcapping, config.output_multiplier
    rows = [hidden[0, n * 4 + k] for n, k in SCORED]
    logits = [cap * torch.tanh(m * (head @ h) / cap) for h in rows]
    gold = [int(IDS[0, ANCHORS[n] + k]) for n, k in SCORED]
    ce = [torch.logsumexp(z, 0) - z[y] for z, y in zip(logits, gold, strict=True)]
    p = [math.exp(-float(c.detach())) for c in ce]
    if loss == "dflash":
        weights = [math.exp(-(k - 1) / GAMMA) for _, k in SCORED]
    else:  # dpace, slot by slot within each block

        def prefix(block, slot):  # prod over the block's scored slots up to `slot`
            return math.prod(
                0.7 * p[t] + 0.3 for t, (n2, k2) in enumerate(SCORED) if n2 == block and k2 <= slot
            )

        weights = [
            sum(prefix(n, k2) for n2, k2 in SCORED if n2 == n and k2 >= k) for n, k in SCORED
        ]
    total = sum(w * c for w, c in zip(weights, ce, strict=True))
    selector_module = model.candidate_selector
    for i, (n, k) in enumerate(SCORED):
        candidates = logits[i].topk(config.selector_top_k).indices.tolist()
        if gold[i] not in candidates:
            continue
        previous = int(IDS[0, ANCHORS[n] + k - 1])  # the gold token before (the anchor's at k=1)
        query = selector_module.predecessor_codebook[previous] * (
            selector_module.hidden_projection.weight @ rows[i]
        )
        scores = torch.stack(
            [logits[i][c] + query @ selector_module.successor_codebook[c] for c in candidates]
        )
        total = total + selector * weights[i] * (
            torch.logsumexp(scores, 0) - scores[candidates.index(gold[i])]
        )
    return total


@pytest.mark.parametrize("loss", ["dflash", "dpace"])
def test_hard_label_loss_and_its_gradients_equal_the_hand_computation(loss):
    config = dataclasses.replace(
        TINY2, output_multiplier=1.5, final_logit_softcapping=4.0, selector_top_k=6
    )
    model = _drafter(config)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        model.candidate_selector.successor_codebook.normal_(0.0, 1.0, generator=g)
    hidden = torch.randn(1, 8, 8, generator=g, dtype=torch.float64, requires_grad=True)
    batch = _batch(loss, selector=0.7)
    got = hard_label_loss(batch, hidden, model.lm_head.weight, model)
    want = _by_hand(model, hidden, loss, selector=0.7)
    torch.testing.assert_close(got.double(), want.double())
    params = [hidden, *model.candidate_selector.parameters()]
    for a, b in zip(
        torch.autograd.grad(got, params), torch.autograd.grad(want, params), strict=True
    ):
        torch.testing.assert_close(a.double(), b.double())
    # the selector term is there (the test's top-k holds gold tokens) and its weight scales it
    without = hard_label_loss(_batch(loss, 0.0), hidden, model.lm_head.weight, model)
    assert float((got - without).detach()) > 1e-3
    torch.testing.assert_close(
        (got - without).double(),
        (_by_hand(model, hidden, loss, 0.7) - _by_hand(model, hidden, loss, 0.0)).double(),
    )


@pytest.mark.parametrize("loss", ["dflash", "dpace"])
def test_on_the_greedy_path_the_hard_labels_are_the_targets_greedy_tokens(loss):
    """With greedy_path a slot's label is the target's greedy token and only on-path slots
    count: the same loss as the plain hard-label loss over just those slots, so labelled."""
    config = dataclasses.replace(TINY2, final_logit_softcapping=4.0, selector_top_k=6)
    model = _drafter(config)
    head = model.lm_head.weight
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        model.candidate_selector.successor_codebook.normal_(0.0, 1.0, generator=g)
    teacher = torch.randn(1, 8, config.hidden_size, generator=g)
    guess = target_guesses(teacher, head)[0]  # the greedy token after each position
    ids = IDS.clone()
    ids[0, 1:] = guess[:-1]  # the text follows the target's greedy path ...
    ids[0, 3] = (guess[2] + 1) % config.vocab_size  # ... but leaves it at position 3
    # block 0 (anchor 1) drafts positions 2, 3, 4: slots 1 and 2 are on the path (slot 2's label
    # is the greedy token, not the text's), slot 3 is not (the token at 3 left it); block 1
    # (anchor 4) drafts 5, 6, both on it
    on_path = [0, 1, 3, 4]
    hidden = torch.randn(1, 8, 8, generator=g, dtype=torch.float64, requires_grad=True)
    batch = dataclasses.replace(
        _batch(loss, selector=0.7), context_ids=ids, targets=ids[0, [2, 3, 4, 5, 6]]
    )
    got = draft_score(dataclasses.replace(batch, greedy_path=True), teacher, hidden, head, model)
    kept = torch.tensor(on_path)
    want = hard_label_loss(
        dataclasses.replace(
            batch,
            score_index=batch.score_index[kept],
            targets=guess[batch.teacher_index[kept]],
            weights=batch.weights[kept],
            teacher_index=batch.teacher_index[kept],
        ),
        hidden,
        head,
        model,
    )
    torch.testing.assert_close(got, want)
    assert int(guess[2]) != int(ids[0, 3])  # slot 2's label is not the text's token
    plain = draft_score(batch, teacher, hidden, head, model)
    assert not torch.allclose(got, plain)


def test_the_selector_loss_masks_rows_whose_gold_token_is_no_candidate():
    """Rows are masked, not selected (no host sync): a row without its gold token among the
    candidates adds nothing, and with none left the loss is 0 yet reaches every weight."""
    model = _drafter(dataclasses.replace(TINY2, selector_top_k=3))
    selector, head = model.candidate_selector, model.lm_head.weight
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        selector.successor_codebook.normal_(0.0, 1.0, generator=g)
    n = 6
    vocab = head.shape[0]
    hidden = torch.randn(n, head.shape[1], generator=g, dtype=head.dtype, requires_grad=True)
    predecessors = torch.randint(0, vocab, (n,), generator=g)
    # candidates never include the last two tokens, the gold ones of the last two rows
    candidates = torch.stack([torch.randperm(vocab - 2, generator=g)[:3] for _ in range(n)])
    targets = candidates[:, 1].clone()
    targets[4:] = torch.tensor([vocab - 1, vocab - 2])
    weights = torch.rand(n, generator=g, dtype=head.dtype)
    args = (head, selector, predecessors, targets, candidates, weights, None)
    whole = selector_loss(hidden, hidden, *args)
    first = selector_loss(
        hidden[:4], hidden[:4], head, selector, predecessors[:4], targets[:4], candidates[:4],
        weights[:4], None,
    )  # fmt: skip
    torch.testing.assert_close(whole, first)
    none = selector_loss(
        hidden[4:], hidden[4:], head, selector, predecessors[4:], targets[4:], candidates[4:],
        weights[4:], None,
    )  # fmt: skip
    assert float(none) == 0.0
    grads = torch.autograd.grad(none, list(selector.parameters()))
    assert all(float(grad.abs().sum()) == 0.0 for grad in grads)
