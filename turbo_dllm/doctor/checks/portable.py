"""Portable checks: they hold on any host, with or without a GPU."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

from turbo_dllm.doctor import CheckResult, DoctorContext, register_check
from turbo_dllm.doctor.folders import checkpoint_dir_problem, folder_problem
from turbo_dllm.fsutil import file_system, human_size
from turbo_dllm.paths import dllm_home

MIN_PYTHON = (3, 10)
MIN_FREE_BYTES = 2 * 1024**3  # less is a warning
FULL_BYTES = 1024**2  # less is a full disk: a failure


@register_check(order=10, name="python")
def python_version(ctx: DoctorContext) -> CheckResult:
    version = ".".join(map(str, sys.version_info[:3]))
    if sys.version_info[:2] < MIN_PYTHON:
        return CheckResult(
            "python",
            "fail",
            f"Python {version} at {sys.executable}",
            fix="use Python >= 3.10 (e.g. `uv venv --python 3.12`)",
        )
    return CheckResult("python", "pass", f"Python {version} at {sys.executable}")


@register_check(order=20, name="torch")
def torch_import(ctx: DoctorContext) -> CheckResult:
    try:
        import torch
    except Exception as error:  # any import failure is what this check reports
        return CheckResult("torch", "fail", f"import torch failed: {error}", fix=_torch_fix())
    cuda = torch.version.cuda or "cpu"
    return CheckResult("torch", "pass", f"torch {torch.__version__} ({cuda})")


def _torch_fix() -> str:
    """How to install torch into this environment: a venv `dllm env sync` made gets its pinned
    torch back from the manifest it was synced to (uv made it: it has no pip); another venv is
    named as the one to sync (it was `--venv .venv`, wherever doctor ran: a new venv there)."""
    from turbo_dllm.envs.select import recorded_manifest_path

    venv = shlex.quote(sys.prefix)
    copy = recorded_manifest_path(sys.prefix)
    if sys.prefix != sys.base_prefix and copy.is_file():
        return (
            f"dllm env sync --manifest {shlex.quote(str(copy))} --venv {venv} (reinstalls the "
            "torch this venv was synced with)"
        )
    pinned = (
        f"dllm env sync --venv {venv}"
        if sys.prefix != sys.base_prefix
        else ("dllm env sync --venv .venv")
    )
    # The torch this host can use (it was the CPU build first on every host: pasted on a GPU
    # host, a torch without CUDA), into this interpreter's environment whether it is activated
    # or not; the rest is a shell comment, so the whole line pastes.
    build = (
        "PyPI's CUDA build, for this host's NVIDIA driver"
        if _nvidia_driver()
        else "the CPU build (plain `pip install torch` is PyPI's CUDA one)"
    )
    return (
        f"{shlex.quote(sys.executable)} -m {_torch_install()}   # {build}; another build: "
        f"docs/install.md; pinned: {pinned}"
    )


@register_check(order=30, name="venv")
def venv_isolation(ctx: DoctorContext) -> CheckResult:
    in_venv = sys.prefix != sys.base_prefix or "CONDA_PREFIX" in os.environ
    if in_venv:
        return CheckResult("venv", "pass", f"isolated environment at {sys.prefix}")
    status = "fail" if ctx.prod else "warn"
    return CheckResult(
        "venv",
        status,
        f"running in the system interpreter {sys.prefix}",
        # The venv needs dllm itself: activated without it, `dllm` is still this interpreter's.
        # torch first, in the command (a note after it read "(torch first", which pasted was a
        # syntax error): the CUDA build (PyPI's) on a host with an NVIDIA driver, else the CPU
        # one (PyPI's would pull gigabytes of CUDA libraries); the rest is a shell comment, so
        # the whole line pastes.
        fix=f"python3 -m venv .venv && . .venv/bin/activate && {_torch_install()} && pip "
        "install 'turbo-dllm[data,env]'   # torch for this host (another build: docs/install.md); "
        "or pinned: dllm env sync --venv .venv, then install turbo-dllm into it and activate it",
    )


def _torch_install() -> str:
    """The pip line for the torch this host can use: PyPI's (CUDA) where an NVIDIA driver is
    loaded, the CPU build elsewhere (doctor's venv fix offered the CPU build to GPU hosts)."""
    if _nvidia_driver():
        return "pip install torch"
    return "pip install torch --index-url https://download.pytorch.org/whl/cpu"


def _nvidia_driver() -> bool:
    return Path("/proc/driver/nvidia").exists() or shutil.which("nvidia-smi") is not None


def _writable(path: Path) -> str | None:
    """Why no file can be made in the folder `path` (which exists), or None."""
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".dllm-write-test-"):
            pass
    except OSError as error:
        return str(error)
    return None


@register_check(order=40)
def cache_dir(ctx: DoctorContext) -> CheckResult:
    home = dllm_home()
    # What is in the way, said as such: a file (mkdir would say "File exists"), a read-only
    # mount or a kernel file system (the write test said "[Errno 30] ..." or "[Errno 2] No such
    # file or directory" of /proc/x), a folder without write permission.
    problem = folder_problem(home)
    if problem is not None:
        return CheckResult(
            "cache dir", "fail", f"{home}: {problem.detail}", fix=problem.fix("set DLLM_HOME")
        )
    error = _writable(home) if home.exists() else None
    if error:
        return CheckResult(
            "cache dir",
            "fail",
            f"{home} is not writable: {error}",
            fix="set DLLM_HOME to a writable folder",
        )
    if not home.is_absolute():
        # (it passed "rel is writable": each folder dllm then runs from has a home of its own,
        # its bundles and compile caches not found from another one)
        return CheckResult(
            "cache dir",
            "warn",
            f"DLLM_HOME={str(home)!r} is a relative path: it is {home.absolute()} from this folder "
            "only, and each folder dllm runs from gets a home of its own",
            fix=f"export DLLM_HOME={shlex.quote(str(home.absolute()))}",
        )
    if not home.exists():
        # Not made here: the write test made it, so a misspelt DLLM_HOME became a new, empty
        # home (no bundles, no compile packs) without a word. folder_problem found the folder
        # above it writable.
        if not os.environ.get("DLLM_HOME"):  # the platform's own, on a fresh install
            return CheckResult(
                "cache dir",
                "pass",
                f"{home} does not exist yet; the first command that needs it creates it",
            )
        near = _nearest_folder(home)
        return CheckResult(
            "cache dir",
            "warn",
            f"{home} (DLLM_HOME) does not exist yet: the first command that needs it creates "
            "it, so a misspelt DLLM_HOME would become a new, empty home without a word",
            fix=(
                f"export DLLM_HOME={shlex.quote(str(near))} if you meant it; else " if near else ""
            )
            + f"check the spelling of DLLM_HOME; if this is the home you want, mkdir -p "
            f"{shlex.quote(str(home))}",
        )
    return CheckResult("cache dir", "pass", f"{home} is writable")


def _nearest_folder(path: Path) -> Path | None:
    """The folder beside `path` whose name is closest to its own (a DLLM_HOME typo), or None."""
    import difflib

    try:
        names = [p.name for p in path.parent.iterdir() if p.is_dir()]
    except OSError:
        return None
    found = difflib.get_close_matches(path.name, names, n=1, cutoff=0.75)
    return path.parent / found[0] if found else None


def _run_target(ctx: DoctorContext) -> tuple[Path, str]:
    """Where runs go (absolute), and how to choose another place."""
    target = ctx.run_dir  # a launch's (dllm launch --run-dir / --run-root)
    choose = "pass --run-dir (or --run-root, or set launch.run_dir)"
    if target is None and ctx.spec is not None and ctx.spec.launch.run_dir:
        target, choose = Path(ctx.spec.launch.run_dir), "set launch.run_dir"
    if target is None:
        target, choose = Path("runs"), "run from another folder, or set launch.run_dir"
    return target.absolute(), choose


@register_check(order=41)
def run_dir(ctx: DoctorContext) -> CheckResult:
    target, choose = _run_target(ctx)
    # Read-only (doctor must not create the run dir itself): a file on the path is said as
    # such, not as "not writable" (it was, of a file one may write; and an executable file
    # passed as a writable folder).
    problem = folder_problem(target)
    if problem is not None:
        return CheckResult(
            "run dir",
            "fail",
            f"cannot create runs under {target}: {problem.detail}",
            fix=problem.fix(choose),
        )
    if ctx.run_dir is None and ctx.spec is not None and ctx.spec.launch.run_dir:
        # The run dir itself, not a root: `dllm launch` refuses one that holds a run (a second
        # launch of the same spec), which was reported ready ("runs go under" it).
        if (target / "manifest.json").exists():
            return CheckResult(
                "run dir",
                "fail",
                f"launch.run_dir {target} already holds a run (its manifest.json): `dllm "
                "launch` does not write into another run's dir",
                fix="set launch.run_dir to a new folder, or leave it unset for a fresh "
                f"runs/<stamp>-<id> on each launch; dllm run show {shlex.quote(str(target))} "
                "shows that run",
            )
        return CheckResult("run dir", "pass", f"the run goes to {target} (launch.run_dir)")
    return CheckResult("run dir", "pass", f"runs go under {target}")


@register_check(order=42)
def checkpoint_dir(ctx: DoctorContext) -> CheckResult:
    """checkpoint.dir is first written after the first steps: a file in its way is said now."""
    name = "checkpoint dir"
    if ctx.spec is None:
        return ctx.without_spec(name, "its folder")
    run = ctx.run_dir or (Path(ctx.spec.launch.run_dir) if ctx.spec.launch.run_dir else None)
    problem = checkpoint_dir_problem(ctx.spec, run)
    if problem is not None:
        return CheckResult(name, "fail", problem[0], fix=problem[1])
    if ctx.spec.checkpoint.dir is None:
        if folder_problem(_run_target(ctx)[0]) is not None:
            # under a run dir that cannot be made: not a pass (the run dir check fails, with
            # its fix)
            return CheckResult(
                name,
                "skip",
                "not checked: <run dir>/checkpoints, in a run dir that cannot be made (see the "
                "run dir check)",
            )
        return CheckResult(name, "pass", "<run dir>/checkpoints (checkpoint.dir unset)")
    return CheckResult(name, "pass", f"checkpoints go to {ctx.spec.checkpoint.dir}")


@register_check(order=50, name="disk")
def disk_space(ctx: DoctorContext) -> CheckResult:
    """Free space on each file system a run writes to: DLLM_HOME's (bundles, compile caches),
    the run dir's and checkpoint.dir's. A full one fails: its first write would."""
    run, _ = _run_target(ctx)
    places = [
        ("DLLM_HOME", dllm_home(), "DLLM_HOME"),
        ("run dir", run, "--run-dir" if ctx.run_dir is not None else "launch.run_dir"),
    ]
    if ctx.spec is not None and ctx.spec.checkpoint.dir is not None:
        places.append(("checkpoint.dir", Path(ctx.spec.checkpoint.dir), "checkpoint.dir"))
    disks: dict[Path, tuple[int | None, list[str], list[str]]] = {}
    for what, path, move in places:
        mount, free = file_system(path)
        entry = disks.setdefault(mount, (free, [], []))
        entry[1].append(what)
        entry[2].append(move)
    details, short = [], []
    for mount, (free, whats, moves) in disks.items():
        room = "free space unknown" if free is None else f"{human_size(free)} free"
        details.append(f"{room} on {mount} ({', '.join(whats)})")
        if free is not None and free < MIN_FREE_BYTES:
            short.append((free, mount, moves))
    detail = "; ".join(details)
    if not short:
        return CheckResult("disk", "pass", detail)
    full = [mount for free, mount, _ in short if free < FULL_BYTES]
    if full:
        detail = f"{', '.join(map(str, full))} {'is' if len(full) == 1 else 'are'} full: {detail}"
    fix = "; or ".join(
        f"free space on {mount}, or point {' and '.join(moves)} at a larger disk"
        for _, mount, moves in short
    )
    return CheckResult("disk", "fail" if full else "warn", detail, fix=fix)


@register_check(order=60, name="config")
def config_validity(ctx: DoctorContext) -> CheckResult:
    if ctx.config_path is None:
        return CheckResult("config", "pass", "no config given (pass --config to check one)")
    if (
        ctx.config_error
        and ctx.config_hint
        and (ctx.config_hint_fixes or not ctx.config_path.is_file())
    ):
        # no file to edit (not there, a folder): the loader's hint says what to pass instead
        return CheckResult("config", "fail", ctx.config_error, fix=ctx.config_hint)
    if ctx.config_error and ctx.config_hint and "`dllm config schema`" not in ctx.config_hint:
        # A problem of the file, not of fields (YAML syntax, not UTF-8, a key written twice):
        # the loader's own hint says what to change ("edit the fields named above" named none).
        return CheckResult(
            "config",
            "fail",
            ctx.config_error,
            fix=f"{ctx.config_hint}; then check it again with "
            f"`dllm config validate{ctx.config_args()}`",
        )
    if ctx.config_error:
        return CheckResult(
            "config",
            "fail",
            ctx.config_error,
            # (not the validate command alone: it prints the same problems again)
            fix=f"edit the fields named above in {shlex.quote(str(ctx.config_path))}"
            f"{' or the --set values' if ctx.overrides else ''} (`dllm config schema` describes "
            f"each), then check it again with `dllm config validate{ctx.config_args()}`",
        )
    spec = ctx.spec
    return CheckResult(
        "config",
        "pass",
        f"{ctx.config_path}: {spec.model.family} / {spec.objective.name}, "
        f"world size {spec.topology.world_size}",
    )
