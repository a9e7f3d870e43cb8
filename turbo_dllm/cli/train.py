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
    _check_recorded_spec(spec, run_dir)
    return train(spec, run_dir)


def _check_recorded_spec(spec, run_dir) -> None:
    """A run dir that `dllm launch` recorded resumes only with the spec its manifest holds:
    another one would append steps the manifest does not describe (`dllm run list`: 9/6)."""
    from turbo_dllm.jobs.manifest import MANIFEST_NAME, read_manifest, spec_sha256

    if not (run_dir / MANIFEST_NAME).is_file():
        return
    if read_manifest(run_dir).spec_sha256 != spec_sha256(spec.model_dump(mode="json")):
        from turbo_dllm.errors import DllmError

        raise DllmError(
            f"{run_dir} holds a run recorded by `dllm launch` with another spec",
            hint=f"resume it with its own spec (--config {run_dir / 'spec.yaml'}, no --set), "
            "or train into a new run dir",
        )
