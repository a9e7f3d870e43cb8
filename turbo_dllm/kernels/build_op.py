"""`python -m turbo_dllm.kernels.build_op`: compile one native op and run its self-test.

The bundle builder (`turbo_dllm.bundles.compile.run_compile_subprocess`) runs this in a fresh
process per op, so it never holds a half-loaded library; the self-test lives with the op registry.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from turbo_dllm.bundles.compile import compile_op
from turbo_dllm.bundles.native import load_native_op
from turbo_dllm.errors import DllmError, print_error
from turbo_dllm.host import GpuArch


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m turbo_dllm.kernels.build_op")
    parser.add_argument("--op", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--build-dir", required=True, type=Path)
    parser.add_argument("--result", required=True, type=Path)
    parser.add_argument("--archs", default="")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    archs = tuple(GpuArch.parse(a) for a in args.archs.split(",") if a)
    try:
        compiled = compile_op(
            load_native_op(args.op),
            namespace=args.namespace,
            build_dir=args.build_dir,
            archs=archs,
            verbose=args.verbose,
        )
        from turbo_dllm.kernels.selftest import self_test

        self_test(args.op, args.namespace, cuda=bool(archs))
    except DllmError as error:
        print_error(error.message, error.hint)
        return 2
    args.result.write_text(json.dumps(asdict(compiled), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
