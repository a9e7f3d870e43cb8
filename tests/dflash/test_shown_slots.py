"""`objective.reveal_blocks`: some blocks show some slots' true tokens in place of the mask and
score only the hidden ones; `dllm dflash eval --draft-steps`: the drafter refines its own draft,
each forward showing its most confident guesses to the next."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from tests.dflash.helpers import (
    MASK,
    assert_two_processes_train_the_one_process_trace,
    drafter_spec,
)
from tests.helpers import assert_user_error
from tests.train.util import losses
from turbo_dllm.errors import DllmError
from turbo_dllm.families.dflash.plan import draft_tokens, share_anchors
from turbo_dllm.families.dflash.speculative import _DFlashProposer
from turbo_dllm.train.entry import train
from turbo_dllm.train.objectives import NoiseKey
from turbo_dllm.train.objectives.dflash_distillation import DFlashDistillation

B = 6
KEY = NoiseKey(0, 2, 0, 3)


def _batch(reveal: float = 0.6, key=KEY):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 200, (3, 64), generator=g)
    docs = torch.zeros_like(ids)
    docs[:, 40:] = 1  # a document boundary inside every row
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[2, :10] = False  # a prompt: shown, never scored
    objective = DFlashDistillation(block_size=B, max_anchors=12, reveal_blocks=reveal)
    data = {"input_ids": ids, "loss_mask": mask, "doc_ids": docs}
    return objective, data, objective.corrupt(data, key), ids, docs


def test_shown_slots_hold_true_tokens_of_the_anchors_document_and_are_never_scored():
    objective, data, batch, ids, docs = _batch()
    rows, width = batch.anchors.shape
    shown = batch.shown
    assert shown.shape == (rows, width, B) and not shown[:, :, 0].any()  # the anchor is its own
    scored = torch.zeros(rows * width * B, dtype=torch.bool)
    scored[batch.score_index] = True
    assert not (scored & shown.flatten()).any()
    tokens, positions = draft_tokens(batch, MASK)
    tokens, positions = tokens.view(rows, width, B), positions.view(rows, width, B)
    for r, n, k in shown.nonzero().tolist():
        a, p = int(batch.anchors[r, n]), int(positions[r, n, k])
        assert batch.anchor_valid[r, n] and p == a + k and docs[r, p] == docs[r, a]
        assert tokens[r, n, k] == ids[r, p]
    assert (tokens[:, :, 1:][~shown[:, :, 1:]] == MASK).all()  # the rest are masks
    # about reveal_blocks of the blocks show something, and each keeps a hidden slot
    blocks = shown[batch.anchor_valid]
    showing = blocks.any(dim=1)
    assert 0.3 < showing.float().mean() < 0.9
    assert (~blocks[:, 1:]).any(dim=1).all()
    # the same key draws the same slots, and the count the trainer divides by is theirs
    assert torch.equal(objective.corrupt(data, KEY).shown, shown)
    assert objective.supervised_count(data, KEY) == batch.num_scored
    assert not torch.equal(objective.corrupt(data, NoiseKey(0, 3, 0, 3)).shown, shown)


def test_without_reveal_blocks_nothing_is_shown_and_the_anchors_are_unchanged():
    _, _, plain, _, _ = _batch(reveal=0.0)
    _, _, showing, _, _ = _batch(reveal=0.6)
    assert plain.shown is None
    assert torch.equal(plain.anchors, showing.anchors)  # shown slots draw from their own stream
    assert showing.num_scored < plain.num_scored
    tokens, _ = draft_tokens(plain, MASK)
    assert (tokens.view(*plain.anchors.shape, B)[:, :, 1:] == MASK).all()


def test_block_parallel_shares_keep_each_blocks_shown_slots():
    _, _, batch, _, _ = _batch()
    whole = {
        int(a): batch.shown[r, n].tolist()
        for r, n in batch.anchor_valid.nonzero().tolist()
        for a in [batch.anchors[r, n] + 1000 * r]
    }
    seen = {}
    for rank in range(2):
        share = share_anchors(batch, rank, 2)
        for r, n in share.anchor_valid.nonzero().tolist():
            seen[int(share.anchors[r, n] + 1000 * r)] = share.shown[r, n].tolist()
    assert seen == whole


def test_reveal_blocks_is_refused_where_slot_k_is_not_the_token_at_anchor_plus_k():
    with pytest.raises(ValueError, match=r"reveal_blocks must be in \[0, 1\)"):
        DFlashDistillation(block_size=4, max_anchors=4, reveal_blocks=1.0)
    with pytest.raises(ValueError, match="sample_from_anchor false"):
        DFlashDistillation(block_size=4, max_anchors=4, reveal_blocks=0.5, sample_from_anchor=True)


def test_a_drafter_trains_with_shown_slots(world, tmp_path):
    run = tmp_path / "shown"
    args = ("training.steps=6", "checkpoint.interval=null", "objective.reveal_blocks=0.5")
    train(drafter_spec(world["target"], world["artifact"], *args), run)
    trace = losses(run)
    assert trace[-1] < trace[0], trace


class _ScriptedDrafter:
    """A drafter whose every forward returns scripted logits (lm_head is the identity) and
    records the block it was given."""

    def __init__(self, scripts):
        self.config = SimpleNamespace(
            target_layer_ids=(0,), mask_token_id=MASK, sample_from_anchor=False, is_dflash2=False
        )
        self.scripts, self.blocks = list(scripts), []
        self.lm_head = torch.nn.Identity()

    def hidden_states(self, block, positions, context, projected=None):
        self.blocks.append(block.clone())
        return self.scripts.pop(0)[None]

    def greedy_draft(self, hidden, anchor):
        return hidden.argmax(-1)


def _logits(tokens, confidence, vocab=300):
    out = torch.zeros(len(tokens) + 1, vocab)  # row 0: the anchor's slot
    for i, (t, c) in enumerate(zip(tokens, confidence, strict=True)):
        out[i + 1, t] = c
    return out


def test_each_draft_step_shows_its_most_confident_guesses_to_the_next():
    first = _logits([11, 12, 13, 14, 15, 16, 17], [1, 9, 2, 8, 3, 7, 4])
    second = _logits([21, 22, 23, 24, 25, 26, 27], [5] * 7)
    drafter = _ScriptedDrafter([first, second])
    proposer = _DFlashProposer(drafter, block_size=8, draft_steps=2)
    assert proposer.reveals == [3]  # 7 hidden slots over two forwards: 3 shown, 4 drafted last
    proposer.context = torch.zeros(1, 5, 4)
    proposer.masks = torch.full((7,), MASK)
    proposer.offsets = torch.arange(8)[None]
    drafts = proposer.propose(torch.tensor([42]), length=6)
    # slots 2, 4 and 6 (confidence 9, 8, 7) keep the first forward's guesses
    assert drafts.tolist() == [21, 12, 23, 14, 25, 16, 27]
    assert drafter.blocks[0].tolist() == [[42] + [MASK] * 7]
    assert drafter.blocks[1].tolist() == [[42, MASK, 12, MASK, 14, MASK, 16, MASK]]


def test_draft_steps_split_the_hidden_slots_evenly():
    drafter = _ScriptedDrafter([])
    assert _DFlashProposer(drafter, block_size=8).reveals == []
    assert _DFlashProposer(drafter, block_size=8, draft_steps=3).reveals == [2, 2]
    assert _DFlashProposer(drafter, block_size=16, draft_steps=4).reveals == [3, 4, 4]
    with pytest.raises(DllmError, match="at least 1"):
        _DFlashProposer(drafter, block_size=8, draft_steps=0)
    drafter.config.sample_from_anchor = True
    with pytest.raises(DllmError, match="draft-steps > 1"):
        _DFlashProposer(drafter, block_size=8, draft_steps=2)


def test_eval_with_draft_steps_is_lossless(cli, world, drafter):
    args = ["--target", world["target"], "--drafter", drafter["folder"]]
    args += ["--data", world["artifact"], "--max-new-tokens", "16", "--num-prompts", "2"]
    result = cli("dflash", "eval", *args, "--draft-steps", "2", "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert report["lossless"] is True and report["tau"] >= 1.0


def test_eval_refuses_draft_steps_below_one_before_decoding(cli, world, drafter):
    args = ["--target", world["target"], "--drafter", drafter["folder"]]
    result = cli("dflash", "eval", *args, "--data", world["artifact"], "--draft-steps", "0")
    assert_user_error(result, "--draft-steps must be at least 1")


@pytest.mark.parametrize("flag", ["--target", "--drafter"])
def test_eval_names_the_flag_whose_folder_is_not_a_model(cli, world, drafter, tmp_path, flag):
    folders = {"--target": world["target"], "--drafter": drafter["folder"], flag: tmp_path}
    args = [x for pair in folders.items() for x in pair]
    result = cli("dflash", "eval", *args, "--data", world["artifact"])
    assert_user_error(result, f"{flag} {str(tmp_path)!r} is not a model folder", f"point {flag}")


def test_a_dflash2_run_with_shown_slots_is_refused_at_validation(world):
    with pytest.raises(DllmError, match="objective.reveal_blocks") as error:
        drafter_spec(
            world["target"],
            world["artifact"],
            "model.dflash.architecture=DFlash2DraftModel",
            "objective.dflash_loss=dflash",
            "objective.reveal_blocks=0.5",
        )
    assert "DFlashDraftModel drafters with sample_from_anchor false" in str(error.value)


@pytest.mark.parametrize(
    "topology",
    [("topology.dp=2", "training.micro_batch_size=2"), ("topology.bp=2",)],
    ids=["dp2", "bp2"],
)
def test_two_processes_with_shown_slots_train_the_one_process_trace(world, tmp_path, topology):
    """A row's shown slots do not depend on the rows it shares a micro-batch with (dp), and
    each rank's share of the anchors keeps its blocks' (bp)."""
    common = ("objective.reveal_blocks=0.5",)
    assert_two_processes_train_the_one_process_trace(world, tmp_path, topology, common)
