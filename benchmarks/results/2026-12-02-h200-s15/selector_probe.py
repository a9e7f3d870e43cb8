"""H200 probe (session 15): the DFlash2 selector loss's backward, codebook rows looked up by
indexing (before) and by `embedding` (after), at the speculative benchmark's shape: 16 rows x
256 anchors x 7 scored slots, top-8 candidates, rank 64, hidden 1024, vocabulary 260. CUDA
events, median of 20 after 5 warm-up: selector_probe.txt."""

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from turbo_dllm.families.dflash.hard_labels import selector_loss  # noqa: E402
from turbo_dllm.families.dflash.model import CandidateSelector  # noqa: E402


class Config:
    vocab_size, selector_rank, hidden_size = 260, 64, 1024


def indexed(self, hidden, predecessors, candidates):  # the code before this session's change
    query = self.predecessor_codebook[predecessors] * self.hidden_projection(hidden)
    return torch.einsum("nr,nkr->nk", query.float(), self.successor_codebook[candidates].float())


def timed(fn) -> float:
    times = []
    if device.type == "cpu":  # a plumbing check only
        start = time.perf_counter()
        fn()
        return 1e3 * (time.perf_counter() - start)
    for i in range(25):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        if i >= 5:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
g = torch.Generator(device=device).manual_seed(0)
n, k, h, v = 16 * 256 * 7, 8, 1024, 260
selector = CandidateSelector(Config()).to(device)
for p in selector.parameters():
    torch.nn.init.normal_(p, std=0.02)
head = torch.randn(v, h, device=device, dtype=torch.bfloat16) * 0.02
hidden = torch.randn(n, h, device=device, dtype=torch.bfloat16, requires_grad=True)
targets = torch.randint(0, v, (n,), device=device, generator=g)
predecessors = torch.randint(0, v, (n,), device=device, generator=g)
candidates = torch.randint(0, v, (n, k), device=device, generator=g)
candidates[:, 0] = targets  # every gold token a candidate
weights = torch.rand(n, device=device, generator=g)


def step():
    with torch.autocast(device.type, dtype=torch.bfloat16):
        loss = selector_loss(
            hidden, hidden, head, selector, predecessors, targets, candidates, weights, None
        )
    loss.backward()


grads = {}
for name, fn in (("indexing", indexed), ("embedding", CandidateSelector.pair_scores)):
    CandidateSelector.pair_scores = fn
    ms = timed(step)
    hidden.grad = None
    for p in selector.parameters():
        p.grad = None
    step()
    grads[name] = [hidden.grad.clone(), *(p.grad.clone() for p in selector.parameters())]
    print(f"{name}: selector loss forward + backward {ms:.2f} ms", flush=True)
same = all(
    torch.allclose(a.float(), b.float(), rtol=1e-2, atol=1e-4)
    for a, b in zip(grads["indexing"], grads["embedding"], strict=True)
)
print(f"gradients agree: {same}")
