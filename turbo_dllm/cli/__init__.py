"""The `dllm` command line: argparse subcommands over the library API.

Every module in this package whose name does not start with `_` is a command group and defines
`register(subparsers)`, which adds its parser and sets `func` (args -> exit code). Handlers only
parse and print; the work lives in the library. Heavy imports (torch, datasets) stay inside the
handlers so `dllm --help` is instant.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence

from turbo_dllm import __version__
from turbo_dllm.errors import DllmError

__all__ = ["build_parser", "main"]


def _command_modules():
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            yield importlib.import_module(f"{__name__}.{info.name}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dllm",
        description="Train block-diffusion language models reproducibly.",
    )
    parser.add_argument("--version", action="version", version=f"dllm {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in _command_modules():
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        # A command group given without its subcommand prints that group's help.
        (getattr(args, "group_parser", None) or parser).print_help(sys.stderr)
        return 2
    try:
        return int(func(args) or 0)
    except DllmError as error:
        print(f"dllm: error: {error.message}", file=sys.stderr)
        if error.hint:
            print(f"hint: {error.hint}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("dllm: interrupted", file=sys.stderr)
        return 130
