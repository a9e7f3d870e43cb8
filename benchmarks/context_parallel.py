"""CSBP against the context-parallel baseline on two GPUs, and the longest context 1 vs 2 GPUs hold.

Every measurement is the real trainer step (`Trainer.train_step`: plan-sharded batch, FlexAttention,
activation checkpointing, chunked LM-head CE, FSDP2 over the context group, fused AdamW) on a random
Qwen3-1.7B-shaped model with BD3-LM noise, run in its own `torchrun` job so an out-of-memory
failure ends one measurement, not the benchmark:

- throughput: for each sequence length, tokens/s (L data tokens per step) and peak memory per GPU
  of each mode on `--gpus` GPUs: `csbp` (cp = bp = P: noisy blocks in dual-end pairs, clean stream
  zigzag), `cp` (the baseline: both streams zigzag, all-gather of all K/V), optionally `bp`
  (cp = 1: every rank recomputes its clean prefix, no attention traffic). Ratios against `cp`.
- max context: the longest sequence training fits in memory, on 1 GPU (whole sequence)
  and on `--gpus` GPUs (csbp): from `--search-start`, doubling until two fits give a memory
  slope, then jumping to where that line meets the GPU's capacity, then bisecting to
  `--search-granularity` (each cut aimed the same way), within `--budget-s`; a trial starts only
  if it can end inside the budget. A trial runs two steps, so the second carries the optimizer
  state every later step carries (AdamW's moments appear in step one's update, after its
  backward peak). Probe steps make every diffusion block its own
  document: same tensors, same code path, same memory, but attention costs O(L) instead of
  O(L^2), so a probe at 512K tokens takes seconds, not many minutes (`--full-probe` disables it).

Each invocation runs the parts named by `--parts` and merges them into the JSON at `--out`, so
the GPU work can be split into commands that each fit a time limit:

    torchrun is started by the script itself; on a 2-GPU host (NCCL_NVLS_ENABLE=0 is set):
    python benchmarks/context_parallel.py --parts throughput --out cp.json
    python benchmarks/context_parallel.py --parts search --search-gpus 1 --out cp.json
    python benchmarks/context_parallel.py --parts search --search-gpus 2 --out cp.json
    python benchmarks/context_parallel.py --tiny --out /tmp/cp-tiny.json    # CPU smoke (gloo)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# mode -> (cp, bp) as a function of the GPU count P
MODES: dict[str, Any] = {
    "none": lambda p: (1, 1),
    "csbp": lambda p: (p, p),
    "cp": lambda p: (p, 1),
    "bp": lambda p: (1, p),
}


# ============================== worker (one torchrun job) =======================================
class _BlockDocuments:
    """Loader wrapper for memory probes: document id = block index (attention becomes O(L))."""

    def __init__(self, loader, block_size: int) -> None:
        self.loader, self.block_size = loader, block_size

    def __iter__(self):
        return self

    def __next__(self):
        import torch

        batch = dict(next(self.loader))
        rows, length = batch["input_ids"].shape
        blocks = torch.arange(length) // self.block_size
        batch["doc_ids"] = blocks.to(torch.int32).expand(rows, length).contiguous()
        return batch

    def state_dict(self):  # the loader contract the trainer keeps checkpoints with
        return self.loader.state_dict()

    def load_state_dict(self, state) -> None:
        self.loader.load_state_dict(state)


def _spec(args, mode: str, gpus: int, seq_len: int):
    from turbo_dllm.config.runspec import RunSpec
    from turbo_dllm.config.validate import check

    cp, bp = MODES[mode](gpus)
    cuda = not args.tiny
    document = {
        "launch": {"seed": 0, "kind": "profile"},
        "model": {
            "family": "qwen3",
            "from_config": args.preset,
            "dtype": "bfloat16" if cuda else "float32",
            "attention": "flex" if cuda else "reference",
        },
        "objective": {"name": args.objective, "block_size": args.block_size},
        "data": {
            "synthetic": {"num_sequences": 64, "vocab_size": args.vocab_size},
            "seq_len": seq_len,
        },
        "training": {
            "micro_batch_size": 1,
            "steps": 1000,
            "activation_checkpointing": not args.no_ac,
            "mlp_chunks": args.mlp_chunks,
            "compile": args.compile,
        },
        "topology": {"cp": cp, "bp": bp},
        "scheduler": {"name": "constant", "warmup_steps": 0},
        "checkpoint": {"resume": "never"},
        "logging": {"console": False, "jsonl": False},
        "kernels": args.kernels,
    }
    return check(RunSpec.model_validate(document), world_size=gpus)


def worker(args) -> int:
    import torch

    from turbo_dllm.train.distributed import init_distributed
    from turbo_dllm.train.metrics import peak_memory_gb
    from turbo_dllm.train.trainer import Trainer

    env = init_distributed()
    out = Path(args.result_dir) / f"rank{env.rank}.json"
    record: dict[str, Any] = {"rank": env.rank, "status": "started"}

    def finish(status: str, **extra: Any) -> None:
        record.update(status=status, **extra)
        out.write_text(json.dumps(record))

    recorder = _memory_recorder(args, env)
    if env.device.type == "cuda" and args.memory_limit_gb:
        total = torch.cuda.get_device_properties(env.device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.memory_limit_gb * 1e9 / total))
    try:
        spec = _spec(args, args.mode, env.world_size, args.seq_len)
        with tempfile.TemporaryDirectory() as run_dir:
            trainer = Trainer(spec, run_dir, env).build()
            if args.probe:
                trainer.loader = _BlockDocuments(trainer.loader, args.block_size)
            times = []
            for step in range(args.warmup + args.steps):
                if env.device.type == "cuda":
                    torch.cuda.synchronize()
                tick = time.perf_counter()
                trainer.train_step(step)
                if env.device.type == "cuda":
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - tick)
        peak = peak_memory_gb(env.device)
        if args.memory_limit_gb and env.device.type != "cuda" and peak > args.memory_limit_gb:
            finish("oom", peak_gb=peak, note="peak RSS above --memory-limit-gb")
            return 0
        facts = {**_device_facts(args, env.device), **_allocator_state(env.device)}
        recorder.dump()
        finish("ok", step_times_s=times, peak_gb=peak, **facts)
        return 0
    except torch.OutOfMemoryError as error:
        # What the allocator held when it gave up: reserved far above allocated = fragmentation.
        recorder.dump()
        finish("oom", error=str(error).splitlines()[0], **_allocator_state(env.device))
        sys.stdout.flush()
        os._exit(3)  # peers may be blocked in a collective: torchrun tears the job down


def _memory_recorder(args, env):
    """With --memory-snapshot DIR (CUDA, rank 0: the ranks are symmetric): the trainer's own
    recorder, whose `dump()` writes the allocator snapshot and its by-line summary into
    DIR/<mode>-x<world>-<seq_len>/. A no-op otherwise."""
    from turbo_dllm.config.runspec import ProfilerSpec
    from turbo_dllm.train.memory import MemoryRecorder

    wanted = bool(args.memory_snapshot) and env.rank == 0
    folder = Path(args.memory_snapshot or ".") / f"{args.mode}-x{env.world_size}-{args.seq_len}"
    return MemoryRecorder(ProfilerSpec(memory_snapshot=wanted), folder, env.rank, env.device)


def _allocator_state(device) -> dict[str, float]:
    """Allocated vs reserved memory now and at peak (GB), CUDA only."""
    import torch

    if device.type != "cuda":
        return {}
    gb = 1e9
    return {
        "allocated_gb": torch.cuda.memory_allocated(device) / gb,
        "reserved_gb": torch.cuda.memory_reserved(device) / gb,
        "peak_reserved_gb": torch.cuda.max_memory_reserved(device) / gb,
    }


def _device_facts(args, device) -> dict[str, Any]:
    """Name and usable memory (GB) of this rank's device: the limit the search aims at."""
    import torch

    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory / 1e9
        return {
            "device": torch.cuda.get_device_name(device),
            "capacity_gb": min(total, args.memory_limit_gb or total),
        }
    return {"device": "cpu (gloo)", "capacity_gb": args.memory_limit_gb}


# ============================== driver ===========================================================
def measure(args, mode: str, gpus: int, seq_len: int, *, steps: int, warmup: int, probe: bool):
    """One torchrun job; returns a result dict with status ok / oom / failed / timeout."""
    with tempfile.TemporaryDirectory() as results:
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={gpus}",
            str(Path(__file__).resolve()),
            "--worker",
            "--mode",
            mode,
            "--seq-len",
            str(seq_len),
            "--steps",
            str(steps),
            "--warmup",
            str(warmup),
            "--result-dir",
            results,
            *_passthrough(args),
        ]
        if probe:
            command.append("--probe")
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE", "0"),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        }
        began = time.perf_counter()
        proc = subprocess.Popen(
            command,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            log, _ = proc.communicate(timeout=args.trial_timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            log, _ = proc.communicate()
            timed_out = True
        ranks = [json.loads(p.read_text()) for p in sorted(Path(results).glob("rank*.json"))]
    result: dict[str, Any] = {
        "mode": mode,
        "gpus": gpus,
        "seq_len": seq_len,
        "probe": probe,
        "wall_s": round(time.perf_counter() - began, 1),
    }
    statuses = {r["status"] for r in ranks}
    if "oom" in statuses:
        result["status"] = "oom"
        result["oom_ranks"] = [
            {k: r[k] for k in ("rank", "allocated_gb", "reserved_gb") if k in r}
            for r in ranks
            if r["status"] == "oom"
        ]
    elif timed_out:
        result["status"] = "timeout"
    elif proc.returncode != 0 or statuses != {"ok"} or len(ranks) != gpus:
        result["status"] = "failed"
        result["log_tail"] = log[-3000:]
    else:
        result["status"] = "ok"
        times = ranks[0]["step_times_s"][warmup:]
        step = sorted(times)[len(times) // 2]  # median
        result.update(
            step_time_s=step,
            tokens_per_s=seq_len / step,
            peak_gb_per_gpu=max(r["peak_gb"] for r in ranks),
            peak_reserved_gb_per_gpu=max(r.get("peak_reserved_gb", 0.0) for r in ranks),
            device=ranks[0].get("device"),
            capacity_gb=ranks[0].get("capacity_gb"),
        )
    print(_describe(result), file=sys.stderr, flush=True)
    return result


def _describe(r: dict[str, Any]) -> str:
    head = f"  {r['mode']:>5} x{r['gpus']} L={r['seq_len']:>8}: {r['status']:<7}"
    if r["status"] == "ok":
        head += f" {r['tokens_per_s']:>10.0f} tok/s  {r['peak_gb_per_gpu']:6.1f} GB/GPU"
    return head + f"  ({r['wall_s']} s)"


def _passthrough(args) -> list[str]:
    flags = [
        "--preset",
        args.preset,
        "--block-size",
        str(args.block_size),
        "--objective",
        args.objective,
        "--vocab-size",
        str(args.vocab_size),
        "--kernels",
        args.kernels,
    ]
    if args.tiny:
        flags.append("--tiny")
    if args.no_ac:
        flags.append("--no-ac")
    if args.compile:
        flags.append("--compile")
    if args.mlp_chunks > 1:
        flags += ["--mlp-chunks", str(args.mlp_chunks)]
    if args.memory_limit_gb:
        flags += ["--memory-limit-gb", str(args.memory_limit_gb)]
    if args.memory_snapshot:
        flags += ["--memory-snapshot", str(Path(args.memory_snapshot).absolute())]
    return flags


def _predicted_length(peaks, capacity, grain) -> int | None:
    """Where a line through the two longest fitting lengths' peak memory meets 98 % of the
    device's capacity, on the granularity grid; None without two increasing points."""
    if not capacity or len(peaks) < 2:
        return None
    (l0, m0), (l1, m1) = sorted(peaks)[-2:]
    if l1 <= l0 or m1 <= m0:
        return None
    slope = (m1 - m0) / (l1 - l0)
    return int(l1 + (0.98 * capacity - m1) / slope) // grain * grain


SETTLED = ("converged", "reached --search-max")


def ratio_line(search: dict[str, Any]) -> str | None:
    """The 2-GPU / 1-GPU longest-context ratio as printed, with what it is where a search did
    not settle: the longest length that fit is then only a lower bound of that GPU count's
    maximum (a tiny CPU search that ran out of --budget-s printed '0.14x' as if measured)."""
    one, two = search.get("1gpu"), search.get("2gpu")
    if not (one and two and one.get("max_seq_len") and two.get("max_seq_len")):
        return None
    ratio = f"2-GPU / 1-GPU max context: {two['max_seq_len'] / one['max_seq_len']:.2f}x"
    open_ = [f"{key}: {s['status']}" for key, s in (("1gpu", one), ("2gpu", two))
             if s["status"] not in SETTLED]  # fmt: skip
    if not open_:
        return ratio
    bound = {1: "an upper bound", 2: "a lower bound"}.get(
        sum(2 if key.startswith("2gpu") else 1 for key in open_), "not a measurement"
    )
    return f"{ratio} ({bound}: the search did not settle, {'; '.join(open_)})"


def _next_length(fit, fail, peaks, capacity, grain) -> int:
    """The next trial after the longest fit `fit`. Below a known failure: inside the bracket
    (fit, fail), the predicted length (regula falsi), else the midpoint. With no failure yet:
    the predicted length once two fits give a memory slope (peak memory is linear in the
    length), else double."""
    predicted = _predicted_length(peaks, capacity, grain)
    if fail is None:
        return max(predicted, fit + grain) if predicted is not None else 2 * fit
    guess = predicted if predicted is not None else (fit + fail) // 2 // grain * grain
    return min(max(guess, fit + grain), fail - grain)


def search(args, gpus: int, mode: str, deadline: float, found: dict, save) -> dict[str, Any]:
    """Longest seq_len whose probe step fits: doubling, then bisection to the granularity.

    Bisection points follow the measured peak memory (a line through the two largest fitting
    lengths, aimed at the device capacity) and fall back to the midpoint. A trial starts only if
    the slowest trial so far would still end before `deadline`. Progress goes into `found`
    (part of the result) and `save()` writes it after every trial.
    """
    grain = args.search_granularity
    fit, fail, peaks, trials = None, None, [], []
    found.update(gpus=gpus, mode=mode, max_seq_len=None, first_failure=None, status="running",
                 trials=trials)  # fmt: skip
    length, slowest = args.search_start, 0.0
    while True:
        if time.perf_counter() + 1.2 * slowest > deadline:
            found["status"] = "budget exhausted"
            break
        r = measure(args, mode, gpus, length, steps=1, warmup=1, probe=not args.full_probe)
        slowest = max(slowest, r["wall_s"])
        keys = ("seq_len", "status", "peak_gb_per_gpu", "peak_reserved_gb_per_gpu", "wall_s")
        trials.append({k: r.get(k) for k in keys} | {"oom_ranks": r.get("oom_ranks")})
        if r["status"] == "ok":
            fit = length
            peaks.append((length, r["peak_gb_per_gpu"]))
            found["capacity_gb"] = r.get("capacity_gb")
        elif r["status"] in ("oom", "timeout"):
            fail = length
        else:
            found["status"] = "failed"
            trials[-1]["log_tail"] = r.get("log_tail")
            break
        found.update(max_seq_len=fit, first_failure=fail)
        save()
        if fit is None:  # the start does not fit: halve
            if length <= grain:
                found["status"] = "nothing fits"
                break
            length = max(grain, (length // 2) // grain * grain)
            continue
        if fail is None and fit + grain > args.search_max:
            found["status"] = "reached --search-max"
            break
        if fail is not None and fail - fit <= grain:
            found["status"] = "converged"
            break
        length = _next_length(fit, fail, peaks, found.get("capacity_gb"), grain)
        if fail is None:
            length = min(length, args.search_max // grain * grain)
    found.update(max_seq_len=fit, first_failure=fail)
    return found


def print_tables(result: dict[str, Any]) -> None:
    rows = result.get("throughput", [])
    if rows:
        gpus = rows[0]["gpus"]
        print(f"\nThroughput on {gpus} x {result['device']} ({result['config']['preset']}, "
              f"block {result['config']['block_size']}, {result['config']['objective']})")  # fmt: skip
        print(
            f"{'seq_len':>8}  {'mode':>5}  {'tokens/s':>10}  {'step s':>7}  {'GB/GPU':>7}  {'vs cp':>6}"
        )
        for r in rows:
            if r["status"] != "ok":
                print(f"{r['seq_len']:>8}  {r['mode']:>5}  {r['status']:>10}")
                continue
            ratio = r.get("speedup_vs_cp")
            print(
                f"{r['seq_len']:>8}  {r['mode']:>5}  {r['tokens_per_s']:>10.0f}  "
                f"{r['step_time_s']:>7.2f}  {r['peak_gb_per_gpu']:>7.1f}  "
                f"{(f'{ratio:.2f}x') if ratio else '-':>6}"
            )
    found = result.get("search", {})
    if found:
        print("\nLongest context training fits in (two probe steps)")
        print(f"{'gpus':>4}  {'mode':>5}  {'max seq_len':>11}  {'first OOM':>9}  status")
        for key in sorted(found):
            s = found[key]
            print(
                f"{s['gpus']:>4}  {s['mode']:>5}  {str(s['max_seq_len']):>11}  "
                f"{str(s['first_failure']):>9}  {s['status']} ({len(s['trials'])} trials)"
            )
        if line := ratio_line(found):
            print(line)


def driver(args) -> int:
    began = time.perf_counter()
    deadline = began + args.budget_s
    out = Path(args.out) if args.out else None
    result: dict[str, Any] = {}
    if out and out.is_file():
        previous = json.loads(out.read_text())
        if previous.get("benchmark") == "context_parallel":
            result = previous
    result.update(
        benchmark="context_parallel",
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        python=platform.python_version(),
        torch=_torch_version(),
        config={
            "preset": args.preset,
            "block_size": args.block_size,
            "objective": args.objective,
            "kernels": args.kernels,
            "activation_checkpointing": not args.no_ac,
            "compile": args.compile,
            "mlp_chunks": args.mlp_chunks,
            "tiny": args.tiny,
            "probe": "full attention" if args.full_probe else "one document per block",
        },
    )
    result.setdefault("device", "cpu (gloo)" if args.tiny else "unknown")

    def save() -> None:  # after every measurement, so a killed run keeps what it measured
        one = result.get("search", {}).get("1gpu")
        two = result.get("search", {}).get("2gpu")
        if one and two and one.get("max_seq_len") and two.get("max_seq_len"):
            result["max_context_ratio"] = two["max_seq_len"] / one["max_seq_len"]
        result["wall_s"] = round(time.perf_counter() - began, 1)
        if out:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=2) + "\n")

    parts = set(args.parts.split(","))
    if "throughput" in parts:
        rows = result["throughput"] = []
        for seq_len in [int(x) for x in args.seq_lens.split(",")]:
            for mode in args.modes.split(","):
                row = measure(args, mode, args.gpus, seq_len, steps=args.steps,
                              warmup=args.warmup, probe=False)  # fmt: skip
                result["device"] = row.get("device") or result["device"]
                rows.append(row)
                _speedups(rows)
                save()
    if "search" in parts:
        found = result.setdefault("search", {})
        for gpus in [int(x) for x in args.search_gpus.split(",")]:
            mode = "none" if gpus == 1 else "csbp"
            search(args, gpus, mode, deadline, found.setdefault(f"{gpus}gpu", {}), save)
            save()
    save()
    print_tables(result)
    if out:
        print(f"\nwrote {out}")
    return 0


def _speedups(rows: list[dict[str, Any]]) -> None:
    """tokens/s of every row against the CP baseline at the same length."""
    for row in rows:
        base = next((r for r in rows if r["seq_len"] == row["seq_len"] and r["mode"] == "cp"), None)
        if base and row["status"] == "ok" and base["status"] == "ok":
            row["speedup_vs_cp"] = row["tokens_per_s"] / base["tokens_per_s"]


def _torch_version() -> str:
    import torch

    return torch.__version__


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tiny", action="store_true", help="CPU smoke check: tiny model, gloo")
    p.add_argument("--out", help="JSON file to write (merged with an earlier run's parts)")
    p.add_argument("--parts", default="throughput,search")
    p.add_argument("--gpus", type=int, default=2, help="GPUs for the throughput part")
    p.add_argument("--modes", default="csbp,cp", help="comma list of csbp, cp, bp")
    p.add_argument("--seq-lens", default=None, help="default 32768,65536 (tiny: 256,512)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--preset", default=None, help="model preset (default qwen3-1.7b; tiny)")
    p.add_argument("--vocab-size", type=int, default=None)
    p.add_argument("--block-size", type=int, default=None, help="default 32 (tiny: 16)")
    p.add_argument("--objective", default="block_diffusion")
    p.add_argument(
        "--kernels",
        default=None,
        help="merge op backend: native (GPU default: the installed bundle), jit, reference (tiny)",
    )
    p.add_argument("--no-ac", action="store_true", help="no activation checkpointing")
    p.add_argument("--compile", action="store_true", help="torch.compile the decoder layers")
    p.add_argument("--mlp-chunks", type=int, default=1, help="training.mlp_chunks")
    p.add_argument("--search-gpus", default="1,2")
    p.add_argument("--search-start", type=int, default=None, help="default 65536 (tiny: 256)")
    p.add_argument("--search-granularity", type=int, default=None, help="default 32768")
    p.add_argument("--search-max", type=int, default=None, help="default 4194304 (tiny: 4096)")
    p.add_argument("--full-probe", action="store_true", help="search with full attention")
    p.add_argument("--memory-limit-gb", type=float, default=None, help="pretend GPUs are smaller")
    p.add_argument("--memory-snapshot", help="CUDA: dump rank 0's allocator snapshot here")
    p.add_argument("--budget-s", type=float, default=540.0, help="wall budget of this run")
    p.add_argument("--trial-timeout-s", type=float, default=420.0)
    # worker-only
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    p.add_argument("--seq-len", type=int, help=argparse.SUPPRESS)
    p.add_argument("--result-dir", help=argparse.SUPPRESS)
    p.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    tiny = args.tiny
    defaults = {
        "seq_lens": "256,512" if tiny else "32768,65536",
        "preset": "tiny" if tiny else "qwen3-1.7b",
        "vocab_size": 512 if tiny else 151936,
        "block_size": 16 if tiny else 32,
        "search_start": 256 if tiny else 65536,
        "search_granularity": 128 if tiny else 32768,
        "search_max": 4096 if tiny else 4194304,
        "memory_limit_gb": 1.0 if tiny else None,
        # What a GPU run should use (docs/parallelism.md); the reference merge keeps float32
        # copies of both partials and would measure the merge, not CSBP.
        "kernels": "reference" if tiny else "native",
    }
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return worker(args) if args.worker else driver(args)


if __name__ == "__main__":
    sys.exit(main())
