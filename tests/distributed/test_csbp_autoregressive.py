"""The autoregressive objective, which scores the clean stream, under every layout that shares a
sequence: BP only (cp = 1) and fused (1 < cp < bp) hold each clean token on several ranks, yet
each is scored once (by its scorer, `clean_scorers`), so loss and every parameter gradient equal
one process's, with packed documents and without (`-nodocs`). CSBP with cp = bp and the CP
baseline, which hold each clean token once, are the controls.

The multi-process cases run through `test_csbp_model`'s harness (same oracle, same tolerance);
they also require the scored tokens summed over a context group to be the whole batch's.
"""

from __future__ import annotations

import pytest
import torch

from tests.distributed.harness import declare_cases, errors_per_world
from tests.distributed.test_csbp_model import RTOL, _run_case
from turbo_dllm.train.parallel.layout import CsbpLayout, clean_scorers, dual_end_block_assignment

# (name, cp, bp, objective); the world gives dp = world / max(cp, bp)
CASES: dict[int, list[tuple[str, int, int, str]]] = {
    2: [
        ("csbp-bp2-cp1-ar", 1, 2, "autoregressive"),
        ("csbp-bp2-cp1-ar-nodocs", 1, 2, "autoregressive"),
        ("csbp-bp2-cp2-ar", 2, 2, "autoregressive"),
        ("cp2-ar", 2, 1, "autoregressive"),
        # the clean stream alone, sharded over the context group (train.attention.trim)
        ("csbp-bp2-cp1-ar-trim", 1, 2, "autoregressive"),
        ("cp2-ar-trim", 2, 1, "autoregressive"),
    ],
    4: [
        ("csbp-bp4-cp1-ar", 1, 4, "autoregressive"),
        ("csbp-bp4-cp1-ar-nodocs", 1, 4, "autoregressive"),
        ("csbp-bp4-cp2-ar", 2, 4, "autoregressive"),
        ("csbp-bp4-cp2-ar-nodocs", 2, 4, "autoregressive"),
        ("csbp-bp2-cp1-dp2-ar", 1, 2, "autoregressive"),
        ("csbp-bp4-cp2-ar-trim", 2, 4, "autoregressive"),
        ("csbp-bp4-cp1-ar-nodocs-trim", 1, 4, "autoregressive"),
        ("cp2-dp2-ar-trim", 2, 1, "autoregressive"),
    ],
}


declare_cases("ar", _run_case, CASES)  # run with the other modules' cases (harness)


@pytest.fixture(scope="module")
def errors(tmp_path_factory):
    return errors_per_world(_run_case, CASES, tmp_path_factory, "ar")


@pytest.mark.parametrize("world,name", [(w, c[0]) for w, cases in CASES.items() for c in cases])
def test_autoregressive_loss_and_every_gradient_equal_single_rank(errors, world, name):
    assert errors[world][name] < RTOL, (name, errors[world][name])


@pytest.mark.parametrize(
    "seq_len,block,bp,cp",
    [(128, 1, 2, 1), (128, 1, 4, 1), (128, 1, 4, 2), (128, 1, 8, 2), (36, 4, 4, 1), (128, 4, 4, 4)],
)
def test_every_clean_token_has_one_scorer_that_holds_it(seq_len, block, bp, cp):
    """Across the bp ranks each clean token is scored exactly once, by a rank holding it, and
    the ranks score equal shares when the blocks divide evenly (36 / 4: 9 blocks, a middle
    block)."""
    scorers = clean_scorers(seq_len, block, bp, cp, dual_end_block_assignment(seq_len // block, bp))
    layouts = [CsbpLayout.build(seq_len, block, bp, cp, r) for r in range(bp)]
    scored = torch.cat([lay.clean_positions[lay.scored_clean] for lay in layouts])
    assert sorted(scored.tolist()) == list(range(seq_len))
    for rank, lay in enumerate(layouts):
        mine = (scorers == rank).nonzero().flatten()
        assert torch.equal(lay.clean_positions[lay.scored_clean].sort().values, mine)
    shares = [int(lay.scored_clean.sum()) for lay in layouts]
    if (seq_len // block) % (2 * bp) == 0:
        assert len(set(shares)) == 1, shares
