"""`dllm train` with tensor parallelism (torchrun, gloo) against one process, checkpoints across tp.

* tp = 2 (2 processes) trains the same losses and gradient norms as one process on the same
  global batch; its checkpoint resumes at tp = 1 and continues the single-process trace, and
  `dllm export` of it writes the same Hugging Face weights as the single-process run.
* tp = 2 x fsdp = 2 (4 processes) resumes the single-process checkpoint (tp = 1 -> tp = 2) and
  continues the same trace (the token counts and loss sums must count each tp group once).
"""

from __future__ import annotations

import pytest
import torch

from tests.train.util import TINY, losses, metrics, tiny_spec, torchrun, write_config
from turbo_dllm.train.entry import train
from turbo_dllm.train.export import export_checkpoint

ARGS = ("training.steps=4", "checkpoint.interval=2", "checkpoint.keep_last=2")
TOL = {"rtol": 5e-5, "atol": 5e-5}


def _grad_norms(run_dir):
    return [record["grad_norm"] for record in metrics(run_dir)]


def _flops(run_dir, world: int) -> list[float]:
    """Model FLOPs of each step, back from the logged MFU (DLLM_PEAK_TFLOPS=1 per GPU)."""
    return [r["mfu"] * r["step_time_s"] * 1e12 * world for r in metrics(run_dir)]


@pytest.mark.slow
def test_tp2_matches_one_process_resumes_at_tp1_and_exports(tmp_path, monkeypatch):
    monkeypatch.setenv("DLLM_PEAK_TFLOPS", "1")  # an MFU on CPU, to read the FLOPs back
    single, tp2 = tmp_path / "single", tmp_path / "tp2"
    train(tiny_spec(*ARGS), single)
    config = write_config(tmp_path / "train.yaml", *ARGS)
    run = ("train", "--config", str(config), "--run-dir")
    torchrun(2, *run, str(tp2), "--set", "topology.tp=2", cwd=tmp_path)
    torch.testing.assert_close(losses(tp2), losses(single), **TOL)
    torch.testing.assert_close(_grad_norms(tp2), _grad_norms(single), **TOL)
    # Each tp group counted once: the same model FLOPs as one process, spread over 2 GPUs.
    torch.testing.assert_close(_flops(tp2, 2), _flops(single, 1), rtol=1e-6, atol=0)
    assert '"world_size": 2' in (tp2 / "checkpoints/step_00000002/checkpoint.json").read_text()

    # tp = 2 checkpoint -> one process: the next steps continue the single-process trace.
    resumed = tmp_path / "resumed"
    train(tiny_spec(*ARGS, f"checkpoint.resume={tp2 / 'checkpoints/step_00000002'}"), resumed)
    assert [r["step"] for r in metrics(resumed)] == [3, 4]
    torch.testing.assert_close(losses(resumed), losses(single)[2:], **TOL)

    # Export of the tp-trained checkpoint: whole HF tensors equal to the single-process ones.
    from safetensors.torch import load_file

    export_checkpoint(single / "checkpoints", tmp_path / "hf-single")
    want = load_file(str(tmp_path / "hf-single/model.safetensors"))

    def assert_exports_match(run_dir, name):
        export_checkpoint(run_dir / "checkpoints", tmp_path / name)
        got = load_file(str(tmp_path / name / "model.safetensors"))
        assert sorted(got) == sorted(want)
        for key, tensor in want.items():
            assert got[key].shape == tensor.shape, key
            torch.testing.assert_close(got[key], tensor, rtol=1e-4, atol=1e-5, msg=key)

    assert_exports_match(tp2, "hf-tp2")

    # tp = 1 checkpoint -> tp = 2 x fsdp = 2 on 4 processes (with activation checkpointing)
    # continues the same trace.
    both = tmp_path / "tp2-fsdp2"
    torchrun(
        4,
        *run,
        str(both),
        "--set",
        "training.activation_checkpointing=true",
        "--set",
        "topology.tp=2",
        "--set",
        "topology.fsdp=2",
        "--set",
        "training.micro_batch_size=2",
        "--set",
        f"checkpoint.resume={single / 'checkpoints/step_00000002'}",
        cwd=tmp_path,
    )
    assert [r["step"] for r in metrics(both)] == [3, 4]
    torch.testing.assert_close(losses(both), losses(single)[2:], **TOL)
    torch.testing.assert_close(_grad_norms(both), _grad_norms(single)[2:], **TOL)
    torch.testing.assert_close(_flops(both, 4), _flops(single, 1)[2:], rtol=1e-6, atol=0)
    assert_exports_match(both, "hf-tp2-fsdp2")  # saved as 2-D (fsdp x tp) DTensors


def test_heads_not_divisible_by_tp_fail_validation_and_the_trainer(cli, tmp_path):
    """`dllm config validate` names the numbers; the trainer checks again when it builds."""
    from tests.helpers import assert_user_error
    from turbo_dllm.config.load import apply_overrides
    from turbo_dllm.config.runspec import RunSpec
    from turbo_dllm.errors import DllmError
    from turbo_dllm.train.distributed import DistEnv
    from turbo_dllm.train.trainer import Trainer

    overrides = (
        "model.config_overrides.num_attention_heads=3",
        "model.config_overrides.num_key_value_heads=1",
        "topology.tp=2",
    )
    config = write_config(tmp_path / "train.yaml", *ARGS, *overrides)
    assert_user_error(
        cli("config", "validate", "--config", config),
        "topology.tp: num_attention_heads = 3 is not divisible by topology.tp = 2",
        "topology.tp: num_key_value_heads = 1 is not divisible by topology.tp = 2",
    )
    assert cli("config", "validate", "--config", config, "--set", "topology.tp=1").code == 0

    spec = RunSpec.model_validate(apply_overrides(TINY, [*ARGS, *overrides]))  # unchecked
    env = DistEnv(rank=0, world_size=2, local_rank=0, device=torch.device("cpu"))
    with pytest.raises(DllmError) as info:
        Trainer(spec, tmp_path, env).build_model()
    assert "num_attention_heads = 3 is not divisible by topology.tp = 2" in info.value.message
    assert "num_key_value_heads = 1" in info.value.message


def test_launch_dry_run_and_doctor_accept_tp(cli, tmp_path, monkeypatch):
    """The launch compiler puts tp innermost in the world size; doctor's launch checks pass."""
    import json

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DLLM_OVERRIDE_GPUS", "sm90,sm90,sm90,sm90")
    config = write_config(tmp_path / "train.yaml", *ARGS, "topology.tp=2", "topology.fsdp=2")
    result = cli("launch", "--config", config, "--dry-run", "--json")
    assert result.code == 0, result.err
    plan = json.loads(result.out)["plan"]
    assert plan["world_sizes"] == [4]
    assert {a["name"]: a["degree"] for a in plan["mesh"]} == {
        "dp_replicate": 1,
        "dp_shard": 2,
        "clean_replica": 1,
        "cp": 1,
        "tp": 2,
    }
    assert [(r["coords"]["dp_shard"], r["coords"]["tp"]) for r in plan["ranks"]] == [
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
    ]
    result = cli("doctor", "--config", config, "--world-size", "4", "--json")
    checks = {c["name"]: c for c in json.loads(result.out)["checks"]}
    assert checks["config"]["status"] == "pass", checks["config"]
    assert checks["world size"]["status"] == "pass", checks["world size"]
    assert "*2 = 4" in checks["world size"]["detail"]


@pytest.mark.slow
def test_tp2_sequence_parallel_matches_one_process_and_resumes_at_tp1(tmp_path):
    """Sequence parallelism (with activation checkpointing and MLP chunks) trains the
    single-process trace, and its checkpoint resumes without it."""
    args = (*ARGS, "training.activation_checkpointing=true", "training.mlp_chunks=2")
    single, sp = tmp_path / "single", tmp_path / "sp"
    train(tiny_spec(*args), single)
    config = write_config(tmp_path / "train.yaml", *args)
    run = ("train", "--config", str(config), "--run-dir", str(sp))
    torchrun(2, *run, "--set", "topology.tp=2", "--set", "topology.sp=true", cwd=tmp_path)
    torch.testing.assert_close(losses(sp), losses(single), **TOL)
    torch.testing.assert_close(_grad_norms(sp), _grad_norms(single), **TOL)
    resumed = tmp_path / "resumed"
    train(tiny_spec(*args, f"checkpoint.resume={sp / 'checkpoints/step_00000002'}"), resumed)
    torch.testing.assert_close(losses(resumed), losses(single)[2:], **TOL)
