"""CSBP and the CP baseline with FlexAttention on CUDA (skipped without a GPU).

One GPU: the flex partial attentions (compiled, block-sparse, differentiated through their
log-sum-exp) against the dense reference, forward and backward, for every rank of a bp = 2
layout (cp = 1 needs no process group). Two GPUs: the gloo equivalence cases again over NCCL
with the flex backend.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.distributed.harness import run_gloo
from tests.distributed.test_csbp_attention import _run_case
from turbo_dllm.train.parallel.csbp import CsbpAttention
from turbo_dllm.train.parallel.layout import CsbpLayout

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-3), (torch.bfloat16, 3e-2)])
def test_flex_csbp_rank_equals_dense_reference(dtype, tol):
    device = torch.device("cuda")
    seq_len, block = 512, 32
    docs = torch.zeros(2, seq_len, dtype=torch.long, device=device)
    docs[1, 200:] = 1
    gen = torch.Generator(device="cuda").manual_seed(0)
    for rank in range(2):
        layout = CsbpLayout.build(seq_len, block, 2, 1, rank)
        width = layout.num_noisy + layout.num_clean
        base = [
            torch.randn(2, h, width, 64, device=device, generator=gen, dtype=dtype)
            for h in (8, 4, 4)
        ]
        upstream = torch.randn(2, 8, width, 64, device=device, generator=gen, dtype=dtype)
        results = {}
        for backend in ("flex", "reference"):
            q, k, v = (t.clone().requires_grad_() for t in base)
            attention = CsbpAttention(layout, docs, None, backend=backend)
            out = attention(q, k, v)
            (out.float() * upstream.float()).sum().backward()
            results[backend] = [out.float(), q.grad.float(), k.grad.float(), v.grad.float()]
        for got, want in zip(results["flex"], results["reference"], strict=True):
            scale = float(want.abs().max())
            assert float((got - want).abs().max()) <= tol * scale, (rank, dtype)


CASES = [
    ("csbp", 2, 2, 256, 16),
    ("csbp", 1, 2, 256, 16),
    ("cp", 2, 1, 256, 16),
]


def _worker(rank: int, world: int, results: str) -> None:
    errors = {
        f"{mode}-cp{cp}-bp{bp}": _run_case(
            world, mode, cp, bp, seq_len, block, device=f"cuda:{rank}", backend="flex"
        )
        for mode, cp, bp, seq_len, block in CASES
    }
    if rank == 0:
        Path(results).write_text(json.dumps(errors))


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs"
)
def test_two_gpus_nccl_flex_equal_single_rank(tmp_path):
    results = tmp_path / "errors.json"
    run_gloo(_worker, 2, tmp_path, str(results), backend="nccl")
    errors = json.loads(results.read_text())
    assert all(error < 2e-3 for error in errors.values()), errors
