"""CSBP on GPUs with `kernels: reference` runs the slow merge: `dllm launch` says so (through its
readiness checks) whatever the attention backend, and the trainer says so at startup."""

from __future__ import annotations

import pytest

from turbo_dllm.jobs import launcher
from turbo_dllm.jobs.options import LaunchOptions
from turbo_dllm.train.parallel.merge_advice import slow_merge_warning

CSBP = ["topology.cp=2", "topology.bp=2"]


def merge_check(spec_file, *overrides: str):
    job = launcher.prepare_launch(spec_file, [*CSBP, *overrides], LaunchOptions(), ["dllm"])
    (found,) = [r for r in launcher.readiness(job).results if r.name == "attention merge"]
    return job.plan.device, found


def test_a_gpu_launch_with_the_reference_merge_warns(spec_file, gpus):
    gpus(2)
    device, found = merge_check(spec_file)  # model.attention: reference, kernels: reference
    assert device == "cuda" and found.status == "warn" and "~8x slower" in found.detail
    assert "kernels: native" in found.fix


def test_a_cpu_launch_or_native_kernels_do_not_warn(spec_file, gpus):
    gpus(0)
    assert merge_check(spec_file)[1].status == "pass"  # CPU: the reference is the only merge
    gpus(2)
    assert merge_check(spec_file, "kernels=jit")[1].status == "pass"


@pytest.mark.parametrize(
    "bp,kernels,device,warns",
    [(2, "reference", "cuda", True), (1, "reference", "cuda", False),
     (2, "native", "cuda", False), (2, "reference", "cpu", False)],
)  # fmt: skip
def test_the_rule(bp, kernels, device, warns):
    assert (slow_merge_warning(bp, kernels, device) is not None) == warns
