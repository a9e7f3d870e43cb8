"""Training-step throughput of the turbo-dllm trainer against HF transformers + a dense 2L mask.

Both sides train the same Qwen3-shaped random model on the same block-diffusion batches
(BD3-LM noise from our objective, sequence length L, block size B), in bf16 on a GPU:

- turbo-dllm: the real trainer step (`Trainer.train_step`): FlexAttention over the block-diffusion
  BlockMask, compiled decoder layers, chunked LM-head cross-entropy on the masked tokens only,
  fused AdamW.
- baseline (what most dLLM repos do): transformers' Qwen3ForCausalLM with attn_implementation
  "sdpa" and the dense 2L x 2L boolean mask as a 4-D attention_mask, full logits over all 2L
  positions, cross-entropy on the masked noisy tokens, fused AdamW. If it runs out of memory it
  is retried with transformers' gradient checkpointing (reported).

Tokens/s counts data tokens (L per sequence). MFU counts model FLOPs (turbo_dllm.train.metrics:
6 * matmul weights * 2L tokens + 6 * head * scored tokens + 12 * head_dim * heads * layers *
allowed mask pairs) against 989 TFLOP/s (H100/H200 dense bf16). The same FLOP count is used for
both sides, so the MFU ratio equals the speed ratio.

    python benchmarks/train_step.py                       # Qwen3-1.7B shape, L=8192, B=32 (GPU)
    python benchmarks/train_step.py --tiny                # CPU smoke check, seconds
    python benchmarks/train_step.py --out result.json --steps 10 --warmup 3

Other families (`--family`):

- `qwen3_8`: the Qwen3.8-27B layer shapes with 8 layers (`qwen3.8-27b-8l`), Fast-dLLM v2
  batches, L=4096, B=64; ours runs the linear layers with fla's chunk kernel and the state
  capture. Baseline: transformers' Qwen3_5ForCausalLM on the same 2L stream (its full-attention
  layers get the dense mask; its linear layers run the stream causally, with fla when installed:
  the same work, though not the block-diffusion semantics), full logits, the same CE.
- `nemotron_diffusion`: the Nemotron-3B layer shapes with 8 layers, block diffusion; the
  baseline is our own decoder family (`causal_lm`) with the same shapes, so the ratio is what
  Nemotron's attention variants cost.
- `diffusion_gemma`: a DiffusionGemma-like MoE (`h200-bench`: 8 layers, 64 experts top-8,
  ~3.1B total / ~1.1B active parameters), native SFT, block 256, activation checkpointing; MFU
  over active-parameter FLOPs; the experts' grouped GEMM is reported. Baseline: transformers'
  DiffusionGemmaForBlockDiffusion on the same batches the way HF runs it: the encoder over the
  clean sequence (its KV in a cache, the next-token loss from its hidden states), then the
  decoder over the whole canvas against that cache with the canvas masks as 4-D masks per layer
  type, full soft-capped logits (`hf_gemma_loss`, tested equal to our loss on the same weights).
  Self-conditioning is off on both sides (HF takes it as full logits). HF runs first (it
  compiles nothing, so its numbers are in even if ours' cold compile outlasts a GPU call) and
  checkpoints its decoder layers as ours does (`--baseline-no-checkpointing`: first without).
  2 warm-up and 4 timed steps by default; every phase (build, the compiling first step, each
  step, HF's build and steps) prints its time, a heartbeat while it runs and, past 2 minutes,
  every thread's Python stack (`Progress`), so a cold GPU run is never silent.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import gc
import importlib.metadata
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch._inductor.config
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from turbo_dllm.config.runspec import RunSpec  # noqa: E402
from turbo_dllm.config.validate import check  # noqa: E402
from turbo_dllm.families.base import hf_cache_argument  # noqa: E402
from turbo_dllm.train.attention import allowed_pairs, dense_mask  # noqa: E402
from turbo_dllm.train.distributed import init_distributed  # noqa: E402
from turbo_dllm.train.metrics import peak_flops  # noqa: E402
from turbo_dllm.train.parallel.plan import model_work  # noqa: E402
from turbo_dllm.train.trainer import Trainer  # noqa: E402

# family -> (default preset, tiny preset, objective, vocabulary of the default preset)
FAMILY_DEFAULTS = {
    "qwen3": ("qwen3-1.7b", "tiny", "block_diffusion", 151936),
    "qwen3_8": ("qwen3.8-27b-8l", "tiny", "fast_dllm_v2", 248320),
    "nemotron_diffusion": ("nemotron-3b-8l", "tiny", "block_diffusion", 131072),
    "diffusion_gemma": ("h200-bench", "tiny", "diffusiongemma_sft", 262144),
}


def build_spec(
    args,
    on_gpu: bool,
    family: str | None = None,
    model: str | None = None,
    attention: str = "flex",
    vocab_size: int | None = None,
) -> RunSpec:
    """Our RunSpec; `attention` is ours on the GPU (flex or turbo; the CPU runs reference);
    `vocab_size`: the synthetic data's, where `model` is not the family's default preset."""
    family = family or args.family
    preset, tiny, objective, vocab = FAMILY_DEFAULTS.get(family, FAMILY_DEFAULTS["qwen3"])
    vocab = vocab_size or vocab
    model_section = {
        "family": family,
        "from_config": model or args.model or (tiny if args.tiny else preset),
        "dtype": "bfloat16" if on_gpu else "float32",
        "attention": attention if on_gpu else "reference",
    }
    objective = getattr(args, "objective", None) or objective
    objective_section = {"name": objective, "block_size": args.block_size}
    if objective == "autoregressive":  # token-causal: blocks of one token
        del objective_section["block_size"]
    if family == "qwen3_8":
        model_section["linear_attention"] = "fla" if on_gpu and _fla_trains_here() else "torch"
    if family == "nemotron_diffusion":
        # The preset's own block size and mask token (the family's rules ask for them).
        objective_section["mask_token_id"] = 100
        # With every attention variant on, so the ratio to the plain decoder is their cost.
        model_section["config_overrides"] = {
            "block_size": args.block_size,
            "qk_norm": True,
            "v_norm": True,
            "attn_output_gate": True,
        }
    if family == "diffusion_gemma":  # HF takes self-conditioning as full logits: off on both
        objective_section["self_conditioning_probability"] = 0.0
    document = {
        "launch": {"seed": 0, "kind": "profile"},
        "model": model_section,
        "objective": objective_section,
        "data": {
            "synthetic": {"num_sequences": 64, "vocab_size": 512 if args.tiny else vocab},
            "seq_len": args.seq_len,
        },
        "training": {
            "micro_batch_size": args.micro_batch,
            # (+ the profiled steps: the trainer draws batches ahead only within its run)
            "steps": args.warmup + args.steps + (2 if getattr(args, "profile", None) else 0),
            # (the native SFT's own choice for DiffusionGemma)
            "activation_checkpointing": args.activation_checkpointing
            or family == "diffusion_gemma",
            "compile": on_gpu and not args.no_compile,
        },
        "scheduler": {"name": "constant", "warmup_steps": 0},
        "checkpoint": {"interval": None, "resume": "never"},
        "logging": {"console": False, "jsonl": False},
    }
    if model_section["attention"] == "turbo":  # the bundle's op, or the same source (jit)
        document["kernels"] = args.kernels
    if getattr(args, "mlp_chunks", 1) > 1:
        document["training"]["mlp_chunks"] = args.mlp_chunks
    return check(RunSpec.model_validate(document))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        # Before the first allocation the allocator holds no state for the device and
        # resetting its stats raises "Invalid device argument" (the baseline can run first).
        torch.cuda.init()
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_gb(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else None


def summarize(name, times, flops_per_step, tokens_per_step, peak, device, extra=None) -> dict:
    step_time = sorted(times)[len(times) // 2]  # median
    result = {
        "name": name,
        "step_time_s": step_time,
        "tokens_per_s": tokens_per_step / step_time,
        "tflops_per_s": flops_per_step / step_time / 1e12,
        "mfu": flops_per_step / step_time / peak if peak else None,
        "peak_memory_gb": peak_gb(device),
    }
    result.update(extra or {})
    return result


# ---------------------------------------------------------------------------------------------
def _ours_name(attentions: list[str], index: int) -> str:
    return "turbo-dllm" if len(attentions) == 1 else f"turbo-dllm ({attentions[index]})"


def run_ours(spec: RunSpec, args, device, name: str = "turbo-dllm") -> tuple[dict, Trainer]:
    env = init_distributed()
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(spec, run_dir, env).build()
        if getattr(args, "no_stream_trim", False):
            trainer.plan.trims = frozenset()
        if getattr(args, "float8", None):
            float8_layers(trainer, args.float8)
        reset_memory(device)
        times, flops = [], []
        for step in range(args.warmup):
            sync(device)
            tick = time.perf_counter()
            stats = trainer.train_step(step)
            print(
                f"  ours step {step}: {time.perf_counter() - tick:.3f} s, loss {stats['loss']:.3f}",
                file=sys.stderr,
            )
        if getattr(args, "pipelined", False):
            times, flops = pipelined_steps(trainer, args.warmup, args.steps, device)
        for step in range(args.warmup, args.warmup + (0 if times else args.steps)):
            sync(device)
            tick = time.perf_counter()
            stats = trainer.train_step(step)
            sync(device)
            times.append(time.perf_counter() - tick)
            flops.append(stats["flops"])
            print(
                f"  ours step {step}: {time.perf_counter() - tick:.3f} s, loss {stats['loss']:.3f}",
                file=sys.stderr,
            )
        if args.profile:
            profile_steps(trainer, args.warmup + args.steps, args.profile, device)
    tokens = spec.training.micro_batch_size * spec.data.seq_len
    result = summarize(
        name,
        times,
        sum(flops) / len(flops),
        tokens,
        peak_flops(device),
        device,
        {
            "compile": spec.training.compile,
            "attention": spec.model.attention,
            "kernels": spec.kernels if spec.model.attention == "turbo" else None,
            "activation_checkpointing": spec.training.activation_checkpointing,
            "mlp_chunks": spec.training.mlp_chunks,
            "linear_attention": spec.model.linear_attention,
            "micro_batch": spec.training.micro_batch_size,
        },
    )
    return result, trainer


def float8_layers(trainer: Trainer, recipe: str) -> None:
    """An experiment: the decoder layers' linear layers as torchao Float8Linear (`recipe`:
    tensorwise, rowwise, ...), the LM head left in bf16. Swapped before the first step, so the
    layers' in-place compile traces the float8 matmuls."""
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as exc:
        raise SystemExit(f"--float8 needs torchao (pip install torchao): {exc}") from None

    config = Float8LinearConfig.from_recipe_name(recipe)
    for layer in trainer.model.model.layers:
        convert_to_float8_training(layer, config=config)


def pipelined_steps(trainer: Trainer, first: int, count: int, device) -> tuple[list, list]:
    """`count` steps as `Trainer.run` takes them: step N's numbers read once step N + 1 is
    queued, no wait in between; each step's time is the run's wall time over `count` (the same
    for all), the FLOPs each step's own."""
    sync(device)
    tick = time.perf_counter()
    queued, results = None, []
    for step in range(first, first + count):
        latest = trainer.queue_step(step)
        if queued is not None:
            results.append(queued.result())
        queued = latest
    results.append(queued.result())
    sync(device)
    per_step = (time.perf_counter() - tick) / count
    for step, stats in enumerate(results, first):
        print(f"  ours step {step}: {per_step:.3f} s (pipelined), loss {stats['loss']:.3f}",
              file=sys.stderr)  # fmt: skip
    return [per_step] * count, [stats["flops"] for stats in results]


def profile_steps(trainer: Trainer, first_step: int, path: Path, device) -> None:
    """Two more steps under torch.profiler: the kernels by GPU time, and how busy the GPU was."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync(device)
    tick = time.perf_counter()
    with profile(activities=activities) as prof:
        for step in range(first_step, first_step + 2):
            trainer.train_step(step)
        sync(device)
    wall = time.perf_counter() - tick
    kernels, busy = gpu_busy(prof)
    gaps = "\n".join(
        f"  {gap * 1e3:8.3f} ms idle after {before[:70]} -> before {after[:70]}"
        for gap, before, after in gpu_gaps(prof)
    )
    sort_by = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=sort_by, row_limit=40, max_name_column_width=90)
    path.write_text(
        f"2 steps: wall {wall:.3f} s, GPU kernels {kernels:.3f} s, GPU busy {busy:.3f} s "
        f"(idle {wall - busy:.3f} s)\n\nlongest GPU idle gaps between kernels:\n{gaps}\n\n"
        f"{table}\n"
    )
    trace = path.with_suffix(".trace.json.gz")  # the timeline (chrome://tracing, Perfetto)
    prof.export_chrome_trace(str(trace))
    print(f"profile: wall {wall:.3f} s, GPU busy {busy:.3f} s -> {path}, {trace}", file=sys.stderr)


def gpu_busy(prof) -> tuple[float, float]:
    """(seconds of GPU kernels summed, seconds the GPU ran at least one): where the two differ
    kernels overlapped; where the second falls short of the wall time the GPU idled."""
    from torch.autograd import DeviceType

    spans = sorted(
        (e.time_range.start, e.time_range.end)
        for e in prof.events()
        if e.device_type == DeviceType.CUDA
    )
    total = sum(end - start for start, end in spans)
    busy, reach = 0.0, float("-inf")
    for start, end in spans:
        if end > reach:
            busy += end - max(start, reach)
            reach = end
    return total / 1e6, busy / 1e6


def gpu_gaps(prof, top: int = 12) -> list[tuple[float, str, str]]:
    """The `top` longest stretches (seconds) where no GPU kernel ran, longest first, each with
    the kernel that ended before it and the one that started after it: where the GPU waits
    (a host sync, launch latency) inside the profiled steps."""
    from torch.autograd import DeviceType

    kernels = sorted(
        (e.time_range.start, e.time_range.end, e.name)
        for e in prof.events()
        if e.device_type == DeviceType.CUDA
    )
    gaps, reach, last = [], None, ""
    for start, end, name in kernels:
        if reach is not None and start > reach:
            gaps.append(((start - reach) / 1e6, last, name))
        if reach is None or end > reach:
            reach, last = end, name
    return sorted(gaps, key=lambda gap: -gap[0])[:top]


class Progress:
    """A phase that can take minutes on a cold GPU (building, compiling, the first step) says so.

    While the `with` block runs, a background thread prints `phase: still running after N s`
    every `every` seconds, and after `stacks_after` seconds (then as often again) every thread's
    Python stack (faulthandler), so a slow run shows where it is instead of nothing. `announce`:
    also a line when the phase starts and one with its time when it ends (else the caller
    prints `seconds`).
    """

    def __init__(
        self, phase: str, every: float = 20.0, stacks_after: float = 120.0, announce: bool = True
    ) -> None:
        self.phase, self.every, self.stacks_after = phase, every, stacks_after
        self.announce = announce
        self.seconds = 0.0

    def __enter__(self) -> Progress:
        import faulthandler
        import threading

        self._start = time.perf_counter()
        self._done = threading.Event()
        if self.announce:
            print(f"  {self.phase} ...", file=sys.stderr, flush=True)

        def beat() -> None:
            while not self._done.wait(self.every):
                elapsed = time.perf_counter() - self._start
                print(
                    f"  {self.phase}: still running after {elapsed:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )

        self._thread = threading.Thread(target=beat, daemon=True)
        self._thread.start()
        try:
            faulthandler.dump_traceback_later(self.stacks_after, repeat=True, file=sys.stderr)
        except (OSError, ValueError):  # a captured stderr (pytest) has no file descriptor
            pass
        return self

    def __exit__(self, *exc) -> None:
        import faulthandler

        faulthandler.cancel_dump_traceback_later()
        self._done.set()
        self._thread.join()
        self.seconds = time.perf_counter() - self._start
        if self.announce or exc[0] is not None:
            state = "failed" if exc[0] is not None else "done"
            print(f"  {self.phase}: {state} in {self.seconds:.1f} s", file=sys.stderr, flush=True)


def run_gemma_ours(spec: RunSpec, args, device, name: str = "turbo-dllm") -> tuple[dict, Trainer]:
    """`run_ours` for DiffusionGemma, with every phase timed and never silent (`Progress`):
    the build (meta model, weights initialised on the device), the first step (compiles), each
    timed step."""
    env = init_distributed()
    with tempfile.TemporaryDirectory() as run_dir:
        with Progress("ours: build (meta model, init on the device, optimizer)") as build:
            trainer = Trainer(spec, run_dir, env).build()
            sync(device)
        reset_memory(device)
        times, flops, first = [], [], None
        for step in range(args.warmup + args.steps):
            label = f"ours step {step}" + (" (the first: compiles)" if step == 0 else "")
            with Progress(label, every=20.0 if step == 0 else 10.0, announce=step == 0) as timer:
                stats = trainer.train_step(step)
                sync(device)
            first = timer.seconds if step == 0 else first
            if step >= args.warmup:
                times.append(timer.seconds)
                flops.append(stats["flops"])
            print(
                f"  ours step {step}: {timer.seconds:.3f} s, loss {stats['loss']:.3f}",
                file=sys.stderr,
                flush=True,
            )
        if args.profile:
            profile_steps(trainer, args.warmup + args.steps, args.profile, device)
    result = summarize(
        name,
        times,
        sum(flops) / len(flops),
        spec.training.micro_batch_size * spec.data.seq_len,
        peak_flops(device),
        device,
        {
            "compile": spec.training.compile,
            "attention": spec.model.attention,
            "activation_checkpointing": spec.training.activation_checkpointing,
            "mlp_chunks": spec.training.mlp_chunks,
            "micro_batch": spec.training.micro_batch_size,
            "build_s": build.seconds,
            "first_step_s": first,
        },
    )
    return result, trainer


def grouped_gemm_in_use(trainer: Trainer, device) -> str | None:
    """Which grouped GEMM DiffusionGemma's experts run in this benchmark's dtype."""
    from turbo_dllm.families.diffusion_gemma.experts import grouped_gemm_kind

    experts = [m for m in trainer.model.modules() if hasattr(m, "gate_up_proj")]
    if not experts:
        return None
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    weight = experts[0].gate_up_proj
    weight = weight.to_local() if hasattr(weight, "to_local") else weight
    rows = torch.zeros(1, weight.shape[-1], device=device, dtype=dtype)
    return grouped_gemm_kind(rows, weight.to(dtype))


def hf_gemma_loss(model, ours, objective, batch, key, device):
    """The native-SFT loss of one micro-batch through transformers' model (see the top)."""
    import transformers

    d = objective.corrupt(batch, key)
    layout, C = d.layout, d.layout.canvas_len
    cap = ours.final_logit_softcapping
    d = d.to(device)
    rows = d.input_ids.shape[0]
    x_t, x0 = d.input_ids[:, :C], d.input_ids[:, C:]
    masks = {}
    for kind in sorted(set(ours.layer_types)):  # canvas rows; keys [cached clean ; canvas]
        dense = layout.with_window(ours.window(kind)).dense_mask(device)[:, :, :C]
        masks[kind] = torch.cat([dense[..., C:], dense[..., :C]], -1).expand(rows, -1, -1, -1)
    cache = transformers.DynamicCache()  # keeps every clean key (the masks do the windows)
    encoder, decoder = model.model.encoder, model.model.decoder
    encoded = encoder(input_ids=x0, **{hf_cache_argument(type(encoder).forward): cache})
    decoded = decoder(
        decoder_input_ids=x_t,
        **{hf_cache_argument(type(decoder).forward): cache},
        decoder_attention_mask=masks,
        decoder_position_ids=layout.positions(device)[:C].expand(rows, -1),
    )
    hidden = torch.cat([decoded.last_hidden_state, encoded.last_hidden_state], 1)
    logits = model.lm_head(hidden).float()
    logits = (torch.tanh(logits / cap) * cap).reshape(-1, ours.vocab_size)
    sums, start = [], 0
    for size in d.term_sizes:
        part = slice(start, start + size)
        ce = F.cross_entropy(
            logits.index_select(0, d.score_index[part]), d.targets[part], reduction="none"
        )
        sums.append((ce * d.weights[part]).sum())
        start += size
    counts = torch.tensor(objective.supervised_count(batch), device=device, dtype=torch.float32)
    return (torch.stack(sums) / counts).sum(), d


def gemma_inputs(spec: RunSpec):
    """What the HF baseline takes from a trainer (model config, objective, a fresh loader of
    the same batches), without building our model: the baseline runs first (below)."""
    from types import SimpleNamespace

    from turbo_dllm.registry import resolve_model_config
    from turbo_dllm.train.data import build_data
    from turbo_dllm.train.objectives import build_objective

    config = resolve_model_config(spec.model)
    data = build_data(spec, model_vocab_size=config.vocab_size, dp_rank=0, dp_size=1)
    objective = build_objective(spec.objective, data.mask_token_id, vocab_size=config.vocab_size)
    return SimpleNamespace(model_config=config, objective=objective, loader=data.loader)


def run_gemma_baseline(trainer: Trainer, spec: RunSpec, args, device) -> dict:
    """transformers' DiffusionGemmaForBlockDiffusion on the same kind of batches (see the top)."""
    import transformers

    from turbo_dllm.train.objectives import NoiseKey

    ours = trainer.model_config
    hf_dict = ours.to_hf_dict()
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    hf_config = transformers.DiffusionGemmaConfig(
        text_config=hf_dict["text_config"],
        vision_config=hf_dict.get("vision_config"),
        canvas_length=hf_dict["canvas_length"],
    )
    _free_ours(trainer)  # free ours before building theirs
    reset_memory(device)
    torch.manual_seed(0)
    with Progress("baseline: build transformers' model on the device"):
        with torch.device(device):
            model = transformers.DiffusionGemmaForBlockDiffusion._from_config(
                hf_config, attn_implementation="sdpa", dtype=dtype
            )
        sync(device)
    model.train()
    # Ours checkpoints activations (the native SFT's choice), so HF does too from the start: at
    # 8K its full logits and dense masks alone fill much of the GPU, and an out-of-memory first
    # try followed by a checkpointed retry costs minutes of GPU time.
    # (transformers 5 renamed it; the old name warns)
    enable_checkpointing = getattr(
        model, "activation_checkpointing_enable", model.gradient_checkpointing_enable
    )
    checkpointing = not args.baseline_no_checkpointing
    if checkpointing:
        enable_checkpointing()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=3e-4, weight_decay=0.1, fused=device.type == "cuda" or None
    )
    objective, loader = trainer.objective, trainer.loader
    samples = args.baseline_micro_batch or spec.training.micro_batch_size
    name = "hf-diffusiongemma"

    def step(index: int) -> tuple[float, float]:
        batch = {key: rows[:samples] for key, rows in next(loader).items()}
        loss, d = hf_gemma_loss(
            model, ours, objective, batch, NoiseKey(0, index, 0, samples), device
        )
        flops = ours.step_flops(
            stream_tokens=d.input_ids.numel(),
            scored_tokens=d.num_scored,
            pairs=allowed_pairs(d.layout) * d.input_ids.shape[0],
        )
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach()), flops

    for attempt in range(2):
        try:
            reset_memory(device)
            times, flops = [], []
            for index in range(args.warmup + args.steps):
                with Progress(f"baseline step {index}", every=10.0, announce=False) as timer:
                    loss, f = step(index)
                    sync(device)
                if index >= args.warmup:
                    times.append(timer.seconds)
                    flops.append(f)
                print(
                    f"  baseline step {index}: {timer.seconds:.3f} s, loss {loss:.3f}",
                    file=sys.stderr,
                    flush=True,
                )
            break
        except torch.cuda.OutOfMemoryError:
            if attempt == 1 or checkpointing:
                return {"name": name, "error": "out of memory even with checkpointing"}
            print(
                "  baseline ran out of memory; retrying with gradient checkpointing",
                file=sys.stderr,
            )
            optimizer.zero_grad(set_to_none=True)
            enable_checkpointing()
            checkpointing = True
    return summarize(
        name,
        times,
        sum(flops) / len(flops),
        samples * spec.data.seq_len,
        peak_flops(device),
        device,
        {"gradient_checkpointing": checkpointing, "micro_batch": samples},
    )


# Baselines of the qwen3 families: transformers' model with the block-diffusion mask as HF takes it.
# dense: the (2L x 2L) boolean mask as a 4-D attention_mask under sdpa; hf-flex: the same mask as
# a FlexAttention BlockMask (ours, built once) under attn_implementation="flex_attention", the
# whole model under torch.compile (the strongest configuration a careful HF user reaches).
HF_BASELINES = {"dense": "hf-sdpa-dense-mask", "hf-flex": "hf-flex-compiled"}


def _free_ours(trainer: Trainer) -> None:
    """Drop our model and optimizer (once) so the baseline has the GPU's memory."""
    for name in ("model", "optimizer", "scheduler"):
        if hasattr(trainer, name):
            delattr(trainer, name)
    torch._dynamo.reset()


def hf_block_diffusion_loss(model, objective, batch, diffusion, mask, device):
    """Full logits over the 2L stream, cross-entropy on the scored (masked noisy) tokens."""
    layout = diffusion.layout
    positions = layout.positions(device).expand(diffusion.input_ids.shape[0], -1)
    logits = model(
        input_ids=diffusion.input_ids, attention_mask=mask, position_ids=positions
    ).logits
    hidden = logits.reshape(-1, logits.shape[-1]).index_select(0, diffusion.score_index).float()
    if diffusion.exclude_index is not None:
        hidden[:, diffusion.exclude_index] = float("-inf")
    return (
        F.cross_entropy(hidden, diffusion.targets, reduction="none") * diffusion.weights
    ).sum() / max(objective.supervised_count(batch), 1)


def hf_mask(kind: str, layout, rows: int, device, hybrid: bool = False):
    """The block-diffusion mask in the form baseline `kind` hands transformers."""
    if kind == "hf-flex":
        from turbo_dllm.train.attention.backends import FlexAttention

        return FlexAttention(compile=device.type == "cuda").prepare(layout, None, device)
    mask = dense_mask(layout, device=device).expand(rows, -1, -1, -1)
    if hybrid:  # per layer kind: the linear layers take no mask (they run causally)
        mask = {"full_attention": mask, "linear_attention": None}
    return mask


def run_baseline(trainer: Trainer, spec: RunSpec, args, device, kind: str = "dense") -> dict:
    import transformers

    config_dict = trainer.model_config.to_hf_dict()
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    hybrid = spec.model.family == "qwen3_8"
    if kind == "hf-flex" and hybrid:
        return {"name": HF_BASELINES[kind], "error": "hf-flex is a qwen3 baseline"}
    if kind == "hf-flex" and device.type != "cuda":  # checked on CPU by the loss test instead
        return {"name": HF_BASELINES[kind], "error": "FlexAttention has no backward on CPU"}
    config_class = transformers.Qwen3_5TextConfig if hybrid else transformers.Qwen3Config
    hf_config = config_class(**{k: v for k, v in config_dict.items() if k != "architectures"})
    linear_kernel = _hf_linear_kernel() if hybrid else None
    _free_ours(trainer)
    reset_memory(device)
    torch.manual_seed(0)
    implementation = "flex_attention" if kind == "hf-flex" else "sdpa"
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(
            hf_config, attn_implementation=implementation, dtype=dtype
        )
    model.train()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=3e-4, weight_decay=0.1, fused=device.type == "cuda" or None
    )
    forward = torch.compile(model) if kind == "hf-flex" else model
    objective, loader = trainer.objective, trainer.loader
    samples = args.baseline_micro_batch or spec.training.micro_batch_size
    masks: dict = {}

    def step(index: int) -> tuple[float, float]:
        from turbo_dllm.train.objectives import NoiseKey

        batch = {name: rows[:samples] for name, rows in next(loader).items()}
        diffusion = objective.corrupt(batch, NoiseKey(0, index, 0, samples))
        layout = diffusion.layout
        # The job's work, counted as for ours (the same count for both sides): where ours skips
        # rows no loss reads (train.attention.trim), HF's extra work is not counted as useful.
        flops = trainer.model_config.step_flops(**model_work(trainer.plan, diffusion))
        diffusion = diffusion.to(device)
        rows = diffusion.input_ids.shape[0]
        if (layout, rows) not in masks:  # one document per row: the same mask every step
            masks[(layout, rows)] = hf_mask(kind, layout, rows, device, hybrid)
        loss = hf_block_diffusion_loss(
            forward, objective, batch, diffusion, masks[(layout, rows)], device
        )
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach()), flops

    checkpointing = False
    for attempt in range(2):
        try:
            reset_memory(device)
            times, flops = [], []
            for index in range(args.warmup + args.steps):
                sync(device)
                tick = time.perf_counter()
                loss, f = step(index)
                sync(device)
                if index >= args.warmup:
                    times.append(time.perf_counter() - tick)
                    flops.append(f)
                print(
                    f"  baseline {kind} step {index}: {time.perf_counter() - tick:.3f} s, "
                    f"loss {loss:.3f}",
                    file=sys.stderr,
                )
            break
        except torch.cuda.OutOfMemoryError:
            if attempt == 1:
                return {
                    "name": HF_BASELINES[kind],
                    "error": "out of memory even with checkpointing",
                }
            print(
                f"  baseline {kind} ran out of memory; retrying with gradient checkpointing",
                file=sys.stderr,
            )
            optimizer.zero_grad(set_to_none=True)
            model.gradient_checkpointing_enable()
            checkpointing = True
            if kind == "hf-flex":  # the compiled graph was traced without checkpointing
                torch._dynamo.reset()
                forward = torch.compile(model)
    tokens = samples * spec.data.seq_len
    return summarize(
        "hf-qwen3_5-sdpa" if hybrid else HF_BASELINES[kind],
        times,
        sum(flops) / len(flops),
        tokens,
        peak_flops(device),
        device,
        {
            "gradient_checkpointing": checkpointing,
            "micro_batch": samples,
            "attn_implementation": implementation,
            "torch_compile": kind == "hf-flex",
            **({"linear_kernel": linear_kernel} if hybrid else {}),
        },
    )


def _hf_linear_kernel() -> str:
    """What transformers' Gated DeltaNet layers run here: fla's kernels where fla is installed and
    trains on this host, its torch chunked form otherwise.

    transformers binds fla's functions when `fla` imports, and fla's gated backward then raises
    where it refuses the host (Hopper with Triton < 3.7.1 without TileLang): there the
    baseline's module-level functions are set back to transformers' own torch references (the
    `functools.wraps` target of its fallback wrapper), as it runs without fla installed.
    """
    import importlib.util

    if importlib.util.find_spec("fla") is None:
        return "torch"
    if torch.cuda.is_available() and _fla_trains_here():
        return "fla"
    from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

    for name in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule"):
        function = getattr(hf, name)
        setattr(hf, name, getattr(function, "__wrapped__", function))
    return "torch"


def decoder_twin_spec(nemotron, spec: RunSpec, args, on_gpu: bool, folder: Path) -> RunSpec:
    """The RunSpec of our decoder family (`causal_lm`) with the shapes of the Nemotron config
    `nemotron` (written to `folder`), on the same batches: the spec's objective and data."""
    path = folder / "config.json"
    path.write_text(json.dumps(nemotron._as_decoder().to_hf_dict()))
    vocab = spec.data.synthetic.vocab_size if spec.data.synthetic else None
    twin = build_spec(args, on_gpu, family="causal_lm", model=str(path), vocab_size=vocab)
    return check(
        RunSpec.model_validate(
            {
                **twin.model_dump(mode="json"),
                "objective": spec.objective.model_dump(mode="json"),
                "data": spec.data.model_dump(mode="json"),  # its vocabulary, not the decoder's
            }
        )
    )


def run_decoder_twin(trainer: Trainer, spec: RunSpec, args, device) -> dict:
    """Our decoder family (`causal_lm`) with the same shapes as the Nemotron model trained."""
    nemotron = trainer.model_config
    _free_ours(trainer)
    reset_memory(device)
    with tempfile.TemporaryDirectory() as folder:
        twin = decoder_twin_spec(nemotron, spec, args, device.type == "cuda", Path(folder))
        result, _ = run_ours(twin, args, device, name="turbo-dllm decoder (same shapes)")
    return result


def _fla_trains_here() -> bool:
    """fla's gated backward where fla accepts this host (not Hopper with Triton < 3.7.1 without
    TileLang); the torch chunked form otherwise, recorded in the results as linear_attention."""
    import importlib.util

    import triton

    from turbo_dllm.families.qwen3_8.gated_delta import fla_problem

    if importlib.util.find_spec("fla") is None:
        return False
    problem = fla_problem(
        triton.__version__,
        torch.cuda.get_device_capability(),
        importlib.util.find_spec("tilelang") is not None,
    )
    if problem:
        print(f"{problem}: timing linear_attention torch instead", file=sys.stderr)
    return problem is None


def context_search(args, argv) -> int:
    """The longest L of --context-search that trains, per attention of --attention.

    One document per sequence (the synthetic data has no document boundaries), so attention is
    quadratic in L, as users train; activation checkpointing and --mlp-chunks as given. Each probe
    is this script in a fresh process (an out-of-memory cannot poison the next one), ours only,
    two steps: the first (cold, compile included) creates AdamW's moments, which the second
    holds through its backward, so the peak is a training run's, not a first step's; lengths
    ascend and a kind stops at its first failure, or when the next probe (the last one's
    start-up plus its steps scaled by (L'/L)^2) would pass its share of --search-budget-s (each
    probe is also killed at that share's end).
    """
    import subprocess

    lengths = sorted(int(x) for x in args.context_search.split(","))
    attentions = args.attention.split(",")
    share = args.search_budget_s / len(attentions)
    steps = 2  # one warm-up (it creates the optimizer's state), one timed
    common = ["--no-baseline", "--steps", "1", "--warmup", str(steps - 1), "--family", args.family]
    common += ["--block-size", str(args.block_size), "--kernels", args.kernels]
    common += ["--mlp-chunks", str(args.mlp_chunks)]
    for flag, on in (("--tiny", args.tiny), ("--no-compile", args.no_compile)):
        common += [flag] if on else []
    if args.activation_checkpointing:
        common.append("--activation-checkpointing")
        if isinstance(args.activation_checkpointing, str):  # a mode's name, not plain True
            common.append(args.activation_checkpointing)
    common += ["--model", args.model] if args.model else []
    common += ["--turbo-config", args.turbo_config] if args.turbo_config else []
    found: dict[str, dict] = {}
    for attention in attentions:
        start, last, probes = time.perf_counter(), None, []
        for length in lengths:
            spent = time.perf_counter() - start
            if last is not None:
                # start-up as measured, the steps scaled like the quadratic attention
                stepping = steps * last["step_time_s"]
                estimate = last["wall_s"] - stepping + stepping * (length / last["seq_len"]) ** 2
                if spent + estimate > share:
                    print(
                        f"  {attention} L={length}: not tried (~{estimate:.0f} s, "
                        f"{share - spent:.0f} s of the budget left)",
                        file=sys.stderr,
                    )
                    probes.append({"seq_len": length, "outcome": "not tried (budget)"})
                    break
            with tempfile.TemporaryDirectory() as folder:
                out = Path(folder) / "probe.json"
                command = [sys.executable, str(Path(__file__).resolve()), *common]
                command += ["--attention", attention, "--seq-len", str(length), "--out", str(out)]
                tick = time.perf_counter()
                try:
                    done = subprocess.run(
                        command,
                        capture_output=True,
                        text=True,
                        timeout=max(60.0, share - spent),
                    )
                    failed, log = done.returncode != 0, done.stderr + done.stdout
                except subprocess.TimeoutExpired:
                    failed, log = True, "timeout"
                wall = time.perf_counter() - tick
                probe = {"seq_len": length, "wall_s": wall}
                if not failed:
                    row = json.loads(out.read_text())["results"][0]
                    probe |= {"outcome": "trains", "step_time_s": row["step_time_s"],
                              "peak_memory_gb": row["peak_memory_gb"]}  # fmt: skip
                elif log == "timeout":
                    probe["outcome"] = "timeout (budget)"
                elif "out of memory" in log.lower() or "OutOfMemoryError" in log:
                    probe["outcome"] = "out of memory"
                else:
                    probe |= {"outcome": "error", "log_tail": log[-1500:]}
            probes.append(probe)
            mem = probe.get("peak_memory_gb")
            print(
                f"  {attention} L={length}: {probe['outcome']} in {wall:.0f} s"
                + (f", peak {mem:.1f} GB" if mem else ""),
                file=sys.stderr,
            )
            if probe["outcome"] != "trains":
                break
            last = probe
        fits = [p["seq_len"] for p in probes if p["outcome"] == "trains"]
        found[attention] = {"longest": max(fits) if fits else None, "probes": probes}
    kind = "one document per sequence (attention quadratic in L)"
    print(f"\nlongest L that trains ({steps} steps), {kind}:")
    for attention, entry in found.items():
        print(f"  {attention:6} {entry['longest']}")
    if args.out:
        report = {
            "benchmark": "train_step context search",
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
            "kind": kind,
            "family": args.family,
            "model": args.model,
            "block_size": args.block_size,
            "activation_checkpointing": args.activation_checkpointing,
            "mlp_chunks": args.mlp_chunks,
            "compile": not args.no_compile,
            "budget_s": args.search_budget_s,
            "steps_per_probe": steps,
            "found": found,
        }
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


def parse_args(argv=None) -> argparse.Namespace:
    """The command line, with each family's defaults filled in."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--tiny", action="store_true", help="tiny model, short sequence (CPU smoke)"
    )
    parser.add_argument(
        "--family",
        choices=sorted(FAMILY_DEFAULTS),
        default="qwen3",
        help="model family (default qwen3); see the module docstring for each one's baseline",
    )
    parser.add_argument(
        "--model", default=None, help="preset (default qwen3-1.7b, tiny with --tiny)"
    )
    parser.add_argument(
        "--seq-len", type=int, default=None, help="L (default 8192, 128 with --tiny)"
    )
    parser.add_argument(
        "--block-size", type=int, default=None, help="B (default 32, 16 with --tiny)"
    )
    parser.add_argument("--micro-batch", type=int, default=1)
    parser.add_argument(
        "--baseline-micro-batch",
        type=int,
        default=None,
        help="the baseline's micro-batch when it differs from ours (at most --micro-batch): "
        "each side at the largest that fits one GPU",
    )
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default 10, 3 tiny)")
    parser.add_argument(
        "--warmup", type=int, default=None, help="untimed steps (default 3, 1 tiny)"
    )
    parser.add_argument(
        "--activation-checkpointing",
        nargs="?",
        const=True,
        default=False,
        choices=[True, "keep_attention", "keep_matmuls"],
        help="ours: recompute layers in the backward (keep_attention: all but attention's "
        "outputs; keep_matmuls: only the pointwise ops); HF: gradient checkpointing",
    )
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument(
        "--objective",
        default=None,
        choices=("block_diffusion", "fast_dllm_v2", "autoregressive"),
        help="ours' objective (default: the family's own; with --no-baseline)",
    )
    parser.add_argument(
        "--no-stream-trim",
        action="store_true",
        help="ours computes the whole stream in every layer, also rows no loss reads "
        "(train.attention.trim): the baseline for the trim's gain; its FLOPs count that work",
    )
    parser.add_argument(
        "--float8",
        default=None,
        metavar="RECIPE",
        help="an experiment: ours' decoder linear layers in float8 (torchao; tensorwise, "
        "rowwise), the LM head in bf16",
    )
    parser.add_argument(
        "--pipelined",
        action="store_true",
        help="time ours as `dllm train` runs (each step's numbers read once the next one is "
        "queued; wall time over the timed steps) instead of one step at a time, waited for",
    )
    parser.add_argument(
        "--attention",
        default="flex",
        help="our attention on the GPU: flex, turbo, or both comma-separated (each timed in "
        "turn, the first compared with the baselines; the CPU runs reference)",
    )
    parser.add_argument(
        "--kernels",
        choices=("jit", "native"),
        default="jit",
        help="where turbo's Triton op comes from: jit (the shipped source, no bundle needed) or "
        "native (the installed bundle's copy of the same source)",
    )
    parser.add_argument(
        "--turbo-config",
        default=None,
        metavar="FIELD=V[,FIELD=V]",
        help="turbo: these fields of the op's KernelConfig over its shipped default for every "
        "head dim, in this process (e.g. dkdv_gluon=1,dkdv_stages=3): a kernel variant timed "
        "in the whole step before it becomes a default",
    )
    parser.add_argument(
        "--baselines",
        default="dense",
        help="qwen3 baselines, comma-separated: dense (HF sdpa + dense 2L mask), hf-flex (HF "
        "flex_attention + our BlockMask, torch.compile)",
    )
    parser.add_argument("--mlp-chunks", type=int, default=1, help="training.mlp_chunks")
    parser.add_argument(
        "--context-search",
        default=None,
        metavar="L,L,...",
        help="instead: the longest of these L that trains two steps (one document per"
        " sequence), each probe a fresh process; see context_search()",
    )
    parser.add_argument(
        "--search-budget-s",
        type=float,
        default=120.0,
        help="--context-search: stop probing once the next probe would likely pass this",
    )
    parser.add_argument(
        "--baseline-no-checkpointing",
        action="store_true",
        help="diffusion_gemma: start HF without gradient checkpointing (retried with it on OOM)",
    )
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument(
        "--profile", type=Path, default=None, help="profile two extra steps; kernel table here"
    )
    parser.add_argument(
        "--inductor",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set torch._inductor.config KEY (e.g. max_autotune=True) before compiling",
    )
    args = parser.parse_args(argv)
    for item in args.inductor:
        key, _, value = item.partition("=")
        setattr(torch._inductor.config, key, ast.literal_eval(value))
    hybrid = args.family == "qwen3_8"
    args.seq_len = args.seq_len or (128 if args.tiny else 4096 if hybrid else 8192)
    gemma = args.family == "diffusion_gemma"
    args.block_size = args.block_size or (
        16 if args.tiny else 64 if hybrid else 256 if gemma else 32
    )
    # (DiffusionGemma: fewer steps, so ours + HF fit a few minutes of GPU time)
    args.steps = args.steps or (3 if args.tiny else 4 if gemma else 10)
    args.warmup = (
        args.warmup if args.warmup is not None else (1 if args.tiny else 2 if gemma else 3)
    )
    if (
        args.baseline_micro_batch is not None
        and not 1 <= args.baseline_micro_batch <= args.micro_batch
    ):
        parser.error("--baseline-micro-batch must be between 1 and --micro-batch")

    attentions = args.attention.split(",")
    baselines = [] if args.no_baseline else args.baselines.split(",")
    if bad := [a for a in attentions if a not in ("flex", "turbo")]:
        parser.error(f"--attention takes flex and/or turbo, not {','.join(bad)}")
    if bad := [b for b in baselines if b not in HF_BASELINES]:
        parser.error(f"--baselines takes {', '.join(HF_BASELINES)}, not {','.join(bad)}")
    if args.objective and baselines:
        parser.error(
            "--objective times ours alone: add --no-baseline (the HF baselines score "
            "the family's own objective)"
        )
    return args


def apply_turbo_config(spec: str, kernels: str) -> str:
    """'FIELD=V,...' set over the op's default KernelConfig of every head dim (what the
    trainer's `turbo` plans use when none is forced) in this process; returns what was set."""
    from dataclasses import replace

    from benchmarks.attention import config_changes
    from turbo_dllm.kernels.triton_ops import triton_module

    changes = config_changes(spec, "--turbo-config")
    module = triton_module("block_diffusion_attention", kernels)
    try:
        for dim, config in list(module.SM90_CONFIGS.items()):
            module.SM90_CONFIGS[dim] = replace(config, **changes)
    except TypeError as error:
        raise SystemExit(f"--turbo-config {spec!r}: {error}") from None
    return ", ".join(f"{k}={v}" for k, v in changes.items())


def main(argv=None) -> int:
    args = parse_args(argv)
    gemma = args.family == "diffusion_gemma"
    attentions = args.attention.split(",")
    baselines = [] if args.no_baseline else args.baselines.split(",")
    if args.context_search:
        return context_search(args, argv)
    if args.turbo_config:
        print(f"turbo: {apply_turbo_config(args.turbo_config, args.kernels)}", file=sys.stderr)

    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda", 0) if on_gpu else torch.device("cpu")
    specs = [build_spec(args, on_gpu, attention=a) for a in attentions]
    if not on_gpu and "turbo" in attentions:  # validated above; the Triton op needs CUDA
        check(RunSpec.model_validate(specs[0].model_dump(mode="json") | {"kernels": args.kernels}))
        print("turbo runs on a CUDA GPU: timing model.attention reference here", file=sys.stderr)
    spec = specs[0]
    print(
        f"{args.family} model {spec.model.from_config}, L={args.seq_len}, B={args.block_size}, "
        f"micro-batch {args.micro_batch}, {device}",
        file=sys.stderr,
    )
    first = []
    if gemma and not args.no_baseline:
        # HF first: it compiles nothing, so its numbers are in even when a cold compile of ours
        # runs past a GPU call's time (the stage's timeout). The same batches: a fresh loader.
        first.append(run_gemma_baseline(gemma_inputs(spec), spec, args, device))
        reset_memory(device)
        hf = first[0]
        if "error" not in hf:  # in the log now, in case ours does not finish
            mem = hf["peak_memory_gb"]
            print(
                f"  baseline: {hf['step_time_s']:.3f} s/step, {hf['tokens_per_s']:,.0f} tokens/s, "
                f"MFU {100 * (hf['mfu'] or 0):.1f}%, peak {mem or 0:.1f} GB",
                file=sys.stderr,
                flush=True,
            )
    run = run_gemma_ours if gemma else run_ours
    profile = args.profile
    if profile is not None and len(attentions) > 1:  # one table per attention: NAME_<attention>
        args.profile = profile.with_name(f"{profile.stem}_{attentions[0]}{profile.suffix}")
    ours, trainer = run(spec, args, device, name=_ours_name(attentions, 0))
    extra = []
    for i, other in enumerate(specs[1:], start=1):  # ours again with the other attention
        _free_ours(trainer)
        reset_memory(device)
        if profile is not None:
            args.profile = profile.with_name(f"{profile.stem}_{attentions[i]}{profile.suffix}")
        result, trainer = run(other, args, device, name=_ours_name(attentions, i))
        extra.append(result)
    args.profile = profile
    gemm = grouped_gemm_in_use(trainer, device)
    if gemm is not None:
        ours["grouped_gemm"] = gemm
        print(f"experts' grouped GEMM: {gemm}", file=sys.stderr)
    results = [ours, *extra, *first]
    if not args.no_baseline and not gemma:
        if args.family == "nemotron_diffusion":
            results.append(run_decoder_twin(trainer, spec, args, device))
        else:
            for kind in baselines:
                results.append(run_baseline(trainer, spec, args, device, kind))
    print(
        f"\n{'':34} {'mb':>3} {'step s':>8} {'tokens/s':>10} {'TFLOP/s':>8} {'MFU':>6} {'mem GB':>7}"
    )
    for r in results:
        if "error" in r:
            print(f"{r['name']:34} {r['error']}")
            continue
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "-"
        mem = f"{r['peak_memory_gb']:.1f}" if r["peak_memory_gb"] is not None else "-"
        print(
            f"{r['name']:34} {r['micro_batch']:3} {r['step_time_s']:8.3f} {r['tokens_per_s']:10,.0f} "
            f"{r['tflops_per_s']:8.1f} {mfu:>6} {mem:>7}"
        )
    speedup, speedups = None, {}
    for other in results[1:]:  # ours (the first attention) against every other row
        if "error" not in other and "error" not in results[0]:
            speedups[other["name"]] = results[0]["tokens_per_s"] / other["tokens_per_s"]
            print(f"{results[0]['name']} / {other['name']}: {speedups[other['name']]:.2f}x")
    if len(results) > len(attentions):  # the first baseline, as before
        speedup = speedups.get(results[len(attentions)]["name"])
        if speedup is not None:
            print(f"\nspeedup over the baseline: {speedup:.2f}x")
    if args.out:
        report = {
            "benchmark": "train_step",
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name(0) if on_gpu else platform.processor() or "cpu",
            "torch": torch.__version__,
            # the baselines' library: its version changes HF's side (5.17 on the H200, 5.24 in CI)
            "transformers": importlib.metadata.version("transformers"),
            "family": args.family,
            "model": spec.model.from_config,
            "seq_len": args.seq_len,
            "block_size": args.block_size,
            "micro_batch": args.micro_batch,
            "inductor": args.inductor,
            "turbo_config": args.turbo_config,
            "results": results,
            "speedup": speedup,
            "speedups": speedups,
        }
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
