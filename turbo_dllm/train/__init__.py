"""The block-diffusion trainer: models, attention, objectives, loop, checkpoints.

Importing this package is cheap and has no side effects: torch and friends are imported by the
submodules that need them. The worker entry is `turbo_dllm.train.entry.train(spec, run_dir)`.
"""

__all__: list[str] = []
