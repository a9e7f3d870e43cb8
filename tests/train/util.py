"""Small helpers for the trainer tests: a tiny RunSpec, reading metrics, torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from turbo_dllm.config.load import apply_overrides
from turbo_dllm.config.runspec import RunSpec
from turbo_dllm.config.validate import check

TINY: dict[str, Any] = {
    "launch": {"seed": 0},
    "model": {
        "from_config": "tiny",
        "config_overrides": {
            "num_hidden_layers": 2,
            "hidden_size": 64,
            "intermediate_size": 128,
            "head_dim": 16,
        },
    },
    "objective": {"name": "block_diffusion", "block_size": 8},
    "data": {"synthetic": {"num_sequences": 64, "vocab_size": 512}, "seq_len": 64},
    "training": {"micro_batch_size": 4, "steps": 10},
    "optimizer": {"lr": 0.003},
    "scheduler": {"name": "cosine", "warmup_steps": 2},
    "checkpoint": {"interval": 5, "keep_last": 2},
    "logging": {"console": False},
}


def tiny_spec(*overrides: str, base: dict[str, Any] | None = None) -> RunSpec:
    document = apply_overrides(base or TINY, list(overrides))
    return check(RunSpec.model_validate(document))


def write_config(path: Path, *overrides: str, base: dict[str, Any] | None = None) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(apply_overrides(base or TINY, list(overrides))))
    return path


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def losses(run_dir: Path) -> list[float]:
    return [record["loss"] for record in metrics(run_dir)]


def torchrun(nproc: int, *args: str, cwd) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "turbo_dllm",
        *args,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def two_step_run(model: dict[str, Any]) -> dict[str, Any]:
    """A RunSpec document: `model` trained two block-diffusion steps on synthetic data (vocab
    512, L 32, block 8) and checkpointed at step 2; the family tests' `tiny_spec(base=...)`."""
    return {
        "launch": {"seed": 0},
        "model": model,
        "objective": {"name": "block_diffusion", "block_size": 8},
        "data": {"synthetic": {"num_sequences": 16, "vocab_size": 512}, "seq_len": 32},
        "training": {"micro_batch_size": 2, "steps": 2},
        "optimizer": {"lr": 0.003},
        "scheduler": {"name": "cosine", "warmup_steps": 1},
        "checkpoint": {"interval": 2, "keep_last": 1},
        "logging": {"console": False},
    }
