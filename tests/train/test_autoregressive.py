"""`objective: autoregressive`: next-token CE, token-causal, equal to transformers' causal LM
loss on the same weights, and the same trace under context / block parallelism."""

from __future__ import annotations

import pytest
import torch

from tests.distributed.test_csbp_training import assert_same_trace, train_under_torchrun
from tests.train.util import tiny_spec, write_config
from turbo_dllm.families.decoder.runtime import build_model
from turbo_dllm.registry import get_family
from turbo_dllm.train.attention import ReferenceAttention
from turbo_dllm.train.entry import train
from turbo_dllm.train.objectives import NoiseKey, build_objective, score
from turbo_dllm.train.weights import materialize

transformers = pytest.importorskip("transformers")

KEY = NoiseKey(seed=0, step=0, first_sample=0, samples_per_step=2)


def _hf_and_ours(tmp_path):
    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=97,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
    )
    hf = transformers.Qwen3ForCausalLM(config).eval()
    hf.save_pretrained(tmp_path)
    ours_config = get_family("qwen3").resolve_config(path=str(tmp_path), from_config=None)
    ours = build_model(ours_config, ReferenceAttention())
    materialize(ours, torch.device("cpu"), seed=0, weights_from=str(tmp_path))
    return hf, ours


def _loss(objective, model, batch):
    diffusion = objective.corrupt(batch, KEY)
    mask = ReferenceAttention().prepare(diffusion.layout, diffusion.doc_ids, "cpu")
    total = model(
        diffusion.input_ids,
        diffusion.layout.positions(),
        mask,
        output=lambda h, w: score(diffusion, h, w),
    )
    return total / objective.supervised_count(batch, key=KEY)


def test_loss_and_gradients_equal_transformers_causal_lm(tmp_path):
    hf, ours = _hf_and_ours(tmp_path)
    spec = tiny_spec("objective.name=autoregressive")
    objective = build_objective(spec.objective, mask_token_id=96)
    ids = torch.randint(0, 97, (2, 32), generator=torch.Generator().manual_seed(1))
    batch = {"input_ids": ids, "loss_mask": torch.ones_like(ids, dtype=torch.bool)}
    loss = _loss(objective, ours, batch)
    want = hf(input_ids=ids, labels=ids).loss
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-5)
    loss.backward()
    want.backward()
    for name, param in ours.named_parameters():
        hf_param = hf.get_parameter(name)
        torch.testing.assert_close(param.grad, hf_param.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_packed_documents_never_see_each_other(tmp_path):
    """Two packed documents score exactly as each one alone (their first tokens unscored)."""
    _, ours = _hf_and_ours(tmp_path)
    objective = build_objective(tiny_spec("objective.name=autoregressive").objective, 96)
    ids = torch.randint(0, 97, (1, 32), generator=torch.Generator().manual_seed(2))
    doc_ids = torch.tensor([[0] * 12 + [1] * 20])
    packed = {"input_ids": ids, "loss_mask": torch.ones_like(ids), "doc_ids": doc_ids}
    assert objective.supervised_count(packed) == 11 + 19
    with torch.no_grad():
        got = _loss(objective, ours, packed) * 30
        first = _loss(objective, ours, {"input_ids": ids[:, :12], "loss_mask": ids[:, :12] >= 0})
        second = _loss(objective, ours, {"input_ids": ids[:, 12:], "loss_mask": ids[:, 12:] >= 0})
    torch.testing.assert_close(got, first * 11 + second * 19, rtol=1e-5, atol=1e-5)


def test_validation_uses_the_token_causal_stream():
    """The autoregressive stream has blocks of one token: seq_len need not divide the
    objective's block size, and cp/bp only need whole tokens."""
    spec = tiny_spec("objective.name=autoregressive", "objective.block_size=16", "data.seq_len=40")
    assert spec.data.seq_len == 40


@pytest.mark.parametrize("bp,cp", [(2, 1), (4, 1), (4, 2), (2, 2)])
def test_block_parallelism_that_replicates_the_clean_stream_is_accepted(bp, cp):
    """With bp > cp the clean stream sits on several ranks (BP only: every rank's clean prefix;
    fused: bp/cp copies); each clean token is scored by one of them (its scorer), so the
    objective trains there like one process (tests/distributed/test_csbp_autoregressive.py).
    Refused before: its tokens were scored more than once."""
    spec = tiny_spec("objective.name=autoregressive", f"topology.bp={bp}", f"topology.cp={cp}")
    assert (spec.topology.bp, spec.topology.cp) == (bp, cp)


ARGS = ("training.steps=4", "checkpoint.interval=2", "objective.name=autoregressive")


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """The one-process trace the parallel runs must reproduce (trained before any test's own
    home is set: this one gets a home of its own, and the cache variables training sets in
    os.environ are put back)."""
    run = tmp_path_factory.mktemp("single")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DLLM_HOME", str(tmp_path_factory.mktemp("single-home")))
        for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
            mp.delenv(name, raising=False)
        train(tiny_spec(*ARGS), run)
    return run


# BP alone (topology.bp=2, cp 1) is this same run in tests/distributed/test_csbp_training.py::
# test_autoregressive_under_block_parallelism_runs_the_clean_stream_and_matches_one_process.
@pytest.mark.slow
@pytest.mark.parametrize(
    "topology",
    [
        ("topology.bp=2", "topology.cp=2"),
        ("topology.tp=2", "topology.sp=true"),
    ],
    ids=["csbp2", "tp2-sp"],
)
def test_autoregressive_under_parallelism_matches_one_process(tmp_path, single, topology):
    config = write_config(tmp_path / "train.yaml", *ARGS)
    run = tmp_path / "run"
    train_under_torchrun(2, config, run, *topology)
    assert_same_trace(run, single)
