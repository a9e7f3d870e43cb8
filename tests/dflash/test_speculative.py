"""`dllm dflash eval`: speculative decoding with a DFlash drafter, and with an autoregressive
drafter (the baseline), reproduces the target's greedy output token for token."""

from __future__ import annotations

import json

import pytest

from tests.dflash.helpers import target_document
from tests.helpers import assert_user_error
from turbo_dllm.config.load import apply_overrides
from turbo_dllm.config.runspec import RunSpec
from turbo_dllm.config.validate import check
from turbo_dllm.families.dflash.speculative import evaluate
from turbo_dllm.train.entry import train
from turbo_dllm.train.export import export_checkpoint


def test_dflash_drafter_is_lossless_with_tau_above_one(cli, world, drafter):
    result = cli(
        "dflash",
        "eval",
        "--target",
        world["target"],
        "--drafter",
        drafter["folder"],
        "--data",
        world["artifact"],
        "--max-new-tokens",
        "24",
        "--num-prompts",
        "3",
        "--json",
    )
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert report["lossless"] is True and report["drafter_kind"] == "dflash"
    assert report["tau"] > 1.0
    assert sum(int(k) * v for k, v in report["accepted_histogram"].items()) >= 3 * 24
    assert set(map(int, report["accepted_histogram"])) <= set(range(1, 5))


@pytest.fixture(scope="module")
def ar_drafter(world):
    """A one-layer causal LM trained with `objective: autoregressive` on the same text."""
    run = world["root"] / "ar-run"
    document = apply_overrides(
        target_document(world["artifact"], run, steps=20),
        ["model.config_overrides.num_hidden_layers=1"],
    )
    train(check(RunSpec.model_validate(document)), run)
    return export_checkpoint(run / "checkpoints", world["root"] / "ar-drafter")


def test_autoregressive_drafter_is_the_lossless_baseline(world, ar_drafter):
    report = evaluate(
        str(world["target"]),
        str(ar_drafter),
        str(world["artifact"]),
        block_size=4,
        max_new_tokens=16,
        num_prompts=2,
    )
    assert report.lossless and report.drafter_kind == "autoregressive"
    assert 1.0 <= report.tau <= 4.0


def test_an_autoregressive_drafter_needs_a_block_size(cli, world, ar_drafter):
    result = cli(
        "dflash",
        "eval",
        "--target",
        world["target"],
        "--drafter",
        ar_drafter,
        "--data",
        world["artifact"],
    )
    assert_user_error(result, "has no block size")


def test_a_drafter_of_another_target_is_refused_before_decoding(cli, world, drafter, tmp_path):
    other = dict(json.loads((world["target"] / "config.json").read_text()))
    other["hidden_size"] = 96
    (tmp_path / "config.json").write_text(json.dumps(other))
    result = cli(
        "dflash",
        "eval",
        "--target",
        tmp_path,
        "--drafter",
        drafter["folder"],
        "--data",
        world["artifact"],
    )
    assert_user_error(result, "does not fit the target", "hidden size")
