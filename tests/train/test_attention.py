"""Block-diffusion attention: the predicate, the dense and flex backends, the pair count."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from turbo_dllm.errors import DllmError
from turbo_dllm.train.attention import (
    BlockDiffusionLayout,
    FlexAttention,
    ReferenceAttention,
    allowed_pairs,
    build_attention,
    dense_mask,
    local_allowed,
    prefix_allowed,
)


def may_attend(L: int, B: int, docs: list[int] | None, q: int, kv: int) -> bool:
    """The design's rule, written out case by case."""
    q_noisy, kv_noisy = q < L, kv < L
    qp, kp = q % L, kv % L
    if docs is not None and docs[qp] != docs[kp]:
        return False
    qb, kb = qp // B, kp // B
    if q_noisy and kv_noisy:
        return qb == kb
    if q_noisy and not kv_noisy:
        return kb < qb
    if not q_noisy and not kv_noisy:
        return kb <= qb
    return False  # clean never sees noisy


def loop_attention(q, k, v, L, B, docs_rows):
    """Direct per-query softmax over the allowed keys (GQA by head repetition)."""
    batch, hq, S, D = q.shape
    group = hq // k.shape[1]
    out = torch.zeros_like(q)
    for b in range(batch):
        docs = docs_rows[b] if docs_rows is not None else None
        for h in range(hq):
            for i in range(S):
                keys = [j for j in range(S) if may_attend(L, B, docs, i, j)]
                kk, vv = k[b, h // group, keys], v[b, h // group, keys]
                weights = torch.softmax(kk @ q[b, h, i] / math.sqrt(D), dim=0)
                out[b, h, i] = weights @ vv
    return out


CASES = [
    (12, 4, None),
    (12, 3, [[0] * 5 + [1] * 7, [0] * 12]),
    (16, 8, [[0, 0, 0, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2], [0] * 7 + [5] * 9]),
]


@pytest.mark.parametrize("L,B,docs", CASES)
def test_dense_mask_is_the_design_rule(L, B, docs):
    layout = BlockDiffusionLayout(L, B)
    doc_t = torch.tensor(docs) if docs else None
    mask = dense_mask(layout, doc_t)
    rows = len(docs) if docs else 1
    for r in range(rows):
        for q in range(2 * L):
            for kv in range(2 * L):
                expected = may_attend(L, B, docs[r] if docs else None, q, kv)
                assert bool(mask[r, 0, q, kv]) == expected, (r, q, kv)


def test_local_and_prefix_parts_partition_the_mask():
    layout = BlockDiffusionLayout(16, 4)
    idx = torch.arange(32)
    local = local_allowed(layout, idx[:, None], idx[None, :])
    prefix = prefix_allowed(layout, idx[:, None], idx[None, :])
    assert not (local & prefix).any()
    assert torch.equal(local | prefix, dense_mask(layout)[0, 0])
    assert not prefix[:, :16].any()  # prefix keys are all clean
    assert not local[16:].any() and not local[:, 16:].any()  # local is noisy-only


@pytest.mark.parametrize("L,B,docs", CASES)
def test_reference_backend_matches_per_query_loop(L, B, docs):
    torch.manual_seed(0)
    batch = len(docs) if docs else 2
    q = torch.randn(batch, 4, 2 * L, 8, dtype=torch.float64)
    k = torch.randn(batch, 2, 2 * L, 8, dtype=torch.float64)
    v = torch.randn(batch, 2, 2 * L, 8, dtype=torch.float64)
    layout = BlockDiffusionLayout(L, B)
    doc_t = torch.tensor(docs) if docs else None
    backend = ReferenceAttention()
    got = backend(q, k, v, backend.prepare(layout, doc_t, torch.device("cpu")))
    torch.testing.assert_close(got, loop_attention(q, k, v, L, B, docs))


@pytest.mark.parametrize("L,B,docs", CASES)
def test_flex_block_mask_matches_per_query_loop_on_cpu(L, B, docs):
    """torch runs FlexAttention forward-only on CPU; enough to check the BlockMask."""
    torch.manual_seed(1)
    batch = len(docs) if docs else 2
    q, k, v = (torch.randn(batch, h, 2 * L, 8) for h in (4, 2, 2))
    layout = BlockDiffusionLayout(L, B)
    backend = FlexAttention(compile=False)
    doc_t = torch.tensor(docs) if docs else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = backend(q, k, v, backend.prepare(layout, doc_t, torch.device("cpu")))
    expected = loop_attention(q.double(), k.double(), v.double(), L, B, docs).float()
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


def test_flex_mask_is_cached_for_single_document_rows():
    backend = FlexAttention(compile=False)
    layout = BlockDiffusionLayout(64, 16)
    one_doc = torch.zeros(2, 64, dtype=torch.int32)
    a = backend.prepare(layout, one_doc, torch.device("cpu"))
    assert backend.prepare(layout, None, torch.device("cpu")) is a


@pytest.mark.parametrize("L,B,docs", CASES)
def test_allowed_pairs_counts_the_mask(L, B, docs):
    layout = BlockDiffusionLayout(L, B)
    doc_t = torch.tensor(docs) if docs else None
    mask = dense_mask(layout, doc_t)
    assert allowed_pairs(layout, doc_t) == int(mask.sum())


def test_allowed_pairs_closed_form_without_documents():
    L, B = 1024, 32
    n = L // B
    expected = L * B + B * B * (n * (n - 1) // 2) + B * B * (n * (n + 1) // 2)
    assert allowed_pairs(BlockDiffusionLayout(L, B)) == expected


def test_flex_needs_cuda_to_train():
    with pytest.raises(DllmError, match="needs a CUDA GPU"):
        build_attention("flex", torch.device("cpu"))
    assert build_attention("reference", torch.device("cpu")).name == "reference"


def test_layout_rejects_partial_blocks():
    with pytest.raises(ValueError, match="multiple of block_size"):
        BlockDiffusionLayout(10, 4)


def test_block_masks_are_built_without_the_deprecated_compile_flag():
    """On CUDA the BlockMask builder is torch.compile(create_block_mask), the form torch 2.11+
    supports (create_block_mask(_compile=True) warns and will go); on CPU it stays eager."""
    from torch.nn.attention.flex_attention import create_block_mask

    from turbo_dllm.train.attention.backends import create_block_mask_for

    assert create_block_mask_for("cpu") is create_block_mask
    compiled = create_block_mask_for("cuda")  # torch.compile is lazy: no GPU needed to build it
    assert compiled is create_block_mask_for(torch.device("cuda", 0))  # one wrapper per process
    assert getattr(compiled, "_torchdynamo_orig_callable", None) is create_block_mask
    layout = BlockDiffusionLayout(32, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        FlexAttention(compile=False).prepare(layout, None, torch.device("cpu"))


def test_turbo_needs_cuda_to_train():
    with pytest.raises(DllmError, match="turbo") as caught:
        build_attention("turbo", torch.device("cpu"))
    assert "model.attention: reference" in caught.value.hint
