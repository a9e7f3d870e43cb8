"""A tiny CPU torch.compile run, as a training run would do it: point inductor and Triton at the
dllm compile cache, compile, print torch's cache counters as JSON on the last line."""

import json

from turbo_dllm.train.compile_cache import use_compile_cache

if __name__ == "__main__":
    use_compile_cache()
    import torch
    from torch._dynamo.utils import counters

    def step(x, w):
        return torch.nn.functional.silu(x @ w).sum(-1)

    out = torch.compile(step)(torch.randn(8, 16), torch.randn(16, 16))
    assert out.shape == (8,)
    print(json.dumps({k: dict(counters[k]) for k in ("inductor", "aot_autograd")}))
