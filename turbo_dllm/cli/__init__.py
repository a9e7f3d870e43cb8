"""The `dllm` command line: argparse subcommands over the library API.

Every module in this package whose name does not start with `_` is a command group named like
the module and defines `register(subparsers)`, which adds its parser and sets `func`
(args -> exit code). Only the module of the command being run is imported. Handlers only
parse and print; the work lives in the library. Heavy imports (torch, datasets) stay inside the
handlers so `dllm --help` is instant.
"""

from __future__ import annotations

import argparse
import errno
import gc
import importlib
import os
import sys
from collections.abc import Sequence

from turbo_dllm import __version__
from turbo_dllm.errors import DllmError

__all__ = ["build_parser", "main"]


def command_names() -> list[str]:
    import pkgutil

    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def _is_command(name: str) -> bool:
    """Whether `name` is a command group, without listing them all (pkgutil imports inspect)."""
    import importlib.util

    if not name.isidentifier() or name.startswith("_"):
        return False
    return importlib.util.find_spec(f"{__name__}.{name}") is not None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser, or (with `only`) one holding just that command, for a faster start."""
    parser = argparse.ArgumentParser(
        prog="dllm",
        description="Train block-diffusion language models reproducibly.",
    )
    parser.add_argument("--version", action="version", version=f"dllm {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in [only] if only else command_names():
        importlib.import_module(f"{__name__}.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv_from_process = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(only=argv[0] if argv and _is_command(argv[0]) else None)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        fields = [arg for arg in unknown if "=" in arg and not arg.startswith("-")]
        hint = ""
        if fields and hasattr(args, "overrides"):  # a command that reads a YAML config
            hint = f" (a field is overridden with --set: {' '.join('--set ' + f for f in fields)})"
        parser.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")
    func = getattr(args, "func", None)
    if func is None:
        # A command group given without its subcommand prints that group's help.
        (getattr(args, "group_parser", None) or parser).print_help(sys.stderr)
        return 2
    if argv_from_process:
        # The `dllm` process itself (not a caller passing argv, such as a test): what start-up
        # made so far (modules, classes, the parser) lives until exit, so the cyclic GC need not
        # scan it again in every later full collection and at exit (~10 ms of a ~0.12 s
        # `dllm bundle install`). Garbage made later is still collected.
        gc.freeze()
    try:
        try:
            return int(func(args) or 0)
        finally:
            if argv_from_process and getattr(args, "quick_exit", False):
                # The same for what the command left alive: the interpreter's exit would scan
                # it all once more in a last full collection (~3 ms of a ~0.08 s `dllm bundle
                # install`: the modules the command imported, its results). Only for groups
                # whose commands close what they open (`group(..., quick_exit=True)`): cyclic
                # garbage still alive at exit is then not collected, its finalizers not run.
                gc.freeze()
    except DllmError as error:
        print(f"dllm: error: {error.message}", file=sys.stderr)
        if error.hint:
            print(f"hint: {error.hint}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("dllm: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `dllm ... | head` closed our stdout: stop quietly, like other Unix tools (128 + SIGPIPE).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except OSError as error:
        # The file system said no (permission denied, a path through a file, a full disk) where
        # no command foresaw it: the user's to fix, so a message naming the path, not a traceback.
        message, hint = describe_os_error(error)
        print(f"dllm: error: {message}", file=sys.stderr)
        print(f"hint: {hint}", file=sys.stderr)
        return 2


_OS_ERROR_HINTS = {
    errno.ENOSPC: "the disk is full: free some space and run it again",
    errno.EDQUOT: "your disk quota is used up: free some space and run it again",
    errno.EACCES: "check that path's permissions, or choose a path you can write",
    errno.EPERM: "check that path's permissions, or choose a path you can write",
    errno.EROFS: "that file system is read-only: choose a path on a writable one",
    errno.ENOTDIR: "a part of that path is a file, not a folder: choose another path",
    errno.EEXIST: "something already exists there: choose another path",
    errno.EISDIR: "that path is a folder where a file was expected: choose another path",
    errno.ENOENT: "a part of that path does not exist",
}


def describe_os_error(error: OSError) -> tuple[str, str]:
    """An OSError as (message, hint): the path(s) it names and the OS's reason."""
    reason = error.strerror or str(error) or type(error).__name__
    if error.filename is None:
        message = reason
    else:
        paths = [_path_text(error.filename)]
        if error.filename2 is not None:
            paths.append(_path_text(error.filename2))
        message = f"{' -> '.join(map(repr, paths))}: {reason}"
        if error.errno in (errno.ENOTDIR, errno.EEXIST):
            # mkdir through a file says "Not a directory" / "File exists": name that file.
            blocker = _file_in_the_way(paths[0])
            if blocker is not None:
                message += f" ({blocker!r} is a file, not a folder)"
    hint = _OS_ERROR_HINTS.get(
        error.errno, "a file-system error: check that path, its permissions and free space"
    )
    return message, hint


def _path_text(name) -> str:
    return os.fsdecode(name) if isinstance(name, (str, bytes, os.PathLike)) else str(name)


def _file_in_the_way(path: str) -> str | None:
    from pathlib import Path

    for candidate in (Path(path), *Path(path).parents):
        try:
            if candidate.exists():
                return None if candidate.is_dir() else str(candidate)
        except OSError:
            return None
    return None
