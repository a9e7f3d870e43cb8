"""The block-diffusion attention Triton kernels, run on the CPU by Triton's interpreter.

Every mask shape the trainer asks for (the whole 2L stream; CSBP's local part, noisy blocks with
themselves; its prefix part, noisy and clean queries over gathered clean keys in zigzag order;
the CP baseline's shard order), with documents, GQA, head dims 64 and 128 and block sizes 16 and
64, forward (out and lse) and every gradient (dq, dk, dv, with a gradient on lse too), against
the dense torch reference. Tiles are tiny (16/32) so each case crosses several tiles of every
class. The GPU suite runs the same kernels compiled in bf16 (tests/gpu/
test_block_diffusion_attention_gpu.py).

The interpreter must be switched on before triton is first imported, so the cases run in a
child process. They run in float16: the interpreter's bf16 matrix products are wrong in this
Triton (it reads bf16 bits as another format), while fp16 exercises the same code path.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch

from tests import prefetch
from tests.helpers import ROOT

CHILD = r"""
import json, sys, torch
from turbo_dllm.kernels.block_diffusion import (
    block_diffusion_attention, plan_block_diffusion_attention)
from turbo_dllm.kernels.triton_ops import triton_module
from turbo_dllm.train.parallel.layout import CpLayout, CsbpLayout
from turbo_dllm.train.parallel.visibility import TokenSet, two_stream_tokens

module = triton_module("block_diffusion_attention", "jit")
TINY = module.KernelConfig(fwd_m=16, fwd_n=32, dkdv_m=32, dkdv_n=16, dq_m=16, dq_n=16)
REAL = module.classify_tiles
everywhere = module.everywhere


def relabel(before, after):  # a corrupted (or over-cautious) tile classification
    def classify(*args):
        classes = REAL(*args)
        return torch.where(classes == before, after, classes).to(classes.dtype)
    return classify


def docs_for(batch, seq_len, cuts):
    doc = torch.zeros(batch, seq_len, dtype=torch.long)
    for row, cut in enumerate(cuts):
        if cut:
            doc[row, cut:] = 1
    return doc


def run(name, q_tokens, k_tokens, heads, kv_heads, dim, seed, batch=None, views=False):
    gen = torch.Generator().manual_seed(seed)
    batch = batch or q_tokens.doc.shape[0]  # one doc row may serve the whole batch
    sq, sk = len(q_tokens), len(k_tokens)
    meta = (q_tokens.noisy, q_tokens.block, q_tokens.doc, k_tokens.noisy, k_tokens.block, k_tokens.doc)
    plan = plan_block_diffusion_attention(*meta, backend="jit", config=TINY)
    ref = plan_block_diffusion_attention(*meta, backend="reference")
    q = torch.randn(batch, heads, sq, dim, generator=gen).half()
    k = torch.randn(batch, kv_heads, sk, dim, generator=gen).half()
    v = torch.randn(batch, kv_heads, sk, dim, generator=gen).half()
    if views:  # (B, S, H, D) memory seen as (B, H, S, D), what the attention layer passes
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    grad_out = torch.randn(batch, heads, sq, dim, generator=gen)
    grad_lse = torch.randn(batch, heads, sq, generator=gen)

    def attend(p):
        leaves = [t.detach().clone(memory_format=torch.preserve_format).requires_grad_(True)
                  for t in (q, k, v)]
        out, lse = block_diffusion_attention(*leaves, p)
        finite = torch.isfinite(lse)
        loss = (out.float() * grad_out).sum() + (torch.where(finite, lse, 0) * grad_lse).sum()
        loss.backward()
        return [out, lse] + [leaf.grad for leaf in leaves]

    got, want = attend(plan), attend(ref)
    errors = {}
    for part, g, w in zip(["out", "lse", "dq", "dk", "dv"], got, want):
        g, w = g.detach().float(), w.detach().float()
        finite = torch.isfinite(w)
        errors[part] = {
            "rel": float((g - w)[finite].abs().max() / w[finite].abs().max().clamp(min=1e-6)),
            "same_inf": bool(torch.equal(torch.isinf(g), torch.isinf(w))),
            "nan": bool(torch.isnan(g).any()),
        }
    classes = plan.schedule.classes(TINY.fwd_m, TINY.fwd_n)
    tiles = {c: int((classes == v).sum()) for c, v in (("full", 2), ("partial", 1), ("empty", 0))}
    unseen = int((~torch.isfinite(want[1])).sum())
    tma = module._uses_tma(TINY.fwd_tma, q, k, v)
    runs = max(int(each.count[..., 2].max()) for each in plan.schedule.lists(TINY))
    return {"case": name, "errors": errors, "tiles": tiles, "unseen_rows": unseen, "tma": tma,
            "max_runs": runs}


L = 64
docs = docs_for(2, L, [0, 23])  # a document boundary inside a block
whole16 = two_stream_tokens(torch.arange(L), block_size=16, doc_ids=docs)
whole64 = two_stream_tokens(torch.arange(2 * L), block_size=64, doc_ids=docs_for(1, 2 * L, [50]))
# Every mode named on the command line, in order, in this one process (one interpreter start
# for the module); each mode starts from the same tiles and tile classification.
found, FIRST = {}, TINY
for mode in sys.argv[1:]:
    results = found[mode] = []
    TINY, module.classify_tiles = FIRST, REAL
    if mode == "trainer":
        # The trainer's two entry points: the whole-stream backend and CSBP (cp 1) with turbo.
        from turbo_dllm.train.attention import BlockDiffusionLayout, ReferenceAttention, TurboAttention
        from turbo_dllm.train.parallel.csbp import CsbpAttention

        module.SM90_CONFIGS = {64: TINY, 128: TINY}  # the default tiles are too big to interpret
        gen = torch.Generator().manual_seed(5)
        layout = BlockDiffusionLayout(64, 16)
        docs = docs_for(2, 64, [0, 23])
        q = torch.randn(2, 4, 128, 64, generator=gen).half()
        k, v = (torch.randn(2, 2, 128, 64, generator=gen).half() for _ in range(2))
        turbo, ref = TurboAttention("jit"), ReferenceAttention()
        for doc_ids in (docs, None):
            got = turbo(q, k, v, turbo.prepare(layout, doc_ids, torch.device("cpu")))
            want = ref(q.float(), k.float(), v.float(), ref.prepare(layout, doc_ids, "cpu"))
            results.append({"case": f"TurboAttention docs={doc_ids is not None}",
                            "rel": float((got.float() - want).abs().max() / want.abs().max())})
            # The trimmed model's windows (train.attention.trim): the last layer's noisy queries
            # over the whole stream, and the clean half alone.
            for rows, cols in ((range(64), range(128)), (range(64, 128), range(64, 128))):
                qs, ks = slice(rows.start, rows.stop), slice(cols.start, cols.stop)
                mask = turbo.prepare(layout, doc_ids, torch.device("cpu"), queries=rows, keys=cols)
                got = turbo(q[:, :, qs], k[:, :, ks], v[:, :, ks], mask)
                want = ref(q[:, :, qs].float(), k[:, :, ks].float(), v[:, :, ks].float(),
                           ref.prepare(layout, doc_ids, "cpu", queries=rows, keys=cols))
                results.append({"case": f"TurboAttention window {rows.start} docs={doc_ids is not None}",
                                "rel": float((got.float() - want).abs().max() / want.abs().max())})
        csbp_layout = CsbpLayout.build(64, 16, bp=2, cp=1, ctx_rank=0)
        width = csbp_layout.num_noisy + csbp_layout.num_clean
        qc = torch.randn(2, 4, width, 64, generator=gen).half()
        kc, vc = (torch.randn(2, 2, width, 64, generator=gen).half() for _ in range(2))
        outs = [CsbpAttention(csbp_layout, docs, None, backend=b, kernels="jit")(
                    qc if b == "turbo" else qc.float(), *((kc, vc) if b == "turbo" else (kc.float(), vc.float())))
                for b in ("turbo", "reference")]
        results.append({"case": "CsbpAttention turbo",
                        "rel": float((outs[0].float() - outs[1]).abs().max() / outs[1].abs().max())})
    elif mode == "compiled":
        # torch.compile(fullgraph) traces the op's Python side (plan lookups, the custom op and its
        # autograd) without a graph break; aot_eager keeps the interpreter's kernels.
        whole = two_stream_tokens(torch.arange(32), block_size=16, doc_ids=docs_for(1, 32, [0]))
        meta = (whole.noisy, whole.block, whole.doc)
        plan = plan_block_diffusion_attention(*meta, *meta, backend="jit", config=TINY)
        gen = torch.Generator().manual_seed(6)
        q = torch.randn(1, 2, 64, 64, generator=gen).half().requires_grad_()
        k, v = (torch.randn(1, 1, 64, 64, generator=gen).half().requires_grad_() for _ in range(2))

        def compiled_vs_eager(fn, *inputs):
            # the largest relative gradient difference of fn compiled (fullgraph) against eager
            eager = torch.autograd.grad(fn(*inputs), inputs)
            compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
            got = torch.autograd.grad(compiled(*inputs), inputs)
            return max(float((g.float() - e.float()).abs().max() / e.float().abs().max())
                       for g, e in zip(got, eager))

        def layer(q, k, v):
            out, lse = block_diffusion_attention(q * 2, k, v, plan)
            return out.float().square().sum() + lse.sum()

        results.append({"case": "torch.compile fullgraph", "rel": compiled_vs_eager(layer, q, k, v)})
        # dQ fused into the dK/dV kernel, q a strided view of (B, S, H, D) as the model hands it:
        # the backward's dQ must have q's strides (what the fake says), or the graph's views fail.
        fused = plan_block_diffusion_attention(
            *meta, *meta, backend="jit", config=TINY.with_part("dkdv", dq=1))
        q_rows = torch.randn(1, 64, 2 * 64, generator=gen).half().requires_grad_()

        def strided(q_rows, k, v):  # (B, S, H * D) -> (B, H, S, D), as attention layers do
            q = q_rows.view(1, 64, 2, 64).transpose(1, 2)
            out, lse = block_diffusion_attention(q, k, v, fused)
            return out.float().square().sum() + lse.sum()

        results.append({"case": "torch.compile fullgraph dq fused strided q",
                        "rel": compiled_vs_eager(strided, q_rows, k, v)})
    elif mode == "variants":
        # Every loop and load variant the sweep may pick, in all three kernels: the whole stream
        # (every tile class, documents, GQA) and CSBP's prefix part (zigzag keys: several runs).
        csbp = CsbpLayout.build(128, 16, bp=4, cp=2, ctx_rank=0)
        d = docs_for(2, 128, [0, 40])
        noisy = TokenSet.from_positions(csbp.noisy_positions, noisy=True, block_size=16, doc_ids=d)
        clean = TokenSet.from_positions(csbp.clean_positions, noisy=False, block_size=16, doc_ids=d)
        gathered = TokenSet.from_positions(
            csbp.gathered_clean_positions, noisy=False, block_size=16, doc_ids=d)
        base = TINY
        variants = [v for v in module.LOOP_VARIANTS if v[0] != "tma host"]  # (the default case has it)
        variants.append(("head-major runs tl.range tma host", dict(order=1, runs=1, pipe=1, tma=1)))
        for label, values in variants:
            TINY = everywhere(base, **values)
            results.append(run(f"{label}: stream", whole16, whole16, 4, 2, 64, 0, views=True))
            if "runs" in label:
                results.append(run(f"{label}: csbp prefix", TokenSet.concat(noisy, clean), gathered,
                                   4, 1, 128, 3))
        # dQ made by the dK/dV kernel (fp32 atomics), no dQ kernel: GQA, documents, partial tiles.
        TINY = base.with_part("dkdv", dq=1)
        results.append(run("dq fused: stream", whole16, whole16, 4, 2, 64, 0, views=True))
        TINY = everywhere(base, runs=1, pipe=1).with_part("dkdv", dq=1)
        results.append(run("dq fused runs tl.range: csbp prefix", TokenSet.concat(noisy, clean),
                           gathered, 4, 1, 128, 3))
        TINY = base
    elif mode == "relabelled":
        for name, before, after in (("partial-as-full", module.PARTIAL, module.FULL),
                                    ("full-as-partial", module.FULL, module.PARTIAL)):
            module.classify_tiles = relabel(before, after)
            results.append(run(name, whole16, whole16, 4, 2, 64, 0))
        module.classify_tiles = REAL
    else:
        results.append(run("stream B=16 docs GQA D=64", whole16, whole16, 4, 2, 64, 0))
        results.append(run("stream B=64 docs D=128", whole64, whole64, 2, 1, 128, 1))
        # Full tiles through TMA descriptors (the sweep's opt-in path), q/k/v as the model's views.
        TINY = everywhere(TINY, tma=1)
        results.append(run("stream B=16 docs GQA D=64 tma", whole16, whole16, 4, 2, 64, 0, views=True))
        TINY = everywhere(TINY, tma=0)
        # CSBP, 4 block-parallel ranks over 2 clean shards, rank 0 (blocks 0 and 7): both parts.
        csbp = CsbpLayout.build(128, 16, bp=4, cp=2, ctx_rank=0)
        d = docs_for(2, 128, [0, 40])
        noisy = TokenSet.from_positions(csbp.noisy_positions, noisy=True, block_size=16, doc_ids=d)
        clean = TokenSet.from_positions(csbp.clean_positions, noisy=False, block_size=16, doc_ids=d)
        gathered = TokenSet.from_positions(
            csbp.gathered_clean_positions, noisy=False, block_size=16, doc_ids=d)
        results.append(run("csbp local B=16 D=64", noisy, noisy, 2, 2, 64, 2))
        results.append(run("csbp prefix B=16 GQA D=128", TokenSet.concat(noisy, clean), gathered, 4, 1, 128, 3))
        # The CP baseline: rank 0 of 2, its two zigzag chunks of both streams over all gathered keys.
        cp = CpLayout.build(128, 16, cp=2, rank=0)
        d1 = docs_for(1, 128, [0])
        local = two_stream_tokens(cp.positions, block_size=16, doc_ids=d1)
        all_keys = TokenSet.concat(*(two_stream_tokens(p, block_size=16, doc_ids=d1)
                                     for p in cp.gathered_positions.chunk(2)))
        # 2 x 40 tokens: tiles of 32 run past the end (ragged tiles are partial, bounds-checked).
        ragged = two_stream_tokens(torch.arange(40), block_size=16, doc_ids=docs_for(1, 40, [0]))
        results.append(run("ragged 80 tokens B=16 D=64", ragged, ragged, 2, 2, 64, 5))
        # One document per row: one doc row (and one schedule) serves a batch of 2, as in the trainer.
        results.append(run("cp baseline B=16 D=64", local, all_keys, 2, 1, 64, 4, batch=2))
print(json.dumps(found))
"""

TOLERANCE = 1e-2  # fp16 inputs, fp32 accumulation: the kernels and the reference round apart


MODES = ("none", "variants", "relabelled", "trainer", "compiled")


# Every mode's results from one child process (each start imports torch and Triton and sets
# the interpreter up, several seconds apiece on 2 cores), started with the session
# (tests/prefetch.py): about a minute of interpreting, on the core the other tests leave idle.
prefetch.declare(
    "triton interpreter",
    [sys.executable, "-c", CHILD, *MODES],
    env={"TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)},
    timeout=900,
)


@pytest.fixture(scope="module")
def children() -> dict[str, list[dict]]:
    done, _ = prefetch.result("triton interpreter")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def _child(children):
    return children.__getitem__


def test_kernels_match_the_reference_for_every_mask_shape(_child):
    results = _child("none")
    assert [r["case"] for r in results] == [
        "stream B=16 docs GQA D=64",
        "stream B=64 docs D=128",
        "stream B=16 docs GQA D=64 tma",
        "csbp local B=16 D=64",
        "csbp prefix B=16 GQA D=128",
        "ragged 80 tokens B=16 D=64",
        "cp baseline B=16 D=64",
    ]
    for r in results:
        for part, e in r["errors"].items():
            assert e["rel"] < TOLERANCE and e["same_inf"] and not e["nan"], (r["case"], part, e)
    # The cases walk full and partial tiles and skip empty ones (the whole stream has all three).
    for r in results[:2]:
        assert min(r["tiles"].values()) > 0, r
    assert [r["case"] for r in results if r["tma"]] == ["stream B=16 docs GQA D=64 tma"]
    # CSBP's prefix part holds queries that see no key (noisy block 0): lse -inf, out 0.
    prefix = next(r for r in results if r["case"].startswith("csbp prefix"))
    assert prefix["unseen_rows"] > 0


def test_every_loop_and_load_variant_matches_the_reference(_child):
    """The sweep's variants (tl.range pipelining, warp specialisation, full tiles as runs of
    affine loops, head-major launch order, host and device TMA descriptors, dQ fused into the
    dK/dV kernel), forward and every gradient, in all three kernels at once."""
    results = _child("variants")
    assert len(results) == 14
    for r in results:
        for part, e in r["errors"].items():
            assert e["rel"] < TOLERANCE and e["same_inf"] and not e["nan"], (r["case"], part, e)
    assert all(r["tma"] for r in results if "tma" in r["case"])
    # The runs variants walk rows whose full tiles are more than one run.
    assert max(r["max_runs"] for r in results if "runs" in r["case"]) > 1


def test_a_partial_tile_run_as_full_is_caught_and_full_tiles_run_as_partial_stay_exact(_child):
    """Relabelled tile classes, same inputs: treating a partial tile as full (no mask) must be
    caught; running full tiles on the masked path must not change the result (the full path only
    skips mask arithmetic)."""
    corrupted, cautious = _child("relabelled")
    assert corrupted["tiles"]["partial"] == 0 and cautious["tiles"]["full"] == 0
    for part in ("out", "lse", "dq", "dk", "dv"):
        assert corrupted["errors"][part]["rel"] > 10 * TOLERANCE, (part, corrupted)
        assert cautious["errors"][part]["rel"] < TOLERANCE, (part, cautious)


# --- the schedule itself (plain torch, no interpreter) -------------------------------------
def _module():
    from turbo_dllm.kernels.triton_ops import triton_module

    return triton_module("block_diffusion_attention", "jit")


@pytest.mark.parametrize("block_size", [16, 64, 256])
@pytest.mark.parametrize("tiles", [(128, 64), (64, 128), (16, 48)])
def test_tile_classes_agree_with_the_dense_mask(block_size, tiles):
    """Full tiles hold only allowed pairs, empty ones none; a partial one is never both."""
    from turbo_dllm.kernels.reference import block_diffusion_visible
    from turbo_dllm.train.parallel.visibility import two_stream_tokens

    module = _module()
    seq_len = 256
    docs = torch.zeros(2, seq_len, dtype=torch.long)
    docs[1, 50:] = 1
    docs[1, 150:] = 2
    tokens = two_stream_tokens(torch.arange(seq_len), block_size=block_size, doc_ids=docs)
    meta = (tokens.noisy, tokens.block, tokens.doc)
    block_m, block_n = tiles
    classes = module.classify_tiles(meta, meta, block_m, block_n)
    visible = block_diffusion_visible(*meta, *meta)
    s = visible.shape[1]
    mt, nt = -(-s // block_m), -(-s // block_n)
    pad = torch.zeros(2, mt * block_m, nt * block_n, dtype=torch.bool)
    pad[:, :s, :s] = visible
    per_tile = pad.view(2, mt, block_m, nt, block_n)
    any_pair = per_tile.any(4).any(2)
    all_pairs = per_tile.all(4).all(2)
    # Sound: an empty tile holds no allowed pair, a full one no forbidden pair.
    assert not any_pair[classes == module.EMPTY].any()
    assert all_pairs[classes == module.FULL].all()
    # And exact where tiles do not straddle the two streams (row 0 holds one document).
    if seq_len % block_m == 0 and seq_len % block_n == 0:
        assert torch.equal(classes == module.EMPTY, ~any_pair)
        assert torch.equal((classes == module.FULL)[0], all_pairs[0])
    lists = module.tile_lists(classes)
    full, partial = lists.count[..., 0], lists.count[..., 1]
    assert torch.equal(full, (classes == module.FULL).sum(-1).int())
    first = lists.index[..., :1].long()
    has_full = full > 0
    assert (classes.gather(-1, first)[..., 0][has_full] == module.FULL).all()
    assert int(partial.sum()) == int((classes == module.PARTIAL).sum())


def test_gluon_dkdv_launch_order_follows_the_grid():
    """The Gluon dK/dV kernel's key tiles per launch chunk (`dkdv_order` 0 chooses; 1 is head
    by head, N chunks of N) on the H200's 132 SMs at the shapes docs/benchmarks.md measured:
    the 8K step (2L 16K, micro-batch 1, 8 KV heads: 128 key tiles of 128 a head) runs every
    head's heaviest tile first, 64K tokens a call (4 rows) chunks of 16, the 32K step (512
    tiles a head) head by head."""
    module = _module()
    assert module.default_config(128).dkdv_order == 0
    chunk = module.dkdv_chunk
    assert chunk(0, 128, 8, 132) == 1
    assert chunk(0, 128, 4 * 8, 132) == 16
    assert chunk(0, 64, 8 * 8, 132) == 16  # 2L 8K, 8 rows
    assert chunk(0, 512, 8, 132) == 512
    assert chunk(0, 8, 1000, 132) == 8  # never more than the tiles
    assert chunk(1, 128, 8, 132) == 128 and chunk(3, 128, 8, 132) == 3
    assert chunk(40, 16, 8, 132) == 16


def test_gluon_kernels_are_refused_where_they_cannot_run():
    """`dkdv_gluon` and `dq_gluon` (no interpreter runs Gluon; their numbers are checked on the
    GPU) refuse, before any launch, a host without an sm90 GPU, other tiles, a dQ buffer they
    cannot add into, a split dK/dV with dQ fused, a split dK/dV or dQ without its Gluon kernel,
    and other head dims, each by name."""
    from turbo_dllm.kernels.selftest import block_diffusion_tokens

    module = _module()
    assert module.HAS_GLUON  # this host's Triton has Gluon: the refusals below are the launcher's
    config = module.flag_configs(64)["gluon dkdv"]
    assert config.dkdv_gluon == 1 and config.fwd_m == module.default_config(64).fwd_m
    meta = block_diffusion_tokens(64, 16, 1, None)
    schedule = module.make_schedule(*meta, *meta)
    q = torch.zeros(1, 4, 128, 64, dtype=torch.bfloat16)
    k = torch.zeros(1, 2, 128, 64, dtype=torch.bfloat16)
    stats = torch.zeros(1, 4, 128)

    def dkdv(config, dq_acc=None):
        module.backward_dkdv(q, stats, stats, q, k, k, schedule, 0.125, config, dq_acc)

    with pytest.raises(ValueError, match="sm90 GPUs"):
        dkdv(config)
    with pytest.raises(ValueError, match="64 x 128 tiles on 8 warps"):
        dkdv(config.with_part("dkdv", m=32))
    with pytest.raises(ValueError, match="contiguous float32 dq_acc"):
        dkdv(config.with_part("dkdv", dq=1), dq_acc=torch.zeros(q.shape).transpose(2, 3))
    split = module.flag_configs(64)["gluon dkdv split"]
    with pytest.raises(ValueError, match="dkdv_split runs without dkdv_dq"):
        dkdv(split.with_part("dkdv", dq=1), dq_acc=torch.zeros(q.shape))
    with pytest.raises(ValueError, match="dkdv_split is a layout of the Gluon dK/dV kernel"):
        dkdv(split.with_part("dkdv", gluon=0))
    # the dQ kernel's launcher, the same way
    dq_config = module.flag_configs(64)["gluon backward"]
    assert dq_config.dq_gluon == 1
    with pytest.raises(ValueError, match="dq_gluon runs on sm90 GPUs"):
        module.backward_dq(q, stats, stats, q, k, k, schedule, 0.125, dq_config)
    with pytest.raises(ValueError, match="dq_split is a layout of the Gluon dQ kernel"):
        module.backward_dq(
            q, stats, stats, q, k, k, schedule, 0.125, dq_config.with_part("dq", gluon=0, split=1)
        )
    with pytest.raises(ValueError, match="dq_gluon runs 128 x 64 tiles on 8 warps"):
        module.backward_dq(
            q, stats, stats, q, k, k, schedule, 0.125, dq_config.with_part("dq", n=128)
        )
    with pytest.raises(ValueError, match="head dim 64 or 128"):
        module.backward_dkdv(
            *(torch.zeros(1, 2, 128, 32, dtype=torch.bfloat16),) + (stats[:, :2],) * 2,
            *(torch.zeros(1, 2, 128, 32, dtype=torch.bfloat16),) * 3,
            schedule, 0.125, config,
        )  # fmt: skip


def test_gluon_kernels_read_the_models_layout_in_place():
    """The Gluon kernels' TMA reads each tensor as a matrix of rows (`_tma_rows`): q, k, v and
    dO as the model hands them, (B, S, H, D) transposed to (B, H, S, D), are read in place
    (they were copied before every dK/dV launch: ~7.5 ms of an 8K step), contiguous ones too;
    anything else, and a pair of two layouts, is copied. Every element sits where the
    coordinates the kernels compute point."""
    module = _module()

    def check(t, want_copy):
        read, (row_len, rows_b, rows_h, cols_h) = module._tma_rows(t)
        assert (read.data_ptr() != t.data_ptr()) == want_copy and torch.equal(read, t)
        matrix = read.as_strided((read.numel() // row_len, row_len), (row_len, 1))
        batch, heads, seq, dim = t.shape
        for b in range(batch):
            for h in range(heads):
                first = b * rows_b + h * rows_h
                got = matrix[first : first + seq, h * cols_h : h * cols_h + dim]
                assert torch.equal(got, t[b, h]), (b, h)

    bshd = torch.randn(2, 5, 3, 8).transpose(1, 2)  # (B, S, H, D) viewed as (B, H, S, D)
    check(bshd, want_copy=False)
    check(torch.randn(2, 3, 5, 8), want_copy=False)
    check(torch.randn(2, 3, 5, 16)[..., :8], want_copy=True)  # rows with gaps
    check(torch.randn(2, 1, 5, 8), want_copy=False)  # one head: both layouts at once
    q, do, layout = module._tma_pair(bshd, bshd.clone())
    assert q.data_ptr() == bshd.data_ptr() and layout == (3 * 8, 5, 0, 8)
    q, do, layout = module._tma_pair(bshd, bshd.contiguous())  # two layouts: one set of rows
    assert q.is_contiguous() and do.is_contiguous() and layout == (8, 3 * 5, 5, 0)
    # the statistics (B, H, S) as rows of S, 16-byte aligned: padded where S % 4 != 0
    for seq in (8, 5):
        stats = torch.randn(2, 3, seq)
        rows, stride = module._stat_rows(stats)
        assert stride % 4 == 0 and rows.stride(0) == stride and rows.shape[0] == 2 * 3
        assert torch.equal(rows[:, :seq], stats.reshape(6, seq))
        assert (rows.data_ptr() == stats.data_ptr()) == (seq == 8)


def test_without_gluon_the_defaults_run_the_tl_kernels(monkeypatch):
    """Head dim 128 ships the Gluon dK/dV (split); under a Triton without Gluon's 3.6 API the
    default is the same config on the `tl` kernels (same numbers), not a refusal at launch."""
    module = _module()
    assert module.HAS_GLUON
    shipped = module.default_config(128)
    assert (shipped.dkdv_gluon, shipped.dkdv_split) == (1, 1)
    monkeypatch.setattr(module, "HAS_GLUON", False)
    fallback = module.default_config(128)
    assert (fallback.dkdv_gluon, fallback.dkdv_split, fallback.dq_gluon) == (0, 0, 0)
    assert fallback == shipped.with_part("dkdv", gluon=0, split=0) == module.tl_default(128)
    assert module.default_config(64) == module.SM90_CONFIGS[64]  # D = 64 ships no Gluon kernel


def test_reference_matches_the_training_reference_attention():
    """The op's torch reference equals partial_attention's dense reference (same rule)."""
    from turbo_dllm.kernels.block_diffusion import (
        block_diffusion_attention,
        plan_block_diffusion_attention,
    )
    from turbo_dllm.train.parallel.partial_attention import dense_attention_with_lse
    from turbo_dllm.train.parallel.visibility import tokens_mask, two_stream_tokens

    docs = torch.zeros(2, 32, dtype=torch.long)
    docs[1, 10:] = 1
    tokens = two_stream_tokens(torch.arange(32), block_size=8, doc_ids=docs)
    plan = plan_block_diffusion_attention(
        tokens.noisy, tokens.block, tokens.doc, tokens.noisy, tokens.block, tokens.doc
    )
    q = torch.randn(2, 4, 64, 16, dtype=torch.float64)
    k, v = torch.randn(2, 2, 64, 16, dtype=torch.float64), torch.randn(2, 2, 64, 16).double()
    out, lse = block_diffusion_attention(q, k, v, plan)
    want_out, want_lse = dense_attention_with_lse(q, k, v, tokens_mask(tokens, tokens))
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(lse, want_lse)


def test_trainer_backends_run_the_kernels(_child):
    """TurboAttention (with and without documents, whole and windowed) and
    CsbpAttention(backend='turbo') equal their reference twins."""
    results = _child("trainer")
    assert [r["case"] for r in results] == [
        "TurboAttention docs=True",
        "TurboAttention window 0 docs=True",
        "TurboAttention window 64 docs=True",
        "TurboAttention docs=False",
        "TurboAttention window 0 docs=False",
        "TurboAttention window 64 docs=False",
        "CsbpAttention turbo",
    ]
    for r in results:
        assert r["rel"] < TOLERANCE, r


def test_the_op_traces_into_torch_compile_without_a_graph_break(_child):
    results = _child("compiled")
    assert [r["case"] for r in results] == [
        "torch.compile fullgraph",
        "torch.compile fullgraph dq fused strided q",
    ]
    for result in results:  # the same kernels run: equal up to summation order
        assert result["rel"] < 1e-3, result
