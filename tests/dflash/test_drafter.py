"""The DFlash drafter: anchors and slots, its attention against a per-block reference, the
frozen-head KL against the dense one, HF round trip, and the errors a misfit raises early."""

from __future__ import annotations

import json

import pytest
import torch

from tests.dflash.helpers import MASK, drafter_document, drafter_spec
from turbo_dllm.config.runspec import RunSpec
from turbo_dllm.config.validate import check
from turbo_dllm.families.dflash.losses import frozen_linear_kl
from turbo_dllm.families.dflash.model import DraftContext
from turbo_dllm.families.dflash.plan import draft_attention_mask
from turbo_dllm.families.dflash.runtime import build_model, materialize
from turbo_dllm.registry import resolve_model_config
from turbo_dllm.train.objectives import NoiseKey
from turbo_dllm.train.objectives.dflash_distillation import DFlashDistillation, draw_anchors
from turbo_dllm.train.weights import full_state_dict, save_hf

KEY = NoiseKey(seed=3, step=1, first_sample=0, samples_per_step=2)


def _batch(length=32, docs=None):
    ids = torch.randint(0, 250, (2, length), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[1, :5] = False
    batch = {"input_ids": ids, "loss_mask": mask}
    if docs is not None:
        batch["doc_ids"] = docs
    return batch


@pytest.mark.parametrize("how", ["uniform", "locality"])
def test_anchor_draws_are_unique_sorted_bounded_and_keyed(how):
    candidates = torch.arange(3, 40, 2)
    draws = [
        draw_anchors(candidates, 7, how, 4, torch.Generator().manual_seed(s)) for s in range(20)
    ]
    for d in draws:
        assert (
            len(d) == 7
            and bool((d[1:] > d[:-1]).all())
            and set(d.tolist()) <= set(candidates.tolist())
        )
    assert len({tuple(d.tolist()) for d in draws}) > 1  # they are random
    torch.testing.assert_close(
        draws[0], draw_anchors(candidates, 7, how, 4, torch.Generator().manual_seed(0))
    )
    assert draw_anchors(candidates, 100, how, 4, torch.Generator()).tolist() == candidates.tolist()


@pytest.mark.parametrize("from_anchor", [False, True])
def test_slots_follow_the_contract_documents_and_decay(from_anchor):
    docs = torch.tensor([[0] * 20 + [1] * 12, [0] * 32])
    objective = DFlashDistillation(
        block_size=4,
        max_anchors=50,
        decay_gamma=2.0,
        sample_from_anchor=from_anchor,
        loss="paper_ce",
    )
    batch = _batch(docs=docs)
    draft = objective.corrupt(batch, KEY)
    assert draft.num_scored == objective.supervised_count(batch, key=KEY)
    ids = batch["input_ids"]
    width = draft.anchors.shape[1]
    r = draft.score_index // (width * 4)
    n = (draft.score_index // 4) % width
    k = draft.score_index % 4
    anchor = draft.anchors[r, n]
    position = anchor + k + (1 if from_anchor else 0)
    assert bool(draft.anchor_valid[r, n].all())
    torch.testing.assert_close(draft.targets, ids[r, position])
    assert bool((docs[r, position] == docs[r, anchor]).all())  # never across documents
    torch.testing.assert_close(draft.teacher_index, r * 32 + position - 1)
    if not from_anchor:
        assert bool((k >= 1).all())
    distance = k if from_anchor else k - 1
    torch.testing.assert_close(draft.weights, torch.exp(-distance / 2.0).float())
    # anchors: supervised, next token supervised, same document
    for row in range(2):
        for a in draft.anchors[row][draft.anchor_valid[row]].tolist():
            assert batch["loss_mask"][row, a] and batch["loss_mask"][row, a + 1]
            assert docs[row, a] == docs[row, a + 1]


def test_frozen_linear_kl_equals_the_dense_kl_and_its_gradient():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(37, 16, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.randn(37, 16, generator=g, dtype=torch.float64)
    w = torch.randn(50, 16, generator=g, dtype=torch.float64)
    weights = torch.rand(37, generator=g, dtype=torch.float64)
    got = frozen_linear_kl(h, w, t, weights, chunk_size=8)
    p = torch.softmax(t @ w.T, -1)
    want = (weights * (p * (p.log() - torch.log_softmax(h @ w.T, -1))).sum(-1)).sum()
    torch.testing.assert_close(got.double(), want)
    (grad,) = torch.autograd.grad(want, h)
    got.backward()
    torch.testing.assert_close(h.grad, grad)


def _drafter(world, *overrides):
    spec = drafter_spec(world["target"], world["artifact"], *overrides)
    config = resolve_model_config(spec.model)
    model = materialize(build_model(config), torch.device("cpu"), seed=0)
    return config, model.eval()


def test_each_block_sees_itself_and_its_documents_context_before_the_anchor(world):
    """The batched masked forward equals running each block alone on its visible context."""
    config, model = _drafter(world, "model.dflash.num_layers=2")
    g = torch.Generator().manual_seed(0)
    length, b = 24, config.block_size
    features = torch.randn(2, length, config.feature_size, generator=g)
    docs = torch.tensor([[0] * 10 + [1] * 14, [0] * 24])
    anchors = torch.tensor([[3, 12, 20], [0, 7, 19]])
    valid = torch.tensor([[True, True, True], [True, True, False]])
    tokens = torch.randint(0, 250, (2, 3 * b), generator=g)
    positions = (anchors[:, :, None] + torch.arange(b)).reshape(2, -1)
    mask = draft_attention_mask(anchors, valid, docs, length, b)
    with torch.no_grad():
        out = model(tokens, positions, DraftContext(features, torch.arange(length), mask))
        for row in range(2):
            for n in range(3):
                if not valid[row, n]:
                    continue
                a = int(anchors[row, n])
                start = int((docs[row] == docs[row, a]).nonzero()[0])
                ctx = features[row : row + 1, start:a]
                block = slice(n * b, (n + 1) * b)
                alone = model(
                    tokens[row : row + 1, block],
                    positions[row : row + 1, block],
                    DraftContext(ctx, torch.arange(start, a), None),
                )
                torch.testing.assert_close(out[row : row + 1, block], alone, rtol=1e-5, atol=1e-5)


def test_config_and_weights_round_trip_through_an_hf_folder(world, tmp_path):
    config, model = _drafter(world)
    state = full_state_dict(model)
    assert "embed_tokens.weight" not in state and "lm_head.weight" not in state  # the target's
    save_hf(state, config, tmp_path)
    hf = json.loads((tmp_path / "config.json").read_text())
    assert hf["architectures"] == ["DFlashDraftModel"]
    assert hf["dflash_config"]["mask_token_id"] == MASK
    document = drafter_document(
        world["target"], world["artifact"], f"model.path={tmp_path}", "model.from_config=null"
    )
    again = resolve_model_config(check(RunSpec.model_validate(document)).model)
    assert again == config
    reloaded = materialize(
        build_model(again), torch.device("cpu"), seed=1, weights_from=str(tmp_path)
    )
    for name, tensor in full_state_dict(reloaded).items():
        assert torch.equal(tensor, state[name]), name
    target_embed = model.embed_tokens.weight
    assert torch.equal(reloaded.embed_tokens.weight, target_embed)
    assert not reloaded.embed_tokens.weight.requires_grad


@pytest.mark.parametrize(
    "override,message",
    [
        ("model.dflash.target_layer_ids=[0, 7]", "not layers of"),
        ("model.dflash.block_size=8", "is not the drafter's block size"),
        ("objective.max_anchors=0", "max_anchors\n  Input should be greater than 0"),
        ("model.dflash.mask_token_id=600", "outside the vocabulary"),
        ("topology.tp=2", "tp is not supported here"),
        (("objective.greedy_path=true", "objective.dflash_loss=paper_ce"), "needs the target's"),
    ],
)
def test_bad_drafters_are_refused_at_validation(world, override, message):
    overrides = override if isinstance(override, tuple) else (override,)
    document = drafter_document(world["target"], world["artifact"], *overrides)
    with pytest.raises(Exception, match=message):
        check(RunSpec.model_validate(document))


def test_a_drafter_folder_of_another_target_is_refused(world, tmp_path):
    config, model = _drafter(world)
    import dataclasses

    wider = dataclasses.replace(config, hidden_size=96, target_hidden_size=96, vocab_size=300)
    save_hf({}, wider, tmp_path)
    document = drafter_document(
        world["target"], world["artifact"], f"model.path={tmp_path}", "model.from_config=null"
    )
    with pytest.raises(Exception) as error:
        check(RunSpec.model_validate(document))
    text = str(error.value)
    assert "hidden size (96)" in text and "vocabulary (300)" in text


def test_model_dflash_fields_a_drafter_folder_would_ignore_are_refused(world, tmp_path):
    """With model.path the folder's shape is trained: a model.dflash field given another value
    (the required mask_token_id included) was silently dropped; it is refused at its field."""
    config, model = _drafter(world)
    save_hf(full_state_dict(model), config, tmp_path)
    folder = (f"model.path={tmp_path}", "model.from_config=null")
    document = drafter_document(
        world["target"],
        world["artifact"],
        *folder,
        "model.dflash.mask_token_id=7",
        "model.dflash.num_layers=3",
    )
    with pytest.raises(Exception) as error:
        check(RunSpec.model_validate(document))
    text = str(error.value)
    assert (
        f"model.dflash.mask_token_id: 7, but the drafter folder {str(tmp_path)!r} has {MASK}"
        in text
    )
    assert "model.dflash.num_layers: 3, but the drafter folder" in text
    # the folder's own values, and a spec written back with every default, still validate
    spec = check(
        RunSpec.model_validate(drafter_document(world["target"], world["artifact"], *folder))
    )
    assert resolve_model_config(spec.model) == config
    check(RunSpec.model_validate(spec.model_dump(mode="json")))


def test_masked_attention_hands_sdpa_equal_head_counts(monkeypatch):
    """With a mask, grouped K/V heads are expanded before SDPA (CUDA's fused kernel takes the
    call, not the math fallback); the result is grouped-query attention's."""
    from turbo_dllm.families.dflash import attention as drafter_model

    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 6, 8, generator=g)
    k, v = torch.randn(2, 2, 10, 8, generator=g), torch.randn(2, 2, 10, 8, generator=g)
    mask = torch.rand(2, 1, 6, 10, generator=g) > 0.3
    mask[..., 0] = True  # every query sees a key
    expected = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, enable_gqa=True
    )
    seen = []
    sdpa = drafter_model.F.scaled_dot_product_attention

    def spy(q, k, v, **kwargs):
        seen.append((q.shape[1], k.shape[1], kwargs["enable_gqa"]))
        return sdpa(q, k, v, **kwargs)

    monkeypatch.setattr(drafter_model.F, "scaled_dot_product_attention", spy)
    out = drafter_model.masked_attention(q, k, v, mask)
    assert seen == [(4, 4, False)]
    torch.testing.assert_close(out, expected)


def test_the_target_runs_a_batch_in_one_forward(world):
    """All rows of a micro-batch go through the frozen target together (one row at a time was
    most of a GPU drafter step); each row's features are the one-row forward's."""
    from turbo_dllm.families.dflash.target import TargetFeatures

    config = resolve_model_config(drafter_spec(world["target"], world["artifact"]).model)
    target = TargetFeatures(str(world["target"]), config, teacher=True, device=torch.device("cpu"))
    calls = []
    target.model.model.layers[0].register_forward_hook(lambda *args: calls.append(1))
    ids = torch.randint(0, 250, (3, 16), generator=torch.Generator().manual_seed(0))
    docs = torch.tensor([[0] * 16, [0] * 5 + [1] * 11, [2] * 16])
    features, teacher = target(ids, docs)
    assert len(calls) == 1
    for row in range(3):
        alone, alone_teacher = target(ids[row : row + 1], docs[row : row + 1])
        assert torch.equal(features[row : row + 1], alone)
        assert torch.equal(teacher[row : row + 1], alone_teacher)


@pytest.mark.parametrize("context", [16, 40, 256])
def test_grouped_draft_attention_equals_one_sdpa_over_every_key(context):
    """Groups of whole blocks against [context, their own draft tokens] give every query the
    keys, and so the output, of one SDPA over [context, all draft tokens] under the same mask."""
    from turbo_dllm.families.dflash.attention import (
        attention_groups,
        draft_attention,
        masked_attention,
    )

    g = torch.Generator().manual_seed(context)
    rows, blocks, b = 2, 12, 4
    anchors = torch.sort(torch.randint(1, context, (rows, blocks), generator=g)).values
    valid = torch.rand(rows, blocks, generator=g) > 0.2
    docs = (torch.arange(context) >= context // 2).long().expand(rows, -1)
    mask = draft_attention_mask(anchors, valid, docs, context, b)
    q = torch.randn(rows, 4, blocks * b, 8, generator=g, requires_grad=True)
    ck, cv = (torch.randn(rows, 2, context, 8, generator=g) for _ in range(2))
    k, v = (torch.randn(rows, 2, blocks * b, 8, generator=g) for _ in range(2))
    groups = attention_groups(blocks * b, context, b)
    out = draft_attention(q, ck, cv, k, v, mask, b)
    dense = masked_attention(q, torch.cat([ck, k], 2), torch.cat([cv, v], 2), mask)
    torch.testing.assert_close(out, dense, rtol=1e-5, atol=1e-6)
    (grad,) = torch.autograd.grad(out.square().sum(), q)
    (dense_grad,) = torch.autograd.grad(dense.square().sum(), q)
    torch.testing.assert_close(grad, dense_grad, rtol=1e-5, atol=1e-5)
    assert groups == {16: 12, 40: 6, 256: 1}[context]  # 1: few draft tokens next to the context


@pytest.mark.parametrize(
    "target_layers,draft_layers,expected",
    [
        (36, 5, (1, 9, 17, 25, 33)),  # z-lab's spread over 1 .. n-3
        (16, 2, (1, 13)),
        (8, 1, (4,)),  # one draft layer: the middle
        (4, 2, (1,)),  # the range holds one layer: once, not [1, 1]
        (6, 4, (1, 2, 3)),  # fewer layers than the drafter: each once, in order
        (3, 2, (1,)),
    ],
)
def test_default_target_layers_spread_without_repeats(target_layers, draft_layers, expected):
    from turbo_dllm.families.dflash.config import default_target_layer_ids

    assert default_target_layer_ids(target_layers, draft_layers) == expected
