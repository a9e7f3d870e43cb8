"""benchmarks/train_step.py: --attention, --baselines and --context-search (CPU smoke)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.helpers import benchmark_module

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def train_step():
    return benchmark_module("train_step")


def test_both_attentions_and_both_baselines_in_one_run(train_step, tmp_path):
    out = tmp_path / "bench.json"
    argv = ["--tiny", "--seq-len", "32", "--block-size", "8", "--steps", "1", "--warmup", "0"]
    argv += ["--attention", "flex,turbo", "--baselines", "dense,hf-flex", "--out", str(out)]
    assert train_step.main(argv) == 0
    report = json.loads(out.read_text())
    names = [r["name"] for r in report["results"]]
    assert names == [
        "turbo-dllm (flex)",
        "turbo-dllm (turbo)",
        "hf-sdpa-dense-mask",
        "hf-flex-compiled",
    ]
    ours_flex, ours_turbo, dense, hf_flex = report["results"]
    # On the CPU both of ours run the reference (the spec with turbo validated first) ...
    assert ours_flex["attention"] == ours_turbo["attention"] == "reference"
    # ... and the flex baseline says why it cannot train here instead of timing something else.
    assert "no backward on CPU" in hf_flex["error"]
    assert dense["tokens_per_s"] > 0 and report["speedup"] == report["speedups"][dense["name"]]
    import transformers

    assert report["transformers"] == transformers.__version__  # the baseline's, 5.17 or 5.24


def test_pipelined_steps_time_ours_as_the_run_loop_takes_them(train_step, tmp_path, capsys):
    """--pipelined queues each timed step before reading the last one's numbers (as
    `Trainer.run`); the losses are the one-step-at-a-time ones, every timed step is counted."""
    argv = ["--tiny", "--seq-len", "32", "--block-size", "8", "--steps", "3", "--warmup", "1"]
    argv += ["--no-baseline"]
    reports = []
    for extra in ([], ["--pipelined"]):
        out = tmp_path / f"bench{len(extra)}.json"
        assert train_step.main(argv + extra + ["--out", str(out)]) == 0
        reports.append(json.loads(out.read_text())["results"][0])
        err = capsys.readouterr().err
        losses = [line.split("loss ")[1] for line in err.splitlines() if "ours step" in line]
        assert len(losses) == 4, err
        assert ("(pipelined)" in err) == bool(extra)
        reports[-1]["losses"] = losses
    waited, pipelined = reports
    assert pipelined["losses"] == waited["losses"]
    assert pipelined["step_time_s"] > 0 and pipelined["tokens_per_s"] > 0


def test_unknown_attention_or_baseline_is_refused(train_step):
    with pytest.raises(SystemExit):
        train_step.main(["--tiny", "--attention", "sdpa"])
    with pytest.raises(SystemExit):
        train_step.main(["--tiny", "--baselines", "dense,hf-eager"])


def test_hf_flex_baseline_mask_matches_the_dense_mask(train_step):
    """The BlockMask HF's flex_attention gets is the dense baseline's mask: same logits."""
    import transformers

    from turbo_dllm.train.attention import BlockDiffusionLayout

    layout = BlockDiffusionLayout(32, 8)
    config = transformers.Qwen3Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8,
    )  # fmt: skip
    ids = torch.randint(0, 64, (1, layout.stream_len), generator=torch.Generator().manual_seed(0))
    positions = layout.positions("cpu").expand(1, -1)
    logits = {}
    for kind, implementation in (("dense", "sdpa"), ("hf-flex", "flex_attention")):
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(
            config, attn_implementation=implementation
        )
        mask = train_step.hf_mask(kind, layout, 1, torch.device("cpu"))
        with torch.no_grad():
            logits[kind] = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    torch.testing.assert_close(logits["hf-flex"], logits["dense"], atol=1e-5, rtol=1e-5)
    # A causal mask instead of the block-diffusion one gives other logits (the check has teeth).
    causal = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    causal.load_state_dict(model.state_dict())
    with torch.no_grad():
        plain = causal(input_ids=ids, position_ids=positions).logits
    assert (plain - logits["dense"]).abs().max() > 1e-3


def test_context_search_reports_the_longest_that_trains(train_step, tmp_path):
    out = tmp_path / "search.json"
    argv = ["--tiny", "--block-size", "8", "--context-search", "16,32", "--out", str(out)]
    assert train_step.main(argv + ["--activation-checkpointing", "--search-budget-s", "600"]) == 0
    report = json.loads(out.read_text())
    assert report["kind"].startswith("one document per sequence")
    assert report["activation_checkpointing"] is True
    assert report["steps_per_probe"] == 2  # the second step holds the first one's AdamW moments
    flex = report["found"]["flex"]
    assert flex["longest"] == 32
    assert [p["outcome"] for p in flex["probes"]] == ["trains", "trains"]
    assert all(p["peak_memory_gb"] is None and p["step_time_s"] > 0 for p in flex["probes"])


def test_context_search_stops_at_the_budget(train_step, tmp_path):
    """A tiny budget: the first probe runs, the quadratic estimate refuses the next ones."""
    out = tmp_path / "search.json"
    argv = ["--tiny", "--block-size", "8", "--context-search", "16,4096,8192", "--out", str(out)]
    assert train_step.main(argv + ["--search-budget-s", "1"]) == 0
    probes = json.loads(out.read_text())["found"]["flex"]["probes"]
    assert [p["outcome"] for p in probes][1:] == ["not tried (budget)"]


def test_turbo_config_sets_the_op_default_for_this_process(train_step, monkeypatch):
    """--turbo-config FIELD=V,...: a kernel variant over the shipped default of every head dim,
    read by every `turbo` plan that forces none; bad fields and values stop with the reason."""
    from turbo_dllm.kernels.triton_ops import triton_module

    module = triton_module("block_diffusion_attention", "jit")
    shipped = dict(module.SM90_CONFIGS)
    monkeypatch.setattr(module, "SM90_CONFIGS", dict(shipped))
    said = train_step.apply_turbo_config("dkdv_gluon=1, dkdv_stages=3", "jit")
    assert said == "dkdv_gluon=1, dkdv_stages=3"
    for dim in (64, 128):
        config = module.default_config(dim)
        assert (config.dkdv_gluon, config.dkdv_stages) == (1, 3)
        assert config.fwd_m == shipped[dim].fwd_m  # the rest as shipped
    with pytest.raises(SystemExit, match="no_such_field"):
        train_step.apply_turbo_config("no_such_field=1", "jit")
    with pytest.raises(SystemExit, match="FIELD=INT"):
        train_step.apply_turbo_config("dkdv_gluon=yes", "jit")
