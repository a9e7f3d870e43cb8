"""The `dllm` command line: argparse subcommands over the library API.

Every module in this package whose name does not start with `_` is a command group named like
the module and defines `register(subparsers)`, which adds its parser and sets `func`
(args -> exit code). Only the module of the command being run is imported. Handlers only
parse and print; the work lives in the library. Heavy imports (torch, datasets) stay inside the
handlers so `dllm --help` is instant.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
from collections.abc import Sequence

from turbo_dllm import __version__
from turbo_dllm.errors import DllmError, describe_os_error, print_error

__all__ = ["STARTED_UNDER", "build_parser", "main"]

# The `dllm` process's parent as it started (read first thing, before any heavy import): under a
# hand-run torchrun that is torchrun, which `dllm train` then stops with (cli/train.py). None
# where `main` was called with argv (a caller in-process, such as a test).
STARTED_UNDER: int | None = None


def command_names() -> list[str]:
    import pkgutil

    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def _is_command(name: str) -> bool:
    """Whether `name` is a command group, without listing them all (pkgutil imports inspect)."""
    import importlib.util

    if not name.isidentifier() or name.startswith("_"):
        return False
    return importlib.util.find_spec(f"{__name__}.{name}") is not None


class _Parser(argparse.ArgumentParser):
    """argparse's parser (every subcommand's is one too), whose usage errors (exit 2) also say
    where the command's arguments are listed, and under `--json` also print the one JSON
    object `--json` promises (`{"error": ..., "hint": ...}`), as every other error does."""

    json_errors = False  # set by `main` when its argv asks for --json

    def error(self, message: str):
        from turbo_dllm.cli._output import emit_json_error

        hint = f"`{self.prog} --help` lists its arguments"
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}\nhint: {hint}", file=sys.stderr)
        if _Parser.json_errors:
            emit_json_error(message, hint)
        self.exit(2)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser, or (with `only`) one holding just that command, for a faster start."""
    parser = _Parser(
        prog="dllm",
        description="Train block-diffusion language models reproducibly.",
    )
    parser.add_argument("--version", action="version", version=f"dllm {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in [only] if only else command_names():
        importlib.import_module(f"{__name__}.{name}").register(subparsers)
    return parser


def _command_line(args) -> str:
    """`dllm GROUP SUB` (or `dllm COMMAND`) of the parsed `args`."""
    command = getattr(args, "command", None)
    sub = getattr(args, f"{command}_command", None) if command else None
    return " ".join(word for word in ("dllm", command, sub) if word)


def _command_parser(parser: argparse.ArgumentParser, args) -> argparse.ArgumentParser:
    """The parser of the command `args` parsed as (`dllm run plot`'s), down from `parser`."""
    command = getattr(args, "command", None)
    for name in (command, getattr(args, f"{command}_command", None)):
        found = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not found or name not in found[0].choices:
            break
        parser = found[0].choices[name]
    return parser


def _broken_package_metadata(error: BaseException) -> list[str]:
    """The packages whose entry_points.txt cannot be parsed, where `error` was raised while
    importlib.metadata parsed one (else nothing: `error` is not about package metadata)."""
    import traceback

    frames = traceback.extract_tb(error.__traceback__)
    if not any("importlib/metadata" in frame.filename.replace(os.sep, "/") for frame in frames):
        return []
    from turbo_dllm.plugins import unreadable_packages

    return unreadable_packages()


def _keep_undecodable_bytes() -> None:
    """A path that is not UTF-8 (a folder named in Latin-1) reaches Python as text holding
    surrogates; a stdout with strict errors (PYTHONIOENCODING=utf-8:strict, some locales)
    ended the command with a UnicodeEncodeError traceback where it printed one. Such text is
    written back as the bytes it came from, as `ls` shows them."""
    for stream in (sys.stdout, sys.stderr):
        if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="surrogateescape")


def _current_folder_gone() -> tuple[str, str] | None:
    """The error (message, hint) of a current folder that was deleted (or moved) while the
    shell sat in it, else None. Every relative path is taken against it, and importing torch
    there ended the process in MKL's 'oneMKL FATAL ERROR: Cannot load libtorch_cpu.so', exit
    2 with no word from dllm; said before any command starts."""
    try:
        os.getcwd()
    except FileNotFoundError:
        was = os.environ.get("PWD")
        return (
            "the current folder no longer exists" + (f" ({was})" if was else ""),
            "cd to an existing folder and run the command again",
        )
    return None


def main(argv: Sequence[str] | None = None) -> int:
    global STARTED_UNDER
    argv_from_process = argv is None
    if argv_from_process:
        STARTED_UNDER = os.getppid()
    argv = list(sys.argv[1:] if argv is None else argv)
    from turbo_dllm.cli._output import emit_json_error, reset_json

    reset_json()
    if argv_from_process:  # the process's own streams; a caller passing argv owns its streams
        _keep_undecodable_bytes()
    _Parser.json_errors = "--json" in argv
    parser = build_parser(only=argv[0] if argv and _is_command(argv[0]) else None)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        fields = [arg for arg in unknown if "=" in arg and not arg.startswith("-")]
        hint = ""
        if fields and hasattr(args, "overrides"):  # a command that reads a YAML config
            hint = f" (a field is overridden with --set: {' '.join('--set ' + f for f in fields)})"
        # The command's own parser says it (its usage, its --help): the top-level one named
        # `dllm --help`, which lists the commands, not what `dllm run plot` takes.
        _command_parser(parser, args).error(f"unrecognized arguments: {' '.join(unknown)}{hint}")
    func = getattr(args, "func", None)
    if func is None:
        # A command group given without its subcommand prints that group's help.
        (getattr(args, "group_parser", None) or parser).print_help(sys.stderr)
        return 2
    gone = _current_folder_gone()
    if gone is not None:
        print_error(*gone)
        if getattr(args, "json", False):
            emit_json_error(*gone)
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
        # Every error a user can fix has a hint line (README); one raised without a hint points
        # at the command's help rather than leaving the line out.
        hint = error.hint or f"`{_command_line(args)} --help` describes what it takes"
        print_error(error.message, hint)
        if getattr(args, "json", False):
            emit_json_error(error.message, hint)  # `--json`: one object, failures too
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
        print_error(message, hint)
        if getattr(args, "json", False):
            emit_json_error(message, hint)
        return 2
    except Exception as error:
        broken = _broken_package_metadata(error)
        if not broken:
            raise  # a bug: its traceback
        message = (
            "installed package metadata cannot be read, so nothing that lists entry points "
            f"(pydantic, dllm's plugins) can start: {'; '.join(broken)}"
        )
        hint = (
            "reinstall that package (pip install --force-reinstall NAME) or uninstall it; each "
            "line of an entry_points.txt section is `name = module:attribute`"
        )
        print_error(message, hint)
        if getattr(args, "json", False):
            emit_json_error(message, hint)
        return 2
