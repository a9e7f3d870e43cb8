"""Per-kernel GPU time of block_diffusion_attention's backward, with dS kept (config.dkdv_ds) and
recomputed, at the attention benchmark's shapes (H 16, Hkv 8, D 128, block 32, batch x 2L = 64K)."""

import json
import os
from dataclasses import replace

import torch
from torch.profiler import ProfilerActivity, profile

from turbo_dllm.kernels.selftest import block_diffusion_tokens
from turbo_dllm.kernels.triton_ops import triton_module

module = triton_module("block_diffusion_attention", "jit")
result = {}
for two_l in (16384, 8192):
    batch = 65536 // two_l
    meta = [t.cuda() for t in block_diffusion_tokens(two_l // 2, 32, 1, None)]
    schedule = module.make_schedule(*meta, *meta)
    gen = torch.Generator(device="cuda").manual_seed(0)

    q, k, v, go = (
        torch.randn(batch, two_l, heads, 128, device="cuda", generator=gen)
        .bfloat16()
        .transpose(1, 2)
        for heads in (16, 8, 8, 16)
    )
    ds = module.default_config(128)
    configs = {"ds": replace(ds, dkdv_ds=1), "recompute": replace(ds, dkdv_ds=0)}
    out, lse = module.forward(q, k, v, schedule, None, ds)
    for name, config in configs.items():
        schedule.prepare(config)
        for _ in range(3):
            module.backward(go, None, q, k, v, out, lse, schedule, None, config)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                module.backward(go, None, q, k, v, out, lse, schedule, None, config)
            torch.cuda.synchronize()
        kernels = {}
        for e in prof.key_averages():
            if e.device_type.name == "CUDA" and e.self_device_time_total > 0:
                kernels[e.key[:60]] = round(e.self_device_time_total / 1000 / 10, 3)
        result[f"{two_l} {name}"] = kernels
        print(two_l, name, json.dumps(kernels), flush=True)
json.dump(result, open(os.path.join(os.environ.get("OUT", "."), "ds_profile.json"), "w"), indent=1)
