"""Probes that read facts about this machine without importing torch or initializing CUDA.

Why so careful: `dllm bundle install` runs on login nodes and inside launchers, where importing
torch costs seconds and touching CUDA can grab a GPU or break a later fork. Everything here reads
files, package metadata or `nvidia-smi`; torch is consulted directly only when the caller has
already imported it.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sys
from pathlib import Path
from typing import NamedTuple

__all__ = [
    "GpuProbe",
    "TorchFacts",
    "probe_driver",
    "probe_glibc",
    "probe_gpus",
    "probe_package_version",
    "probe_torch",
    "process_stat",
    "run_nvidia_smi",
    "start_gpu_probe",
]

NVIDIA_SMI_TIMEOUT_S = 15.0


def process_stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat's fields from the third (the state) on, so field N is [N - 3]; None where
    the process does not exist or /proc cannot be read. Field 2, the command name, is in
    parentheses and may hold spaces and parentheses itself: the last ')' ends it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split()


class TorchFacts(NamedTuple):
    version: str | None
    cuda: str | None
    cxx11_abi: bool | None
    notes: tuple[str, ...] = ()


def probe_torch() -> TorchFacts:
    """torch's version, CUDA build and C++11 ABI flag, read from its files.

    The version and CUDA build come from `torch/version.py` (parsed, not imported). The ABI flag
    is exact when torch is already imported; otherwise it is read from the symbol names in
    `libc10.so` (`std::__cxx11::basic_string` appears only in the new ABI).
    """
    loaded = sys.modules.get("torch")
    if loaded is not None and hasattr(loaded, "_C"):
        return TorchFacts(
            loaded.__version__,
            loaded.version.cuda,
            bool(loaded._C._GLIBCXX_USE_CXX11_ABI),
        )
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return TorchFacts(None, None, None)
    root = Path(spec.origin).parent
    notes: list[str] = []
    version, cuda = _read_torch_version_file(root / "version.py")
    if version is None:
        from importlib.metadata import PackageNotFoundError
        from importlib.metadata import version as distribution_version

        try:
            version = distribution_version("torch")
        except PackageNotFoundError:
            notes.append(f"cannot read torch's version from {root}")
    abi = _abi_from_libc10(root / "lib")
    if abi is None and version is not None:
        notes.append("C++ ABI of torch unknown (libc10 not found)")
    return TorchFacts(version, cuda, abi, tuple(notes))


# `name = 'text'` or `name: Optional[str] = None` at the start of a line: how torch's build
# writes version.py (a regex instead of `ast`, which would cost an install ~1 ms to import).
_VERSION_ASSIGNMENT = re.compile(
    r"""^(?P<name>__version__|cuda)[ \t]*(?::[^=\n]*)?=[ \t]*"""
    r"""(?:(?P<quote>['"])(?P<text>[^'"\\\n]*)(?P=quote)|None)[ \t]*(?:#.*)?$""",
    re.MULTILINE,
)


def _read_torch_version_file(path: Path) -> tuple[str | None, str | None]:
    """`__version__` and `cuda` from torch's version.py, read as text, never executed."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, ValueError):
        return None, None
    values = {m["name"]: m["text"] for m in _VERSION_ASSIGNMENT.finditer(text)}
    return values.get("__version__"), values.get("cuda")


def _abi_from_libc10(libdir: Path) -> bool | None:
    import mmap

    for name in ("libc10.so", "libc10.dylib"):
        path = libdir / name
        if not path.is_file():
            continue
        try:
            with (
                path.open("rb") as handle,
                mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data,
            ):
                return data.find(b"St7__cxx1112basic_string") >= 0
        except (OSError, ValueError):
            return None
    return None


def probe_glibc() -> str | None:
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION")  # "glibc 2.36"
    except (AttributeError, ValueError, OSError):
        return None
    if not text or not text.startswith("glibc "):
        return None
    return text.split()[1]


def probe_package_version(*names: str) -> str | None:
    """The version of the first installed distribution among `names`, in `sys.path` order.

    Read from the `<name>-<version>.dist-info` folder names (what pip, uv and conda write), which
    is all `importlib.metadata.version` would open here, without importing it (~25 ms).
    """
    found: dict[str, str] = {}
    for entry in sys.path:
        for folder in _dist_info_folders(entry or "."):
            name, _, version = folder[: -len(".dist-info")].partition("-")
            found.setdefault(_normalize(name), version)
    return next((found[n] for n in map(_normalize, names) if n in found), None)


def _normalize(name: str) -> str:
    """PEP 503 normalization, which also matches the escaped names of dist-info folders."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _dist_info_folders(entry: str) -> list[str]:
    try:
        names = os.listdir(entry)
    except OSError:  # not a folder (a zip, a missing path)
        return []
    return [name for name in names if name.endswith(".dist-info") and "-" in name]


_DRIVER_VERSION = re.compile(r"\d+(?:\.\d+)+")
_PROC_DRIVER = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+(?:\.\d+)+)")


def probe_driver(
    sys_path: Path = Path("/sys/module/nvidia/version"),
    proc_path: Path = Path("/proc/driver/nvidia/version"),
) -> str | None:
    """The NVIDIA kernel driver version, in the order uv uses: /sys, /proc, then nvidia-smi."""
    try:
        text = sys_path.read_text().strip()
        if text:
            return text
    except (OSError, ValueError):  # ValueError: not UTF-8
        pass
    try:
        match = _PROC_DRIVER.search(proc_path.read_text())
        if match:
            return match.group(1)
    except (OSError, ValueError):
        pass
    lines, _ = run_nvidia_smi(["--query-gpu=driver_version", "--format=csv,noheader"])
    version = lines[0].strip() if lines else ""
    return version if _DRIVER_VERSION.fullmatch(version) else None  # not "[N/A]" or noise


class GpuProbe(NamedTuple):
    gpus: tuple[tuple[int, str, str], ...]  # (index, name, compute capability "9.0")
    notes: tuple[str, ...] = ()


_GPU_QUERY = ("--query-gpu=index,name,compute_cap,uuid", "--format=csv,noheader")
_started_gpu_query = None  # the nvidia-smi process start_gpu_probe began, until probe_gpus reads it
# nvidia-smi binaries that did not answer in time in this process: not asked again (a hung
# driver hangs every query; one command fingerprints the host several times).
_HUNG: set[str] = set()


def start_gpu_probe() -> None:
    """Begin `probe_gpus`'s nvidia-smi query now, without waiting for it.

    nvidia-smi takes ~25 ms even with the driver persistent (on an H200 host: about a tenth of a
    whole bundle install), almost all of it waiting on the driver; a command that will
    fingerprint the host starts it first, so that wait overlaps its imports and catalog fetch.
    """
    global _started_gpu_query
    binary = shutil.which("nvidia-smi")
    if binary is None or _started_gpu_query is not None or binary in _HUNG:
        return
    try:
        _started_gpu_query = (binary, _start(binary, list(_GPU_QUERY)))
    except OSError:
        _started_gpu_query = None


def _gpu_query_lines() -> tuple[list[str] | None, str | None]:
    global _started_gpu_query
    started, _started_gpu_query = _started_gpu_query, None
    if started is None:
        return run_nvidia_smi(list(_GPU_QUERY))
    return _finish(*started)


def probe_gpus() -> GpuProbe:
    """Every GPU this process can see (CUDA_VISIBLE_DEVICES applied), via nvidia-smi."""
    if shutil.which("nvidia-smi") is None and _started_gpu_query is None:
        return GpuProbe(())
    lines, problem = _gpu_query_lines()
    if lines is None:
        return GpuProbe((), (f"nvidia-smi is installed but {problem}; GPU list unknown",))
    rows = []
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4 or not parts[0].isdigit():
            return GpuProbe((), (f"unexpected nvidia-smi output: {line[:200]!r}",))
        rows.append((int(parts[0]), parts[1], parts[2], parts[3]))
    visible = _apply_visible_devices(rows, os.environ.get("CUDA_VISIBLE_DEVICES"))
    return GpuProbe(tuple((index, name, cap) for index, name, cap, _ in visible))


def _apply_visible_devices(rows: list, setting: str | None) -> list:
    """CUDA's rule: list order, indices or UUID prefixes, stop at the first unknown entry."""
    if setting is None:
        return rows
    chosen = []
    for token in (t.strip() for t in setting.split(",")):
        match = None
        if token.isdigit():
            match = next((r for r in rows if r[0] == int(token)), None)
        elif token.startswith("GPU-"):
            found = [r for r in rows if r[3].startswith(token)]
            match = found[0] if len(found) == 1 else None
        if match is None or match in chosen:
            break
        chosen.append(match)
    return chosen


def run_nvidia_smi(arguments: list[str]) -> tuple[list[str] | None, str | None]:
    """(non-empty output lines, None), or (None, what went wrong: "is not installed", "did not
    answer within 15 s", "exited with status 9: <its message>"). Never waits longer than
    NVIDIA_SMI_TIMEOUT_S, and a binary that timed out once is not asked again."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return None, "is not installed"
    if binary in _HUNG:
        return None, _no_answer()
    try:
        process = _start(binary, arguments)
    except OSError as error:
        return None, f"cannot be run ({error.strerror or error})"
    return _finish(binary, process)


def _start(binary: str, arguments: list[str]):
    import subprocess

    # Its own session: a timeout kills the whole group, so no child of a wrapper script keeps
    # the output pipes open (reading them would then wait for that child).
    return subprocess.Popen(
        [binary, *arguments],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def _finish(binary: str, process) -> tuple[list[str] | None, str | None]:
    import subprocess

    try:
        stdout, stderr = process.communicate(timeout=NVIDIA_SMI_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _HUNG.add(binary)
        _kill(process)
        return None, _no_answer()
    except BaseException:  # Ctrl-C while it runs (its own session does not get the SIGINT)
        _kill(process)
        raise
    if process.returncode != 0:
        message = _decode(stderr).strip() or _decode(stdout).strip()
        message = message.splitlines()[0][:200] if message else "no message"
        return None, f"exited with status {process.returncode}: {message}"
    return [line for line in _decode(stdout).splitlines() if line.strip()], None


def _kill(process) -> None:
    """End the process and everything it started; wait for it only, never for its pipes."""
    import signal

    try:
        os.killpg(process.pid, signal.SIGKILL)
    except OSError:  # already gone
        pass
    process.wait()
    for pipe in (process.stdout, process.stderr):
        if pipe is not None:
            pipe.close()


def _no_answer() -> str:
    return f"did not answer within {NVIDIA_SMI_TIMEOUT_S:g} s"


def _decode(data: bytes | None) -> str:
    return (data or b"").decode("utf-8", errors="replace")
