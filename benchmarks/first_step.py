"""First-step compile overhead, cold and with a compile-cache pack (issue 20; `gpu_session.sh packs`).

    python benchmarks/first_step.py --out DIR            # Qwen3-1.7B shape, L=8192, B=32 (GPU)
    python benchmarks/first_step.py --out DIR --tiny     # CPU smoke: a tiny model, compile on

1. A fresh DLLM_HOME with empty compile caches trains N steps of the recipe: the first step
   compiles everything (inductor, Triton, FlexAttention).
2. `dllm cache pack --config` packs that home's caches.
3. Another fresh home installs the pack (`dllm cache install --config`) and trains again.

Overhead = first step - median of the later steps, per run; the target with the pack is <= 5 s.
Every run is a `dllm train` child process, so nothing compiled in one is in memory for the next.
Writes DIR/first_step.json and leaves the pack in DIR/packs/.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
TARGET_OVERHEAD_S = 5.0


def spec_document(tiny: bool, steps: int) -> dict:
    """The h200 recipe's compile-relevant shape, on a random model and synthetic tokens."""
    return {
        "launch": {"seed": 0, "kind": "profile"},
        "model": {
            "from_config": "tiny" if tiny else "qwen3-1.7b",
            "dtype": "float32" if tiny else "bfloat16",
            "attention": "reference" if tiny else "flex",
        },
        "objective": {"name": "fast_dllm_v2", "block_size": 16 if tiny else 32},
        "data": {
            "synthetic": {"num_sequences": 64, "vocab_size": 512 if tiny else 151936},
            "seq_len": 128 if tiny else 8192,
        },
        "training": {"micro_batch_size": 1, "steps": steps, "compile": True},
        "scheduler": {"name": "constant", "warmup_steps": 0},
        "checkpoint": {"interval": None, "resume": "never"},
        "logging": {"console": False, "jsonl": True},
        "kernels": "reference",
    }


def dllm(home: Path, *args: str, log) -> subprocess.CompletedProcess:
    env = {**os.environ, "DLLM_HOME": str(home), "PYTHONPATH": str(ROOT)}
    for variable in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "DLLM_COMPILE_CACHE"):
        env.pop(variable, None)  # every run uses its home's own cache
    proc = subprocess.run(
        [sys.executable, "-m", "turbo_dllm", *args], env=env, capture_output=True, text=True
    )
    log.write(f"$ dllm {' '.join(args)}\n{proc.stdout}{proc.stderr}\n")
    if proc.returncode != 0:
        raise SystemExit(f"dllm {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return proc


def train(home: Path, config: Path, run_dir: Path, log) -> dict:
    began = time.perf_counter()
    dllm(home, "train", "--config", str(config), "--run-dir", str(run_dir), log=log)
    wall = time.perf_counter() - began
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    times = [r["step_time_s"] for r in rows if "step_time_s" in r]
    median = statistics.median(times[1:])
    return {
        "first_step_s": round(times[0], 3),
        "median_step_s": round(median, 3),
        "overhead_s": round(times[0] - median, 3),
        "steps": len(times),
        "wall_s": round(wall, 1),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tiny", action="store_true", help="tiny model (CPU smoke)")
    parser.add_argument("--steps", type=int, default=6, help="steps per run (default 6)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory(prefix="dllm-first-step-") as tmp,
        (args.out / "first_step.log").open("w") as log,
    ):
        root = Path(tmp)
        config = root / "spec.yaml"
        config.write_text(yaml.safe_dump(spec_document(args.tiny, args.steps)))
        cold = train(root / "home-a", config, root / "run-a", log)
        print(f"cold: {cold}", flush=True)
        made = json.loads(
            dllm(root / "home-a", "cache", "pack", "--config", str(config),
                 "--out", str(args.out / "packs"), "--json", log=log).stdout
        )  # fmt: skip
        began = time.perf_counter()
        dllm(root / "home-b", "cache", "install", made["pack"], "--config", str(config), log=log)
        install_s = time.perf_counter() - began
        warm = train(root / "home-b", config, root / "run-b", log)
        print(f"with the pack: {warm}", flush=True)
    result = {
        "benchmark": "first_step",
        "model": "tiny" if args.tiny else "qwen3-1.7b",
        "seq_len": 128 if args.tiny else 8192,
        "cold": cold,
        "with_pack": warm,
        "pack": {
            "file": Path(made["pack"]).name,
            "bytes": made["bytes"],
            "files": made["files"],
            "install_s": round(install_s, 2),
        },
        "target_overhead_s": TARGET_OVERHEAD_S,
        "meets_target": warm["overhead_s"] <= TARGET_OVERHEAD_S,
    }
    (args.out / "first_step.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0 if result["meets_target"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
