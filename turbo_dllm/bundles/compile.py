"""Compile one native op into a shared library with torch.utils.cpp_extension (ninja).

Both paths that build kernels use this: `dllm bundle build` (run in a child process through
`python -m turbo_dllm.kernels.build_op`, so the builder never holds a half-loaded library and the
child proves the library loads and matches the reference) and the `jit` backend (in-process).

Every build gets its own torch.ops namespace (`-DTURBO_DLLM_NS=...`): torch lets one process
register a namespace once, so distinct builds (a bundle and a JIT build, two bundles) can then
live in one process side by side.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from turbo_dllm.bundles.native import NativeOp
from turbo_dllm.errors import DllmError
from turbo_dllm.host import GpuArch

__all__ = [
    "CompiledOp",
    "check_ninja_paths",
    "compile_op",
    "namespace_for",
    "run_compile_subprocess",
]

CXX_FLAGS = ("-O3",)
CUDA_FLAGS = ("-O3", "-lineinfo")


@dataclass(frozen=True)
class CompiledOp:
    """What a build produced and how: the provenance a bundle records."""

    op: str
    namespace: str
    library: str  # path of the shared library
    source_sha256: str
    devices: tuple[str, ...]
    archs: tuple[str, ...]
    cxx: str
    nvcc: str | None
    cflags: tuple[str, ...]
    cuda_cflags: tuple[str, ...]


def namespace_for(source_sha256: str, flavour: str, identity: str) -> str:
    """A torch.ops namespace unique to (sources, build flavour, target or JIT key)."""
    digest = hashlib.sha256(f"{source_sha256}|{flavour}|{identity}".encode()).hexdigest()
    return f"turbo_dllm_{flavour}_{digest[:12]}"


@contextlib.contextmanager
def _arch_list(archs: tuple[GpuArch, ...]):
    previous = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if archs:
        os.environ["TORCH_CUDA_ARCH_LIST"] = ";".join(a.capability for a in archs)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
        else:
            os.environ["TORCH_CUDA_ARCH_LIST"] = previous


def _first_line(command: list[str], last: bool = False) -> str | None:
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [line.strip() for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode != 0 or not lines:
        return None
    return lines[-1] if last else lines[0]


# Characters torch writes into build.ninja unescaped (it escapes only spaces in source paths):
# ninja reads `$x` as a variable, so `/src/a$b/op.cpp` became `/src/a/op.cpp`, "missing and no
# known rule to make it". The build folder and our own flags are escaped (`_for_ninja`).
NINJA_SPECIAL = ("$",)


def check_ninja_paths(op: NativeOp, archs: tuple[GpuArch, ...] = ()) -> None:
    """Refuse, before compiling, to build `op` when a path torch writes into build.ninja as it
    is (the op's sources and folder, torch's and Python's include and library folders) holds a
    character ninja reads as syntax: the compiler failed with a misleading error instead."""
    import sysconfig

    from torch.utils import cpp_extension

    device = "cuda" if archs else "cpu"
    sources = [*op.cpu_source_paths(), *(op.cuda_source_paths() if archs else [])]
    ours = [str(op.directory.absolute()), *(str(p.absolute()) for p in sources)]
    python_include = sysconfig.get_path("include", scheme="posix_prefix")
    theirs = [
        *cpp_extension.include_paths(device),
        *cpp_extension.library_paths(device),
        *([python_include] if python_include else []),
    ]
    for paths, where in ((ours, "source"), (theirs, "environment")):
        for path in paths:
            bad = [c for c in NINJA_SPECIAL if c in path]
            if not bad:
                continue
            if where == "source":
                fix = (
                    f"move the checkout to a path without {bad[0]!r} (or install turbo-dllm "
                    "without -e, so its sources live in the environment's site-packages)"
                )
            else:
                fix = f"make the Python environment at a path without {bad[0]!r}"
            raise DllmError(
                f"cannot build native op {op.name!r}: the path {path} holds {bad[0]!r}, which "
                "torch's build.ninja does not escape (ninja would read it as a variable and "
                "compile a file that does not exist)",
                hint=fix,
            )


def compile_op(
    op: NativeOp,
    *,
    namespace: str,
    build_dir: Path,
    archs: tuple[GpuArch, ...] = (),
    verbose: bool = False,
) -> CompiledOp:
    """Build `op` (CUDA too when `archs` is not empty) into `build_dir` and load it here."""
    import torch
    from torch.utils import cpp_extension

    if shutil.which("ninja") is None and not _has_ninja_module():
        raise DllmError("building kernels needs ninja", hint="pip install ninja")
    if archs and torch.version.cuda is None:
        raise DllmError(
            f"cannot build CUDA kernels for {'+'.join(map(str, archs))}: this torch "
            f"({torch.__version__}) has no CUDA",
            hint="install a CUDA build of torch, or build the CPU target",
        )
    if archs and cpp_extension.CUDA_HOME is None:
        raise DllmError(
            "cannot build CUDA kernels: nvcc not found",
            hint="set CUDA_HOME to the CUDA toolkit matching torch.version.cuda",
        )
    check_ninja_paths(op, archs)
    define = f"-DTURBO_DLLM_NS={namespace}"
    cflags = (*CXX_FLAGS, define)
    cuda_cflags = (*CUDA_FLAGS, define) if archs else ()
    reproducible = _reproducible_flags(op, build_dir)
    sources = [str(p) for p in op.cpu_source_paths()]
    if archs:
        sources += [str(p) for p in op.cuda_source_paths()]
    build_dir.mkdir(parents=True, exist_ok=True)
    name = f"{namespace}_{op.name}"
    with _arch_list(archs):
        try:
            library = cpp_extension.load(
                name=name,
                sources=sources,
                extra_cflags=[*cflags, *map(_for_ninja, reproducible)],
                extra_cuda_cflags=(
                    [*cuda_cflags, *map(_for_ninja, _for_nvcc(reproducible))] if archs else []
                ),
                extra_include_paths=[str(op.directory)],
                build_directory=str(build_dir),
                with_cuda=bool(archs),
                is_python_module=False,
                verbose=verbose,
            )
        except (RuntimeError, subprocess.CalledProcessError) as error:
            raise DllmError(
                f"building native op {op.name!r} failed: {str(error).strip()[-2000:]}",
                hint="run again with --verbose for the compiler output; check that the C++ "
                "compiler (and nvcc) match torch's requirements",
            ) from None
    nvcc = None
    if archs and cpp_extension.CUDA_HOME:
        nvcc = _first_line(
            [str(Path(cpp_extension.CUDA_HOME) / "bin" / "nvcc"), "--version"], last=True
        )
    cxx = cpp_extension.get_cxx_compiler()
    return CompiledOp(
        op=op.name,
        namespace=namespace,
        library=str(library or build_dir / f"{name}.so"),
        source_sha256=op.source_sha256(),
        devices=("cpu", "cuda") if archs else ("cpu",),
        archs=tuple(str(a) for a in archs),
        cxx=_first_line([cxx, "--version"]) or cxx,
        nvcc=nvcc,
        cflags=cflags,
        cuda_cflags=cuda_cflags,
    )


def _reproducible_flags(op: NativeOp, build_dir: Path) -> list[str]:
    """Flags that keep this host's folders out of the library, so two builds of the same sources
    with the same toolchain are byte-identical wherever they ran: `__FILE__` in torch's and our
    headers (assert messages) would otherwise embed the site-packages, source and build paths.
    `-Werror=date-time` refuses `__DATE__`/`__TIME__`. Not recorded in the bundle's cflags: they
    name the build host's paths, which is exactly what a bundle must not carry."""
    import torch

    maps = {
        Path(torch.__file__).parent: "torch",
        op.directory: f"native/{op.name}",
        build_dir: "build",
    }
    # Both spellings of each folder: the compiler sees paths as given (through _data/ links).
    spellings = {
        (str(form), name) for path, name in maps.items() for form in (path, path.resolve())
    }
    return [
        *(f"-ffile-prefix-map={p}={name}" for p, name in sorted(spellings)),
        "-Werror=date-time",
    ]


def _for_ninja(flag: str) -> str:
    """`flag` as torch's build.ninja needs it: torch writes extra flags into the compile command
    as they are, which ninja hands to `sh -c`, so a folder with a space (a DLLM_HOME or checkout
    like `/data/my home`) split `-ffile-prefix-map=/data/my home/...=build` in two and the build
    failed ("invalid argument '/data/my' to '-ffile-prefix-map'"). Quoted for the shell, and
    `$` doubled for ninja. The compiler gets the same argument, so the library is unchanged."""
    import shlex

    return shlex.quote(flag).replace("$", "$$")


def _for_nvcc(flags: list[str]) -> list[str]:
    """nvcc passes host-compiler flags through -Xcompiler."""
    return [part for flag in flags for part in ("-Xcompiler", flag)]


def _has_ninja_module() -> bool:
    try:
        from torch.utils.cpp_extension import is_ninja_available

        return is_ninja_available()
    except ImportError:
        return False


def run_compile_subprocess(
    op_name: str,
    *,
    namespace: str,
    build_dir: Path,
    archs: tuple[GpuArch, ...],
    verbose: bool = False,
) -> CompiledOp:
    """Compile in a child Python, which also loads the library and checks it against the
    reference (forward and backward); compiler output goes to our stderr."""
    result_file = build_dir / "compiled.json"
    build_dir.mkdir(parents=True, exist_ok=True)
    result_file.unlink(missing_ok=True)
    command = [
        sys.executable,
        "-m",
        "turbo_dllm.kernels.build_op",  # compile, then the op's self-test, in a fresh process
        "--op",
        op_name,
        "--namespace",
        namespace,
        "--build-dir",
        str(build_dir),
        "--result",
        str(result_file),
        *(["--archs", ",".join(map(str, archs))] if archs else []),
        *(["--verbose"] if verbose else []),
    ]
    proc = subprocess.run(command, stdout=sys.stderr, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0 or not result_file.is_file():
        message = proc.stderr.strip()
        hint = "run with --verbose for the full compiler output"
        marker = "dllm: error: "
        if marker in message:  # the child's own DllmError, already phrased for users
            message = message[message.index(marker) + len(marker) :]
            # Said once: the child's error starts as ours does and ends with its own hint.
            message = message.removeprefix(f"building native op {op_name!r} failed: ")
            body, found, child_hint = message.rpartition("\nhint: ")
            if found:
                message, hint = body, child_hint.strip()
        raise DllmError(f"building native op {op_name!r} failed:\n{message[-4000:]}", hint=hint)
    data = json.loads(result_file.read_text())
    return CompiledOp(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})
