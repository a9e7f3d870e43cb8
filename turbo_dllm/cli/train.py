"""`dllm train --config F [--run-dir D] [--set k=v]`: run the trainer in this process.

Under `torchrun --nproc-per-node N -m turbo_dllm train ...` every rank runs this same command.
"""

from __future__ import annotations

from turbo_dllm.cli._output import add_overrides


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "train",
        help="train a RunSpec in this process (or on every torchrun rank)",
        description="Train a RunSpec. Resumes from the latest checkpoint in the run directory.",
    )
    p.add_argument("--config", required=True, help="RunSpec YAML")
    p.add_argument(
        "--run-dir",
        default=None,
        help="run directory (default: launch.run_dir, else runs/<UTC stamp>-<id>)",
    )
    add_overrides(p)
    p.set_defaults(func=_train)


def _train(args) -> int:
    from turbo_dllm.config.load import load_runspec
    from turbo_dllm.train.entry import resolve_run_dir, train, world_size_from_env

    spec = load_runspec(args.config, args.overrides, world_size=world_size_from_env())
    from turbo_dllm.jobs.launcher import check_inputs

    check_inputs(spec, args.config)  # before the run dir exists
    run_dir = resolve_run_dir(spec, args.run_dir)
    return train(spec, run_dir)
