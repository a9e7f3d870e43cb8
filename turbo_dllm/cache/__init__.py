"""Compile-cache packs: what `torch.compile` built for a run, carried to another machine.

A cold first step of the 1.7B recipe spends ~3 minutes in inductor and Triton on an H200; with
the caches of an earlier run it takes seconds. A pack is those caches (`<compile cache>/inductor`
and `/triton`, see `turbo_dllm.train.compile_cache`) as a content-addressed, hash-verified
`.tar.zst`, keyed by what decides whether they can be reused: torch, Triton, Python, CUDA, GPU
architectures, platform, and the compile-relevant part of the RunSpec.

Modules: `key` (the pack key, its fit rule and the spec digest), `packs` (pack.json, making,
verified extraction, the installed-pack records), `warm` (run a spec's first step to fill fresh
caches). Importing any of them imports no torch.
"""

__all__: list[str] = []
