"""`dllm train` under torchrun with CSBP / the CP baseline reproduces the one-process run.

Same global batch, same keyed noise: every step's loss and gradient norm must equal the
single-process trace (the exact per-parameter gradient check is tests/distributed/
test_csbp_model.py). A CSBP checkpoint resumes in one process and continues
the same trace (DCP reshards it).
"""

from __future__ import annotations

import pytest
import torch

from tests.train.util import metrics, tiny_spec, torchrun, write_config
from turbo_dllm.train.entry import train

ARGS = ("training.steps=4", "checkpoint.interval=2", "checkpoint.keep_last=2")
TOL = {"rtol": 5e-5, "atol": 5e-5}


def assert_same_trace(run, reference, start: int = 0) -> None:
    """Losses and gradient norms (Adam hides a mis-scaled gradient from the losses alone)."""
    for key in ("loss", "grad_norm"):
        got = [r[key] for r in metrics(run)]
        want = [r[key] for r in metrics(reference)][start:]
        torch.testing.assert_close(got, want, **TOL, msg=lambda m, k=key: f"{k}: {m}")


def train_under_torchrun(nproc: int, config, run_dir, *overrides: str) -> None:
    sets = [arg for override in overrides for arg in ("--set", override)]
    run = ["train", "--config", str(config), "--run-dir", str(run_dir), *sets]
    torchrun(nproc, *run, cwd=run_dir.parent)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """One-process traces per objective."""
    runs = {}
    for objective in ("block_diffusion", "fast_dllm_v2", "autoregressive"):
        run = tmp_path_factory.mktemp(f"single-{objective}")
        train(tiny_spec(*ARGS, f"objective.name={objective}"), run)
        runs[objective] = run
    return runs


@pytest.mark.slow
def test_csbp_run_matches_one_process_and_resumes_there(tmp_path, single):
    config = write_config(tmp_path / "train.yaml", *ARGS)
    csbp = tmp_path / "csbp"
    train_under_torchrun(2, config, csbp, "topology.bp=2", "topology.cp=2")
    assert_same_trace(csbp, single["block_diffusion"])
    resumed = tmp_path / "resumed"
    train(tiny_spec(*ARGS, f"checkpoint.resume={csbp / 'checkpoints/step_00000002'}"), resumed)
    assert [r["step"] for r in metrics(resumed)] == [3, 4]
    assert_same_trace(resumed, single["block_diffusion"], start=2)


@pytest.mark.slow
@pytest.mark.parametrize(
    "nproc,topology",
    [
        (2, ("topology.cp=2",)),  # the CP baseline
        (4, ("topology.bp=4", "topology.cp=2")),  # fused: two clean groups of two ranks
        # activation checkpointing re-runs the clean all-gathers inside the backward pass, and
        # chunked MLPs checkpoint again inside it
        (
            2,
            (
                "topology.bp=2",
                "topology.cp=2",
                "training.activation_checkpointing=true",
                "training.mlp_chunks=3",
            ),
        ),
    ],
    ids=["cp2", "bp4-cp2", "csbp2-activation-checkpointing-mlp-chunks"],
)
def test_fast_dllm_v2_under_context_parallelism_matches_one_process(
    tmp_path, single, nproc, topology
):
    config = write_config(tmp_path / "train.yaml", *ARGS, "objective.name=fast_dllm_v2")
    run = tmp_path / "run"
    train_under_torchrun(nproc, config, run, *topology)
    assert_same_trace(run, single["fast_dllm_v2"])


@pytest.mark.slow
def test_autoregressive_under_block_parallelism_runs_the_clean_stream_and_matches_one_process(
    tmp_path, single
):
    """The autoregressive objective scores clean tokens only, so under BP the ranks shard the
    clean stream alone (`ContextParallel.clean_half`): the same trace as one process."""
    config = write_config(tmp_path / "train.yaml", *ARGS, "objective.name=autoregressive")
    run = tmp_path / "run"
    train_under_torchrun(2, config, run, "topology.bp=2")
    assert_same_trace(run, single["autoregressive"])
