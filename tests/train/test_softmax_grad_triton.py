"""The Triton cross-entropy kernel, run on the CPU by Triton's interpreter (TRITON_INTERPRET=1).

The GPU suite runs the same comparison compiled on an H200 (tests/gpu/test_losses_gpu.py); this
one keeps the kernel's logic (block loop, masking, the excluded entry, in-place gradient) under
test on every CI run. The interpreter must be switched on before triton is first imported, so the
cases run in a child process.
"""

from __future__ import annotations

import json

from tests.helpers import run_in_triton_interpreter

CHILD = r"""
import json, torch
from turbo_dllm.train._softmax_grad_triton import softmax_cross_entropy_triton_
from turbo_dllm.train.softmax_grad import softmax_cross_entropy_reference_

torch.manual_seed(0)
results = []
for dtype in (torch.float32, torch.bfloat16):
    for vocab in (1000, 4096, 9000):  # below, at and over the kernel's 4096-column block
        for exclude in (None, 7):
            n = 6
            z = (torch.randn(n, vocab) * 4).to(dtype)
            targets = torch.randint(0, vocab, (n,))
            targets[targets == 7] = 0
            targets[0] = vocab - 1  # the last column, inside the masked tail block
            weights = torch.rand(n) + 0.5
            ours, ref = z.clone(), z.clone()
            loss = softmax_cross_entropy_triton_(ours, targets, weights, exclude, True)
            expected = softmax_cross_entropy_reference_(ref, targets, weights, exclude, True)
            untouched = z.clone()
            no_grad = softmax_cross_entropy_triton_(untouched, targets, weights, exclude, False)
            grad_error = ((ours.float() - ref.float()).abs() / (ref.float().abs() + 1e-3)).max()
            results.append({
                "case": f"{dtype} V={vocab} exclude={exclude}",
                "loss_dtype": str(loss.dtype),
                "loss_error": float(((loss - expected.float()).abs() / expected.abs()).max()),
                "grad_error": float(grad_error),
                "excluded_grad": 0.0 if exclude is None else float(ours[:, exclude].abs().max()),
                "no_grad_loss_error": float((no_grad - loss).abs().max()),
                "no_grad_left_logits": bool(torch.equal(untouched, z)),
                "bf16": dtype == torch.bfloat16,
            })
print(json.dumps(results))
"""


def test_kernel_matches_the_torch_reference_under_the_interpreter():
    stdout = run_in_triton_interpreter(CHILD, timeout=300)
    results = json.loads(stdout.strip().splitlines()[-1])
    assert len(results) == 12
    for r in results:
        assert r["loss_dtype"] == "torch.float32", r
        assert r["loss_error"] < 1e-5, r
        # float32: rounding only; bf16: the two may round to neighbouring bf16 values (one ulp,
        # at most 2^-7 relative)
        assert r["grad_error"] < (2**-7 + 1e-3 if r["bf16"] else 1e-4), r
        assert r["excluded_grad"] == 0.0, r
        assert r["no_grad_loss_error"] == 0.0 and r["no_grad_left_logits"], r
