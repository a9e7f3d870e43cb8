"""A tiny CPU torch.compile run, as a training run would do it: point inductor and Triton at the
dllm compile cache, compile, print torch's cache counters as JSON on the last line."""

import json
import sys

from turbo_dllm.train.compile_cache import use_compile_cache

if __name__ == "__main__":
    device = sys.argv[1] if len(sys.argv) > 1 else "cpu"  # cuda: Triton kernels too
    use_compile_cache()
    import torch
    from torch._dynamo.utils import counters

    def step(x, w):
        return torch.nn.functional.silu(x @ w).sum(-1)

    x, w = torch.randn(8, 16, device=device), torch.randn(16, 16, device=device)
    out = torch.compile(step)(x, w)
    assert out.shape == (8,)
    print(json.dumps({k: dict(counters[k]) for k in ("inductor", "aot_autograd")}))
