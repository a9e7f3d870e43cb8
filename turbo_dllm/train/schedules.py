"""Learning-rate schedules as tiny functions of the step (multipliers of the peak lr).

Linear warmup from lr/warmup to lr over `warmup_steps`, then constant, linear or cosine decay
to `min_lr_ratio * lr` at the last step, or `wsd` (warmup-stable-decay): constant, then a linear
decay to `min_lr_ratio * lr` over the last `decay_fraction` of the steps after warmup, so the
run keeps the peak rate most of the way and still anneals at the end. Wrapped in a LambdaLR so
its state checkpoints.
"""

from __future__ import annotations

import math

__all__ = ["build_scheduler", "lr_multiplier", "resume_schedule"]


def lr_multiplier(
    step: int,
    *,
    name: str,
    warmup_steps: int,
    total_steps: int,
    min_lr_ratio: float,
    decay_fraction: float = 0.2,
) -> float:
    """The lr multiplier used for optimizer step `step` (0-based)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if name == "constant":
        return 1.0
    decay_steps = max(1, total_steps - warmup_steps - 1)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    if name == "linear":
        shape = 1.0 - progress
    elif name == "cosine":
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    elif name == "wsd":
        shape = min(1.0, (1.0 - progress) / decay_fraction)
    else:
        raise ValueError(f"unknown schedule {name!r}")
    return min_lr_ratio + (1.0 - min_lr_ratio) * shape


def build_scheduler(optimizer, spec, total_steps: int):
    """A LambdaLR over `spec` (a SchedulerSpec)."""
    from functools import partial

    from torch.optim.lr_scheduler import LambdaLR

    return LambdaLR(
        optimizer,
        partial(
            lr_multiplier,
            name=spec.name,
            warmup_steps=spec.warmup_steps,
            total_steps=total_steps,
            min_lr_ratio=spec.min_lr_ratio,
            decay_fraction=spec.decay_fraction,
        ),
    )


def resume_schedule(scheduler) -> None:
    """After a checkpoint restore: each group's rate for the next step from the scheduler's
    lambdas, which are rebuilt from this run's spec, as `step()` would have set it. The restored
    optimizer holds the saved run's rate, which differs where the schedule did (a resume with
    more `training.steps`: its first step ran at the old schedule's last rate)."""
    scheduler.last_epoch -= 1
    scheduler.step()  # recomputes lr = base_lr * lambda(last_epoch) for every group
