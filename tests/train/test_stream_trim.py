"""Work nothing reads is skipped (`train.attention.trim`): the autoregressive objective runs the
clean half alone, and block diffusion's last layer computes the noisy rows only. Losses and
gradients are the whole stream's (and, for the autoregressive objective, transformers' causal LM
loss); the FLOP count is what the trimmed model computes."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.train.util import tiny_spec
from turbo_dllm.families.decoder.runtime import build_model
from turbo_dllm.registry import get_family
from turbo_dllm.train.attention import BlockDiffusionLayout, ReferenceAttention, dense_mask
from turbo_dllm.train.attention.layout import allowed_pairs_by_stream
from turbo_dllm.train.attention.trim import CLEAN_HALF, LAST_LAYER_QUERIES
from turbo_dllm.train.objectives import NoiseKey, build_objective, score
from turbo_dllm.train.parallel.plan import WholeSequence, model_work
from turbo_dllm.train.weights import materialize

KEY = NoiseKey(seed=0, step=3, first_sample=0, samples_per_step=2)
CPU = torch.device("cpu")
TRIMS = frozenset({CLEAN_HALF, LAST_LAYER_QUERIES})


def _decoder():
    config = get_family("qwen3").resolve_config(path=None, from_config="tiny")
    return materialize(build_model(config, ReferenceAttention()), CPU, seed=0)


def _nemotron():
    from turbo_dllm.families.nemotron_diffusion.runtime import build_model as build_nemotron

    config = get_family("nemotron_diffusion").resolve_config(path=None, from_config="tiny")
    config = dataclasses.replace(config, v_norm=True, attn_output_gate=True)
    return materialize(build_nemotron(config, ReferenceAttention()), CPU, seed=0)


def _batch(rows: int = 2, L: int = 32, docs: bool = False, vocab: int = 90):
    ids = torch.randint(0, vocab, (rows, L), generator=torch.Generator().manual_seed(rows + L))
    batch = {"input_ids": ids, "loss_mask": torch.ones_like(ids, dtype=torch.bool)}
    if docs:
        batch["doc_ids"] = torch.tensor([[0] * 10 + [1] * (L - 10)] * rows)
    return batch


def _run(model, plan, objective, batch):
    """(loss, {name: grad}, the rows the model's output hook received)."""
    model.zero_grad(set_to_none=True)
    inputs = plan.prepare(objective.corrupt(batch, KEY), CPU)
    seen = {}

    def output(hidden, weight):
        seen["rows"] = hidden.shape[1]
        return score(inputs.batch, hidden, weight)

    loss = model(inputs.input_ids, inputs.positions, inputs.mask, output=output)
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads, seen["rows"]


def _same(whole, trimmed):
    torch.testing.assert_close(trimmed[0], whole[0], rtol=1e-5, atol=1e-5)
    assert trimmed[1].keys() == whole[1].keys()
    for name, grad in whole[1].items():
        torch.testing.assert_close(trimmed[1][name], grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("docs", [False, True])
@pytest.mark.parametrize("objective_name", ["block_diffusion", "fast_dllm_v2"])
def test_the_last_layer_computes_only_the_noisy_rows(objective_name, docs):
    model = _decoder()
    spec = tiny_spec(f"objective.name={objective_name}", "objective.block_size=8")
    objective = build_objective(spec.objective, mask_token_id=95)
    batch = _batch(docs=docs)
    whole = _run(model, WholeSequence(ReferenceAttention()), objective, batch)
    trimmed_plan = WholeSequence(ReferenceAttention(), TRIMS)
    assert trimmed_plan.trim(objective.corrupt(batch, KEY)) == LAST_LAYER_QUERIES
    trimmed = _run(model, trimmed_plan, objective, batch)
    assert (whole[2], trimmed[2]) == (64, 32)  # final hidden states: 2L rows, then L
    _same(whole, trimmed)


@pytest.mark.parametrize("docs", [False, True])
def test_the_autoregressive_objective_runs_the_clean_half_alone(docs):
    model = _decoder()
    objective = build_objective(tiny_spec("objective.name=autoregressive").objective, 95)
    batch = _batch(docs=docs)
    plan = WholeSequence(ReferenceAttention(), TRIMS)
    inputs = plan.prepare(objective.corrupt(batch, KEY), CPU)
    assert inputs.input_ids.shape == (2, 32)
    assert torch.equal(inputs.input_ids, batch["input_ids"])  # the clean half: the data itself
    assert torch.equal(inputs.positions, torch.arange(32))
    whole = _run(model, WholeSequence(ReferenceAttention()), objective, batch)
    trimmed = _run(model, plan, objective, batch)
    assert (whole[2], trimmed[2]) == (64, 32)
    _same(whole, trimmed)


def test_the_clean_half_alone_is_transformers_causal_lm(tmp_path):
    """The oracle no one here wrote: the trimmed stream's loss and gradients are transformers'
    causal LM loss on the same weights."""
    from tests.train.test_autoregressive import _hf_and_ours

    hf, ours = _hf_and_ours(tmp_path)
    objective = build_objective(tiny_spec("objective.name=autoregressive").objective, 96)
    ids = torch.randint(0, 97, (2, 32), generator=torch.Generator().manual_seed(1))
    batch = {"input_ids": ids, "loss_mask": torch.ones_like(ids, dtype=torch.bool)}
    loss, grads, rows = _run(ours, WholeSequence(ReferenceAttention(), TRIMS), objective, batch)
    assert rows == 32
    want = hf(input_ids=ids, labels=ids).loss
    torch.testing.assert_close(loss / objective.supervised_count(batch), want, rtol=1e-5, atol=1e-5)
    want.backward()
    count = objective.supervised_count(batch)
    for name, grad in grads.items():
        torch.testing.assert_close(
            grad / count, hf.get_parameter(name).grad, rtol=1e-4, atol=1e-6, msg=name
        )


@pytest.mark.parametrize("objective_name", ["block_diffusion", "autoregressive"])
def test_nemotron_takes_both_trims(objective_name):
    model = _nemotron()
    spec = tiny_spec(f"objective.name={objective_name}", "objective.block_size=8")
    objective = build_objective(spec.objective, mask_token_id=95)
    batch = _batch()
    whole = _run(model, WholeSequence(ReferenceAttention()), objective, batch)
    trimmed = _run(model, WholeSequence(ReferenceAttention(), TRIMS), objective, batch)
    assert trimmed[2] == 32
    _same(whole, trimmed)


def test_a_batch_scoring_both_halves_or_with_extra_rows_keeps_the_whole_stream():
    spec = tiny_spec("objective.block_size=8")
    objective = build_objective(spec.objective, mask_token_id=95)
    diffusion = objective.corrupt(_batch(), KEY)
    plan = WholeSequence(ReferenceAttention(), TRIMS)
    both = dataclasses.replace(
        diffusion, score_index=torch.cat([diffusion.score_index, diffusion.score_index[:1] + 32])
    )
    assert both.scored_half is None and plan.trim(both) is None
    extra = dataclasses.replace(diffusion, model_kwargs={"x": torch.zeros(1)})
    assert plan.trim(extra) is None
    assert WholeSequence(ReferenceAttention()).trim(diffusion) is None  # the family did not ask


def test_the_flop_count_is_what_the_trimmed_model_computes():
    model = _decoder()
    config = model.config
    plan = WholeSequence(ReferenceAttention(), TRIMS)
    batch = _batch()

    ar = build_objective(tiny_spec("objective.name=autoregressive").objective, 95)
    d = ar.corrupt(batch, KEY)
    work = model_work(plan, d)
    # 2 rows of 32 clean tokens, token-causal: 32 * 33 / 2 pairs a row
    assert work == {"stream_tokens": 64, "scored_tokens": d.num_scored, "pairs": 2 * 528}
    assert model_work(WholeSequence(ReferenceAttention()), d)["stream_tokens"] == 128

    bd = build_objective(tiny_spec("objective.block_size=8").objective, 95)
    d = bd.corrupt(batch, KEY)
    work = model_work(plan, d)
    layout = BlockDiffusionLayout(32, 8)
    noisy_pairs, clean_pairs = allowed_pairs_by_stream(layout)
    mask = dense_mask(layout)[0, 0]  # the split held to the mask itself: noisy rows first
    assert (noisy_pairs, clean_pairs) == (int(mask[:32].sum()), int(mask[32:].sum()))
    assert work["last_layer"] == (64, 2 * noisy_pairs)
    full = config.step_flops(stream_tokens=128, scored_tokens=d.num_scored, pairs=work["pairs"])
    h, kv = config.hidden_size, config.num_key_value_heads * config.head_dim
    skipped = 6.0 * (config.layer_matmul_params - 2 * h * kv) * 64  # the clean rows' matmuls
    skipped += 12.0 * config.head_dim * config.num_attention_heads * 2 * clean_pairs
    assert config.step_flops(**work) == pytest.approx(full - skipped)


def test_windowed_masks_are_the_whole_mask_s_slices():
    layout = BlockDiffusionLayout(32, 8)
    docs = torch.tensor([[0] * 10 + [1] * 22, [0] * 32])
    reference = ReferenceAttention()
    whole = reference.prepare(layout, docs, CPU)
    noisy_queries = reference.prepare(layout, docs, CPU, queries=range(32))
    clean = reference.prepare(layout, docs, CPU, queries=range(32, 64), keys=range(32, 64))
    assert torch.equal(noisy_queries, whole[..., :32, :])
    assert torch.equal(clean, whole[..., 32:, 32:])
    with pytest.raises(ValueError, match="not a window"):
        reference.prepare(layout, docs, CPU, queries=range(10, 70))


@pytest.mark.parametrize("docs", [False, True])
def test_flex_windows_attend_as_the_reference(docs):
    """FlexAttention's windowed BlockMasks (forward, which torch runs on CPU) against the
    reference's slices: one-document masks (built eagerly) and per-batch document masks."""
    from turbo_dllm.train.attention import FlexAttention

    layout = BlockDiffusionLayout(128, 16)
    doc_ids = torch.tensor([[0] * 50 + [1] * 78]) if docs else None
    q = torch.randn(1, 4, 256, 16)
    k, v = torch.randn(1, 2, 256, 16), torch.randn(1, 2, 256, 16)
    flex, reference = FlexAttention(compile=False), ReferenceAttention()
    for queries, keys in [(range(128), None), (range(128, 256), range(128, 256))]:
        rows = slice(queries.start, queries.stop)
        cols = slice(0, 256) if keys is None else slice(keys.start, keys.stop)
        want = reference(
            q[:, :, rows],
            k[:, :, cols],
            v[:, :, cols],
            reference.prepare(layout, doc_ids, CPU, queries=queries, keys=keys),
        )
        mask = flex.prepare(layout, doc_ids, CPU, queries=queries, keys=keys)
        got = flex(q[:, :, rows], k[:, :, cols], v[:, :, cols], mask)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_the_trainer_trims_and_counts_the_work_it_does(tmp_path):
    """An autoregressive run computes half the stream: its FLOPs a step are those of L tokens,
    and its losses are those of the untrimmed model (the objective's own test holds the loss to
    transformers); sequence parallelism would keep the whole stream."""
    from turbo_dllm.train.distributed import init_distributed
    from turbo_dllm.train.trainer import Trainer

    spec = tiny_spec("objective.name=autoregressive", "training.steps=2")
    trainer = Trainer(spec, tmp_path / "run", init_distributed()).build()
    assert trainer.plan.trims == TRIMS
    config = trainer.model_config
    stats = trainer.train_step(0)
    L, rows = spec.data.seq_len, spec.training.micro_batch_size
    clean_pairs = rows * L * (L + 1) // 2
    want = config.step_flops(
        stream_tokens=rows * L, scored_tokens=rows * (L - 1), pairs=clean_pairs
    )
    assert stats["flops"] == pytest.approx(want)


@pytest.mark.parametrize(
    "checkpointing, compile",
    [("false", "false"), ("true", "false"), ("keep_attention", "false"), ("true", "true")],
)
def test_a_trimmed_trainer_step_equals_the_whole_stream_s(tmp_path, checkpointing, compile):
    """Through the trainer's wrapping (activation checkpointing, selective or not, and compiled
    layers, which pass the last layer's `queries` on), a block-diffusion step's loss and
    gradient norm are the whole stream's."""
    from turbo_dllm.train.distributed import init_distributed
    from turbo_dllm.train.trainer import Trainer

    torch._dynamo.reset()
    spec = tiny_spec(
        "training.steps=2",
        f"training.activation_checkpointing={checkpointing}",
        f"training.compile={compile}",
    )
    stats = []
    for name, trims in (("trimmed", TRIMS), ("whole", frozenset())):
        trainer = Trainer(spec, tmp_path / name, init_distributed()).build()
        assert trainer.plan.trims == TRIMS
        trainer.plan.trims = trims
        stats.append(trainer.train_step(0))
    assert stats[0]["loss"] == pytest.approx(stats[1]["loss"], rel=1e-5)
    assert stats[0]["grad_norm"] == pytest.approx(stats[1]["grad_norm"], rel=1e-4)
    assert stats[0]["flops"] < stats[1]["flops"]
