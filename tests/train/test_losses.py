"""The chunked LM-head cross-entropy: exact against the dense computation, bounded memory."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from turbo_dllm.train.losses import default_chunk_size, linear_cross_entropy


def dense_reference(hidden, weight, targets, token_weights, exclude):
    logits = hidden @ weight.t()
    if exclude is not None:
        logits = logits.index_fill(1, torch.tensor([exclude]), float("-inf"))
    return (F.cross_entropy(logits, targets, reduction="none") * token_weights).sum()


@pytest.mark.parametrize("chunk", [1, 7, 64, 1000])
@pytest.mark.parametrize("exclude", [None, 3])
def test_value_and_gradients_match_dense(chunk, exclude):
    torch.manual_seed(0)
    N, H, V = 50, 16, 40
    hidden = torch.randn(N, H, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(V, H, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, V, (N,))
    if exclude is not None:
        targets[targets == exclude] = 0
    token_weights = torch.rand(N, dtype=torch.float64) + 0.5
    got = linear_cross_entropy(
        hidden, weight, targets, token_weights, exclude_index=exclude, chunk_size=chunk
    )
    got.mul(2.5).backward()
    gh, gw = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    expected = dense_reference(hidden, weight, targets, token_weights, exclude)
    expected.mul(2.5).backward()
    torch.testing.assert_close(got.double(), expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(gh, hidden.grad)
    torch.testing.assert_close(gw, weight.grad)
    if exclude is not None:
        assert torch.all(gw[exclude] == 0)


def test_uniform_logits_give_log_vocab():
    """Zero head: every logit equal, so CE = ln(V), or ln(V - 1) with one entry excluded."""
    hidden, weight = torch.randn(8, 4), torch.zeros(10, 4)
    targets = torch.randint(0, 9, (8,))
    assert math.isclose(
        float(linear_cross_entropy(hidden, weight, targets)), 8 * math.log(10), rel_tol=1e-6
    )
    excluded = linear_cross_entropy(hidden, weight, targets, exclude_index=9)
    assert math.isclose(float(excluded), 8 * math.log(9), rel_tol=1e-6)


def test_works_without_grad():
    hidden, weight = torch.randn(5, 4), torch.randn(6, 4)
    with torch.no_grad():
        value = linear_cross_entropy(hidden, weight, torch.zeros(5, dtype=torch.long))
    assert value.item() > 0


class LargestTensor(TorchDispatchMode):
    """Records the largest tensor any op produces (forward and backward)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def _largest(fn) -> int:
    mode = LargestTensor()
    with mode:
        fn()
    return mode.largest


def test_chunking_bounds_the_largest_tensor():
    """The full (N, V) logits never exist; the peak tensor is one chunk of logits."""
    torch.manual_seed(0)
    N, H, V, chunk = 4096, 32, 2000, 256
    hidden = torch.randn(N, H, requires_grad=True)
    weight = torch.randn(V, H, requires_grad=True)
    targets = torch.randint(0, V, (N,))

    def chunked():
        linear_cross_entropy(hidden, weight, targets, chunk_size=chunk).backward()

    def dense():
        F.cross_entropy(hidden @ weight.t(), targets, reduction="sum").backward()

    assert _largest(dense) >= N * V  # the naive path materialises the logits...
    peak = _largest(chunked)
    assert peak <= chunk * V  # ...the chunked one never holds more than a chunk of them
    assert peak < N * V / 10


def test_default_chunk_size_bounds_chunk_bytes():
    chunk = default_chunk_size(151936)
    assert chunk * 151936 * 4 <= (1 << 30) and chunk >= 64 and chunk % 64 == 0
    assert default_chunk_size(512) == 16384


def test_chunks_split_evenly_under_the_limit():
    from turbo_dllm.train.losses import _even_chunks

    assert _even_chunks(4096, 3520) == 2048  # two equal GEMMs, not 3520 + 576
    assert _even_chunks(100, 3520) == 128  # one chunk, rounded to a multiple of 64
    assert _even_chunks(10_000, 64) == 64
    assert _even_chunks(0, 3520) == 3520
    for n, limit in [(1, 64), (4097, 2048), (50_000, 3520)]:
        size = _even_chunks(n, limit)
        assert size <= limit and size % 64 == 0 and math.ceil(n / size) == math.ceil(n / limit)


@pytest.mark.parametrize("exclude", [None, 5])
def test_softmax_gradient_written_over_the_logits(exclude):
    """The in-place per-row op: losses and gradient equal autograd through F.cross_entropy,
    for float32 (in place) and bf16 logits (a float32 copy written back)."""
    from turbo_dllm.train.softmax_grad import softmax_cross_entropy_

    torch.manual_seed(0)
    n, V = 9, 37
    z = torch.randn(n, V, dtype=torch.float64) * 3
    targets = torch.randint(0, V, (n,))
    if exclude is not None:
        targets[targets == exclude] = 0
    weights = torch.rand(n) + 0.5
    ref = z.clone().requires_grad_(True)
    masked = ref if exclude is None else ref.index_fill(1, torch.tensor([exclude]), -math.inf)
    per_row = F.cross_entropy(masked, targets, reduction="none") * weights.double()
    per_row.sum().backward()
    for dtype, tol in [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)]:
        logits = z.to(dtype)
        losses = softmax_cross_entropy_(logits, targets, weights, exclude, write_grad=True)
        assert losses.dtype == torch.float32
        torch.testing.assert_close(losses.double(), per_row.detach(), rtol=tol, atol=tol)
        torch.testing.assert_close(logits.double(), ref.grad, rtol=tol, atol=tol)
    without_grad = softmax_cross_entropy_(z.float(), targets, weights, exclude, write_grad=False)
    torch.testing.assert_close(without_grad.double(), per_row.detach(), rtol=1e-5, atol=1e-5)


def test_bf16_matmuls_match_float64_within_bf16_error():
    torch.manual_seed(0)
    N, H, V = 300, 32, 500
    hidden = torch.randn(N, H, dtype=torch.float64) / 4
    weight = torch.randn(V, H, dtype=torch.float64) / 4
    targets = torch.randint(0, V, (N,))
    h16 = hidden.bfloat16().requires_grad_(True)
    w32 = weight.float().requires_grad_(True)
    got = linear_cross_entropy(h16, w32, targets, compute_dtype=torch.bfloat16, chunk_size=128)
    got.backward()
    assert got.dtype == torch.float32 and h16.grad.dtype == torch.bfloat16
    assert w32.grad.dtype == torch.float32
    h, w = hidden.requires_grad_(True), weight.requires_grad_(True)
    expected = dense_reference(h, w, targets, torch.ones(N, dtype=torch.float64), None)
    expected.backward()
    torch.testing.assert_close(got.double(), expected.detach(), rtol=1e-2, atol=0)
    torch.testing.assert_close(h16.grad.double(), h.grad, rtol=0.05, atol=5e-3)
    torch.testing.assert_close(w32.grad.double(), w.grad, rtol=0.05, atol=5e-3)


def test_no_scored_tokens_give_zero_loss_and_zero_gradients():
    """A micro-batch can draw no masked token: the loss is 0, not an error."""
    hidden = torch.randn(0, 8, requires_grad=True)
    weight = torch.randn(20, 8, requires_grad=True)
    loss = linear_cross_entropy(hidden, weight, torch.zeros(0, dtype=torch.long))
    loss.backward()
    assert loss.item() == 0.0 and hidden.grad.shape == (0, 8)
    assert torch.equal(weight.grad, torch.zeros_like(weight))


def test_softcapped_logits_match_autograd():
    """Gemma's final soft-capping (c * tanh(z / c)) inside the chunked CE, forward and backward."""
    torch.manual_seed(0)
    hidden = torch.randn(37, 16, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(50, 16, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 50, (37,))
    w = torch.rand(37, dtype=torch.float64)
    got = linear_cross_entropy(hidden, weight, targets, w, chunk_size=8, softcap=3.0)
    got.backward()
    gh, gw = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    logits = 3.0 * torch.tanh(hidden @ weight.t() / 3.0)
    want = (torch.nn.functional.cross_entropy(logits, targets, reduction="none") * w).sum()
    want.backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(gh, hidden.grad)
    torch.testing.assert_close(gw, weight.grad)


def test_uninitialised_buffers_are_never_read(monkeypatch):
    """The weight gradient's buffer starts empty (the first chunk's product overwrites it) and
    the backward's scaled copy is written whole: NaN-filled allocations must change nothing."""
    torch.manual_seed(3)
    hidden = torch.randn(40, 16, requires_grad=True)
    weight = torch.randn(24, 16, requires_grad=True)
    targets = torch.randint(0, 24, (40,))
    (0.5 * linear_cross_entropy(hidden, weight, targets, chunk_size=16)).backward()
    expected = weight.grad.clone()
    weight.grad = None
    real_empty = torch.empty

    def nan_empty(*args, **kwargs):
        return real_empty(*args, **kwargs).fill_(float("nan"))

    monkeypatch.setattr(torch, "empty", nan_empty)
    (0.5 * linear_cross_entropy(hidden, weight, targets, chunk_size=16)).backward()
    monkeypatch.undo()
    assert torch.isfinite(weight.grad).all()
    torch.testing.assert_close(weight.grad, expected, rtol=0, atol=0)
