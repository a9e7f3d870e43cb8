"""`dllm doctor` on a RunSpec with `model.linear_attention: fla` (qwen3_8's Gated DeltaNet
layers through flash-linear-attention): it passed on a host without the package or a GPU, and
only the trainer refused, later. It now checks what the trainer's model build checks (a CUDA
GPU, the package, a Triton fla trains with); on a SLURM login node, the package alone."""

from __future__ import annotations

import importlib.util
import json
from types import SimpleNamespace

import pytest
import torch

from tests.train.test_qwen3_8_training import HYBRID
from tests.train.util import write_config
from turbo_dllm.doctor import DoctorContext
from turbo_dllm.doctor.checks import train as train_checks
from turbo_dllm.errors import DllmError
from turbo_dllm.families.qwen3_8 import gated_delta

FLA = ("model.linear_attention=fla", "objective.block_size=64", "data.seq_len=64")


def _check(spec, job_plan=None):
    extras = {} if job_plan is None else {"job_plan": job_plan}
    return train_checks.linear_attention(DoctorContext(spec=spec, extras=extras))


def _fla_spec():
    return SimpleNamespace(model=SimpleNamespace(linear_attention="fla"))


def _without_fla(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "fla" else real(name, *a)
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU host's refusal")
def test_doctor_fails_fla_on_a_host_without_cuda_with_the_trainer_s_fix(cli, tmp_path):
    config = write_config(tmp_path / "train.yaml", *FLA, base=HYBRID)
    result = cli("doctor", "--config", config, "--json")
    checks = {c["name"]: c for c in json.loads(result.out)["checks"]}
    check = checks["linear attention"]
    assert result.code == 1
    assert check["status"] == "fail"
    assert "'fla' runs on CUDA GPUs only" in check["detail"]
    assert check["fix"] == "set model.linear_attention: torch for CPU runs"
    torch_spec = write_config(tmp_path / "torch.yaml", base=HYBRID)
    checks = {
        c["name"]: c
        for c in json.loads(cli("doctor", "--config", torch_spec, "--json").out)["checks"]
    }
    assert checks["linear attention"]["status"] == "pass"


def test_a_gpu_host_without_the_package_is_told_to_install_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    _without_fla(monkeypatch)
    result = _check(_fla_spec())
    assert result.status == "fail"
    assert "needs the flash-linear-attention package" in result.detail
    assert "pip install 'turbo-dllm[gdn]'" in result.fix
    # the trainer's model build refuses the same, before any run dir is written
    with pytest.raises(DllmError, match="needs the flash-linear-attention package"):
        gated_delta.check_fla_usable()


def test_a_slurm_login_node_checks_the_package_not_its_own_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a login node
    job = SimpleNamespace(backend="slurm", device="cuda")
    _without_fla(monkeypatch)
    missing = _check(_fla_spec(), job)
    assert missing.status == "fail" and "flash-linear-attention package" in missing.detail
    monkeypatch.undo()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())  # installed
    present = _check(_fla_spec(), job)
    assert present.status == "pass", present.detail
    assert "on the SLURM job's GPUs" in present.detail


def test_a_login_node_with_overridden_gpus_checks_the_package_not_its_own_gpus(monkeypatch):
    """DLLM_OVERRIDE_GPUS describes the compute nodes (docs/bundles.md): fla failed for "CUDA
    GPUs only" in this process, while the other checks judged the host described. The package
    is checked, the GPUs are the described ones; described without GPUs, it fails."""
    from turbo_dllm.doctor.host import host_fingerprint

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a login node
    monkeypatch.setenv("DLLM_OVERRIDE_GPUS", "sm90,sm90")
    context = DoctorContext(spec=_fla_spec())
    host_fingerprint(context)  # read before find_spec is faked below
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())  # installed
    present = train_checks.linear_attention(context)
    assert present.status == "pass", present.detail
    assert "on the 2 GPU(s) DLLM_OVERRIDE_GPUS describes" in present.detail
    monkeypatch.setenv("DLLM_OVERRIDE_GPUS", "none")
    context = DoctorContext(spec=_fla_spec())
    none = train_checks.linear_attention(context)
    assert none.status == "fail" and "describes a host without one" in none.detail
