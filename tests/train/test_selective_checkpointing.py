"""`training.activation_checkpointing: keep_attention`: the backward reruns every layer but its
attention kernels, whose outputs are kept; the numbers are those of full checkpointing.

Counted with a dispatch mode over whole training runs (reference attention: CPU SDPA's fused
kernel) and over one layer-like block on our Triton op in Triton's interpreter (a child process:
the interpreter must be on before triton is imported).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.helpers import run_in_triton_interpreter
from tests.train.util import metrics, tiny_spec
from turbo_dllm.train.entry import train

SDPA = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default


class CountOps(TorchDispatchMode):
    def __init__(self, *ops) -> None:
        super().__init__()
        self.ops, self.counts = ops, dict.fromkeys(ops, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.counts:
            self.counts[func] += 1
        return func(*args, **(kwargs or {}))


def _run(tmp_path: Path, checkpointing: str) -> tuple[int, list[dict]]:
    spec = tiny_spec(
        "training.steps=3",
        "checkpoint.interval=null",
        f"training.activation_checkpointing={checkpointing}",
    )
    with CountOps(SDPA) as count:
        train(spec, tmp_path / checkpointing)
    return count.counts[SDPA], metrics(tmp_path / checkpointing)


def test_keep_attention_runs_attention_once_per_layer_and_changes_no_number(tmp_path):
    plain, plain_rows = _run(tmp_path, "false")
    full, full_rows = _run(tmp_path, "true")
    keep, keep_rows = _run(tmp_path, "keep_attention")
    layers, steps = 2, 3
    assert plain == layers * steps  # one attention forward per layer and step
    assert full == 2 * plain  # full checkpointing reruns it in the backward
    assert keep == plain  # keep_attention does not
    for field in ("loss", "grad_norm"):
        assert [r[field] for r in keep_rows] == [r[field] for r in full_rows]
        assert [r[field] for r in keep_rows] == [r[field] for r in plain_rows]


def test_keep_matmuls_reruns_no_matmul_and_changes_no_number(tmp_path):
    """keep_matmuls: the backward reruns neither attention nor any GEMM of a layer (the
    run's matmul count is the uncheckpointed run's; full checkpointing's is higher), and the
    losses and gradient norms are those of full checkpointing, bitwise."""
    mm, addmm = torch.ops.aten.mm.default, torch.ops.aten.addmm.default
    counts, rows = {}, {}
    for mode in ("false", "true", "keep_matmuls"):
        spec = tiny_spec(
            "training.steps=3",
            "checkpoint.interval=null",
            f"training.activation_checkpointing={mode}",
        )
        with CountOps(SDPA, mm, addmm) as count:
            train(spec, tmp_path / mode)
        counts[mode], rows[mode] = count.counts, metrics(tmp_path / mode)
    matmuls = {mode: c[mm] + c[addmm] for mode, c in counts.items()}
    assert matmuls["true"] > matmuls["false"]  # full checkpointing reruns the projections
    assert matmuls["keep_matmuls"] == matmuls["false"]
    assert counts["keep_matmuls"][SDPA] == counts["false"][SDPA]
    for field in ("loss", "grad_norm"):
        assert [r[field] for r in rows["keep_matmuls"]] == [r[field] for r in rows["true"]]


class AttentionBlock(torch.nn.Module):
    def __init__(self, width: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.out = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self.qkv(x).view(batch, seq, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        mask = torch.ones(seq, seq, dtype=torch.bool, device=x.device).tril()
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return x + self.out(o.transpose(1, 2).reshape(batch, seq, width)).relu()


@pytest.mark.parametrize(
    ("mode", "attention_calls", "matmul_calls"),
    [("full", 2, 2 + 4 + 2), ("keep_attention", 1, 2 + 4 + 2), ("keep_matmuls", 1, 2 + 4)],
)
def test_compiled_checkpointed_layers_keep_attention_too(mode, attention_calls, matmul_calls):
    """Under torch.compile the policy decides the partition: full checkpointing reruns the
    attention forward in the backward graph, keep_attention saves it, keep_matmuls saves the
    two projections' GEMMs too (aot_eager: the graphs' ops dispatch, so they can be counted:
    2 forward GEMMs, 4 in the backward's gradients, 2 more where the backward reruns them)."""
    from turbo_dllm.train.distributed import apply_activation_checkpointing

    torch.manual_seed(0)
    layers = torch.nn.ModuleList([AttentionBlock()])
    apply_activation_checkpointing(
        layers, keep_attention=mode == "keep_attention", keep_matmuls=mode == "keep_matmuls"
    )
    layers[0].compile(backend="aot_eager", dynamic=False)
    x = torch.randn(2, 32, 64, requires_grad=True)
    mm, addmm = torch.ops.aten.mm.default, torch.ops.aten.addmm.default
    with CountOps(SDPA, mm, addmm) as count:
        layers[0](x).square().sum().backward()
    assert count.counts[SDPA] == attention_calls
    assert count.counts[mm] + count.counts[addmm] == matmul_calls


def test_an_unknown_checkpointing_mode_is_refused():
    from turbo_dllm.errors import DllmError

    with pytest.raises((DllmError, ValueError), match="activation_checkpointing"):
        tiny_spec("training.activation_checkpointing=keep_everything")


# A layer-like block (a norm, a projection, our op) over a tiny plan, for the children below.
BLOCK = r"""
import sys, torch
from turbo_dllm.kernels.block_diffusion import (
    FORWARD_OPS, block_diffusion_attention, plan_block_diffusion_attention)
from turbo_dllm.kernels.triton_ops import triton_module
from turbo_dllm.train.distributed import apply_activation_checkpointing

module = triton_module("block_diffusion_attention", "jit")
TINY = module.KernelConfig(fwd_m=16, fwd_n=32, dkdv_m=32, dkdv_n=16, dq_m=16, dq_n=16)
S, H, D = 64, 2, 64
noisy = torch.arange(S) < 32
block = torch.arange(S) % 32 // 16
doc = torch.zeros(1, S, dtype=torch.long)
plan = plan_block_diffusion_attention(noisy, block, doc, noisy, block, doc, backend="jit", config=TINY)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(H * D, 3 * H * D).half()

    def forward(self, x):
        normed = x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).half()
        q, k, v = self.qkv(normed).view(1, S, 3, H, D).permute(2, 0, 3, 1, 4)
        out, _ = block_diffusion_attention(q, k, v, plan)
        return x + out.transpose(1, 2).reshape(1, S, H * D)
"""

CHILD = (
    BLOCK
    + r"""
from torch.utils._python_dispatch import TorchDispatchMode


class Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += func in FORWARD_OPS
        return func(*args, **(kwargs or {}))


torch.manual_seed(0)
x0 = torch.randn(1, S, H * D).half()
results = {}
for mode in ("none", "full", "keep"):
    torch.manual_seed(1)
    layers = torch.nn.ModuleList([Block()])
    if mode != "none":
        apply_activation_checkpointing(layers, keep_attention=mode == "keep")
    x = x0.clone().requires_grad_()
    with Count() as count:
        layers[0](x).float().square().sum().backward()
    results[mode] = (count.n, x.grad.clone())
assert len(FORWARD_OPS) == 1, FORWARD_OPS
print("calls", results["none"][0], results["full"][0], results["keep"][0])
assert torch.equal(results["keep"][1], results["full"][1])
assert torch.equal(results["keep"][1], results["none"][1])
"""
)


def test_keep_attention_keeps_our_triton_op_outputs():
    pytest.importorskip("triton")
    calls = run_in_triton_interpreter(CHILD).split("calls")[-1].split()
    assert calls == ["1", "2", "1"]  # none, full checkpointing, keep_attention


COMPILED_CHILD = (
    BLOCK
    + r"""
import torch._dynamo
from torch._dynamo.utils import counters

# Every mode named on the command line, in this one process: dynamo's caches and counters are
# reset before each, so each mode's first call traces afresh, as in a process of its own.
for mode in sys.argv[1:]:
    torch._dynamo.reset()
    counters.clear()
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm.print_readable(print_output=False))
        return gm.forward

    layers = torch.nn.ModuleList([Block()])
    if mode != "none":
        apply_activation_checkpointing(layers, keep_attention=mode == "keep")
    layers[0].compile(backend=record, dynamic=False)
    x = torch.randn(1, S, H * D).half().requires_grad_()
    layers[0](x).float().square().sum().backward()
    print(mode, "graphs", len(graphs), "breaks", sum(counters["graph_break"].values()))
    print(mode, "traced", any("rsqrt" in g and "block_diffusion_attention" in g for g in graphs))
"""
)


CHECKPOINTING = ("none", "full", "keep")


@pytest.fixture(scope="module")
def compiled_child() -> str:
    """The compiled child's output for every checkpointing mode: one process (torch, Triton and
    the interpreter set up once) instead of one per mode."""
    pytest.importorskip("triton")
    return run_in_triton_interpreter(COMPILED_CHILD, *CHECKPOINTING)


@pytest.mark.parametrize("checkpointing", CHECKPOINTING)
def test_a_compiled_layer_traces_our_op_in_one_graph(checkpointing, compiled_child):
    """The op's first call inside a compiled (checkpointed) layer traces without a graph break:
    a break in a checkpointed region makes dynamo run the whole layer eagerly (every norm and
    RoPE its own kernel: 0.8x of flex's step at 32K on the H200 before the plan registered the
    op and flattened its arguments)."""
    stdout = compiled_child
    lines = stdout.splitlines()
    assert f"{checkpointing} graphs 1 breaks 0" in lines, stdout
    assert f"{checkpointing} traced True" in lines, stdout
