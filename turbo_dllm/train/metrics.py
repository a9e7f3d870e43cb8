"""Step metrics: model FLOPs and MFU, metrics.jsonl, the console line, W&B and TensorBoard, the
profiler window.

Model FLOPs of one training step (forward + backward = 3x forward), counted from what the
objective needs, not from what a kernel happens to compute:

    body       6 * (decoder matmul weights) * (stream tokens: rows * 2L)
    head       6 * vocab * hidden * (scored tokens)
    attention  12 * head_dim * heads * layers * (allowed query/key pairs of the mask)

MFU divides by the step time and the accelerator's dense bf16 peak (989 TFLOP/s for H100/H200;
`DLLM_PEAK_TFLOPS` overrides). On CPU the peak is unknown and MFU is reported as null.
"""

from __future__ import annotations

import json
import os
import resource
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from turbo_dllm.errors import DllmError
from turbo_dllm.fsutil import write_atomic

if TYPE_CHECKING:
    import torch

# torch is imported inside the functions that need it: `dllm run list` reads metrics.jsonl
# through `read_metrics` and must stay torch-free.

__all__ = [
    "MetricsLogger",
    "ProfilerWindow",
    "peak_flops",
    "peak_memory_gb",
    "read_metrics",
]

METRICS_NAME = "metrics.jsonl"

_PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "H800": 989.0, "B200": 2250.0, "A100": 312.0}


def peak_flops(device: torch.device) -> float | None:
    """Dense bf16 peak FLOP/s of one device, or None when unknown (CPU, unlisted GPU)."""
    override = os.environ.get("DLLM_PEAK_TFLOPS")
    if override:
        return float(override) * 1e12
    if device.type != "cuda":
        return None
    import torch

    name = torch.cuda.get_device_name(device)
    for key, tflops in _PEAK_TFLOPS.items():
        if key in name:
            return tflops * 1e12
    return None


def peak_memory_gb(device: torch.device) -> float:
    """Peak accelerator memory since the last reset (CUDA), else the process's peak RSS."""
    if device.type == "cuda":
        import torch

        return torch.cuda.max_memory_allocated(device) / 1e9
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss_kb * (1 if sys.platform != "darwin" else 1 / 1024) / 1e6


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """metrics.jsonl records in file order; a torn line (a run killed mid-write, or one still
    writing) is skipped. With `last_metrics_record`, the one reader: resume and `dllm run`
    read through them."""
    path = Path(run_dir) / METRICS_NAME
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        record = _record(line)
        if record is not None:
            records.append(record)
    return records


_TAIL_CHUNK = 64 * 1024


def last_metrics_record(
    run_dir: str | Path, accept: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """The last metrics.jsonl record that `accept`s ({} where none), read from the end back:
    `dllm run list` read every run's whole file (a long run's is hundreds of MB: seconds and as
    much memory per run). Lines are taken as `read_metrics` takes them."""
    try:
        with (Path(run_dir) / METRICS_NAME).open("rb") as handle:
            end = handle.seek(0, os.SEEK_END)
            carry = b""  # the start of a line whose beginning is further back
            while end > 0:
                start = max(0, end - _TAIL_CHUNK)
                handle.seek(start)
                lines = (handle.read(end - start) + carry).split(b"\n")
                carry = lines.pop(0) if start > 0 else b""
                end = start
                for line in reversed(lines):
                    record = _record(line.decode("utf-8", errors="replace"))
                    if record is not None and accept(record):
                        return record
    except OSError:  # absent, a folder, unreadable
        pass
    return {}


def _record(line: str) -> dict[str, Any] | None:
    """One metrics line's record; None for a blank, torn or damaged one. A step, where there
    is one, is an int and not a bool (`"step": true` was plotted, and kept by a resume, as step
    1); a record with another step is damaged. A metric value is read as a number only where it
    is one that is not a bool (by each reader: one odd value does not damage the record)."""
    if not line.strip():
        return None
    try:
        record = json.loads(line)
    except (json.JSONDecodeError, RecursionError):  # torn, or nested past the parser
        return None
    if not isinstance(record, dict):
        return None
    step = record.get("step", 0)
    return record if isinstance(step, int) and not isinstance(step, bool) else None


class _NullLogger:
    def log(self, record: dict[str, Any], step: int) -> None:
        pass

    def finish(self) -> None:
        pass


class _WandbLogger:
    """W&B, one run per dllm run: named after it, its id kept in the run dir so a resume
    continues the same W&B run instead of starting a new one."""

    ID_FILE = "wandb_run_id"

    def __init__(self, spec, run_dir: Path, name: str, config: dict[str, Any]) -> None:
        try:
            import wandb
        except ImportError:
            raise DllmError(
                "logging.wandb is set but wandb is not installed",
                hint="pip install 'turbo-dllm[wandb]', or remove logging.wandb",
            ) from None
        id_file = run_dir / self.ID_FILE
        run_id = id_file.read_text().strip() if id_file.is_file() else None
        self._run = wandb.init(
            project=spec.project,
            entity=spec.entity,
            # The spec's mode, else the user's WANDB_MODE (e.g. disabled), else offline.
            mode=spec.mode or os.environ.get("WANDB_MODE") or "offline",
            dir=str(run_dir),
            name=name,
            id=run_id,
            config=config,
            resume="allow",
        )
        new_id = getattr(self._run, "id", None)
        if new_id and new_id != run_id:
            write_atomic(id_file, f"{new_id}\n")

    def log(self, record: dict[str, Any], step: int) -> None:
        self._run.log({k: v for k, v in record.items() if v is not None}, step=step)

    def finish(self) -> None:
        self._run.finish()


class _TensorBoardLogger:
    """The numeric step records as TensorBoard scalars under <run_dir>/tensorboard/."""

    def __init__(self, run_dir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise DllmError(
                "logging.tensorboard is set but tensorboard is not installed",
                hint="pip install 'turbo-dllm[tensorboard]', or remove logging.tensorboard",
            ) from None
        self._writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def log(self, record: dict[str, Any], step: int) -> None:
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                # an evaluation's numbers under eval/ (eval_loss -> eval/loss)
                tag = f"eval/{key[5:]}" if key.startswith("eval_") else f"train/{key}"
                self._writer.add_scalar(tag, value, global_step=step)

    def finish(self) -> None:
        self._writer.close()


class _Sinks:
    """Several remote loggers behind one log/finish."""

    def __init__(self, sinks: list) -> None:
        self._sinks = sinks

    def log(self, record: dict[str, Any], step: int) -> None:
        for sink in self._sinks:
            sink.log(record, step)

    def finish(self) -> None:
        for sink in self._sinks:
            sink.finish()


class MetricsLogger:
    """metrics.jsonl + console progress line + optional W&B; only rank 0 writes."""

    def __init__(
        self,
        run_dir: Path,
        spec,
        *,
        is_main: bool,
        total_steps: int,
        config: dict[str, Any] | None = None,
    ) -> None:
        self.spec = spec  # LoggingSpec
        self.is_main = is_main
        self.total_steps = total_steps
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / METRICS_NAME
        self.remote = (
            _remote_loggers(spec, self.run_dir, config or {}) if is_main else _NullLogger()
        )

    def truncate_after(self, step: int) -> None:
        """Drop lines of steps after `step` (written by a run that died after its checkpoint)."""
        if not (self.is_main and self.path.exists()):
            return
        kept = [r for r in read_metrics(self.run_dir) if r.get("step", 0) <= step]
        # whole or not at all: a resume killed here keeps the run's history
        write_atomic(self.path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))

    def log(self, record: dict[str, Any]) -> None:
        if not self.is_main:
            return
        step = int(record["step"])
        if self.spec.jsonl:
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(record, sort_keys=True) + "\n")
        every = step % self.spec.every == 0 or step == self.total_steps
        if self.spec.console and (every or "eval_loss" in record):
            print(self.console_line(record), file=sys.stderr, flush=True)
        self.remote.log(record, step)

    def console_line(self, r: dict[str, Any]) -> str:
        width = len(str(self.total_steps))
        parts = [
            f"step {r['step']:>{width}}/{self.total_steps}",
            f"loss {r['loss']:.4f}",
            f"lr {r['lr']:.2e}",
            f"gnorm {r['grad_norm']:.3f}",
            f"{r['tokens_per_s']:,.0f} tok/s",
        ]
        if r.get("mfu") is not None:
            parts.append(f"mfu {100 * r['mfu']:.1f}%")
        parts.append(f"mem {r['mem_gb']:.1f} GB")
        if r.get("eval_loss") is not None:
            parts.append(f"eval loss {r['eval_loss']:.4f} ({r['eval_time_s']:.1f} s)")
        return " | ".join(parts)

    def close(self) -> None:
        self.remote.finish()


def _remote_loggers(spec, run_dir: Path, config: dict[str, Any]):
    sinks: list = []
    if spec.wandb is not None:
        name = (config.get("launch") or {}).get("name") or run_dir.name
        sinks.append(_WandbLogger(spec.wandb, run_dir, name, config))
    if spec.tensorboard:
        sinks.append(_TensorBoardLogger(run_dir))
    return _Sinks(sinks) if sinks else _NullLogger()


class ProfilerWindow:
    """torch.profiler over steps [start_step, start_step + num_steps); per rank, a Chrome trace
    and a text table of the ops that took the most time (device time where CUDA ran)."""

    def __init__(self, spec, out_dir: Path, rank: int) -> None:
        self.enabled = spec.enabled
        self.start = spec.start_step
        self.stop = spec.start_step + spec.num_steps
        self.out_dir = Path(out_dir)
        self.rank = rank
        self._profiler = None

    def before_step(self, step: int) -> None:
        if self.enabled and step == self.start and self._profiler is None:
            import torch
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(ProfilerActivity.CUDA)
            self._profiler = profile(activities=activities, record_shapes=True, profile_memory=True)
            self._profiler.__enter__()

    def after_step(self, step: int) -> Path | None:
        if self._profiler is None or step + 1 < self.stop:
            return None
        self._profiler.__exit__(None, None, None)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        trace = self.out_dir / f"trace_rank{self.rank}_steps{self.start}-{self.stop - 1}.json"
        self._profiler.export_chrome_trace(str(trace))
        from torch.profiler import ProfilerActivity

        on_device = ProfilerActivity.CUDA in self._profiler.activities
        table = self._profiler.key_averages().table(
            sort_by="self_device_time_total" if on_device else "self_cpu_time_total",
            row_limit=40,
            max_name_column_width=60,
        )
        trace.with_name(trace.stem.replace("trace_", "ops_") + ".txt").write_text(table + "\n")
        self._profiler = None
        self.enabled = False
        return trace
