"""Worker shim for elastic jobs: size the data-parallel axis from the live world size, then train.

In an elastic launch (`--nnodes MIN:MAX`) torchrun may (re)start the worker group at any node
count in the range. Every other parallel degree is fixed by the spec; the elastic axis (dp, or
fsdp when the spec shards) takes whatever is left, so the topology always matches WORLD_SIZE.
Run as `python -m turbo_dllm.jobs.elastic --axis dp --config F --run-dir D`.
"""

from __future__ import annotations

import argparse
import os
import sys

__all__ = ["elastic_degree", "main"]


def elastic_degree(spec, axis: str, world_size: int) -> int:
    from turbo_dllm.errors import DllmError

    topo = spec.topology
    fixed = topo.world_size // getattr(topo, axis)
    if world_size % fixed:
        raise DllmError(
            f"elastic restart at world size {world_size}: not a multiple of the fixed "
            f"parallel degrees ({fixed})",
            hint="use a node count whose process count is a multiple of the fixed degrees",
        )
    return world_size // fixed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m turbo_dllm.jobs.elastic")
    parser.add_argument("--axis", choices=("dp", "fsdp"), required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("--run-dir", required=True)
    args = parser.parse_args(argv)

    from turbo_dllm.cli import main as dllm
    from turbo_dllm.config.load import load_runspec
    from turbo_dllm.errors import DllmError

    world = int(os.environ.get("WORLD_SIZE", "1"))
    try:
        degree = elastic_degree(load_runspec(args.config), args.axis, world)
    except DllmError as error:
        print(f"dllm: error: {error.message}", file=sys.stderr)
        if error.hint:
            print(f"hint: {error.hint}", file=sys.stderr)
        return 2
    override = f"topology.{args.axis}={degree}"
    return dllm(["train", "--config", args.config, "--run-dir", args.run_dir, "--set", override])


if __name__ == "__main__":
    raise SystemExit(main())
