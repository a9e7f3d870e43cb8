"""`dllm env sync`: make a virtual environment hold exactly a manifest's packages.

uv installs the pins with `--require-hashes` (a file whose sha256 is not in the manifest is
refused), wheels only, no dependency resolution (the manifest is already the full closure).
Packages the venv holds beyond the manifest are then uninstalled, and the result is checked
with the same code as `dllm env check`; a sync that leaves drift is an error.

A venv sync works on carries a mark until it is complete (`envs.incomplete`): a sync killed
midway (SIGKILL, a lost machine) leaves a venv that check and doctor refuse and the next sync
repairs: one it was creating is removed and made anew, one it was updating gets every pin
reinstalled.

Sources: the manifest's indexes, or only the mirror when one is given. `offline` means nothing but
the mirror is contacted: a folder mirror is read with uv's own `--offline`; a served mirror is the
only index uv is told about.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from turbo_dllm.envs.check import IGNORED_EXTRAS, Drift, compare, same_version
from turbo_dllm.envs.incomplete import MARK, SyncMark, interrupted_sync
from turbo_dllm.envs.inventory import Environment, folder_given_as_python, inspect_environment
from turbo_dllm.envs.manifest import EnvManifest, dump_manifest
from turbo_dllm.envs.select import recorded_manifest_path
from turbo_dllm.envs.uvtool import run_uv
from turbo_dllm.errors import DllmError
from turbo_dllm.fsutil import write_atomic
from turbo_dllm.sigterm import unwinding_on_sigterm

__all__ = ["SyncResult", "mirror_project_line", "sync_environment", "venv_python"]


@dataclass
class SyncResult:
    venv: Path
    python: Path
    created: bool
    installed: int
    removed: list[str] = field(default_factory=list)
    project: str | None = None  # "turbo-dllm 0.1.0 from <mirror>", or None when not installed
    drift: Drift | None = None
    notes: list[str] = field(default_factory=list)


def venv_python(venv: Path) -> Path:
    scripts = venv / ("Scripts" if sys.platform == "win32" else "bin")
    return scripts / ("python.exe" if sys.platform == "win32" else "python")


def _interpreter_version(python: str) -> str:
    import subprocess

    try:
        out = subprocess.run(
            [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except OSError as error:
        raise folder_given_as_python(python) or DllmError(
            f"cannot run --python {python}: {error.strerror or error}",
            hint="pass --python with the path of a working interpreter (e.g. /usr/bin/python3.11)",
        ) from None
    except subprocess.TimeoutExpired:
        raise DllmError(
            f"--python {python} did not say its version within 60 s",
            hint="pass --python with the path of a working interpreter",
        ) from None
    if out.returncode != 0:
        raise DllmError(
            f"cannot run --python {python}: {out.stderr.strip()[-300:]}",
            hint="pass --python with the path of a working interpreter",
        )
    # The last line: what the interpreter's startup prints (a .pth, a sitecustomize) comes first.
    lines = out.stdout.strip().splitlines()
    if not lines or not re.fullmatch(r"\d+\.\d+", lines[-1].strip()):
        raise DllmError(
            f"--python {python} did not say a Python version (it printed "
            f"{out.stdout.strip()[-120:]!r}): is it a Python interpreter?",
            hint="pass --python with the path of a working interpreter",
        )
    return lines[-1].strip()


def _unwritable(venv: Path) -> str | None:
    """Why sync cannot write `venv` (create it, or install into the one there), else None:
    said before anything is made, not by uv halfway through."""
    if venv.exists() and not venv.is_dir():
        return f"{venv} is a file, not a folder"
    if venv.exists():
        site = sorted(venv.glob("lib/python*/site-packages")) or [venv]
        blocked = [folder for folder in (venv, *site) if not os.access(folder, os.W_OK | os.X_OK)]
        return f"{blocked[0]} is not writable" if blocked else None
    parent = venv.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is a file, not a folder"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{parent} is not writable"
    return None


def _foreign_platform(manifest: EnvManifest) -> str | None:
    """Why this host cannot install the manifest's wheels (pins with no wheel of this machine's
    platform: locked for another architecture, or a newer glibc), else None. Said before a venv
    is made, not by uv as a "hash mismatch" for the wheel of this platform it picked instead."""
    from packaging.tags import platform_tags
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    accepted = {*platform_tags(), "any"}
    foreign: list[tuple[str, str]] = []
    for pin in manifest.packages:
        platforms: set[str] = set()
        for wheel in pin.wheels:
            try:
                platforms |= {tag.platform for tag in parse_wheel_filename(wheel.filename)[3]}
            except InvalidWheelFilename:
                return None  # not a wheel name: uv says what is wrong with it
        if platforms and not platforms & accepted:
            foreign.append((pin.name, min(platforms)))
    if not foreign:
        return None
    listed = ", ".join(f"{name} ({platform})" for name, platform in foreign[:4])
    more = f" and {len(foreign) - 4} more" if len(foreign) > 4 else ""
    host = max(platform_tags(), key=lambda tag: tag.startswith("manylinux_"), default="unknown")
    return (
        f"manifest {manifest.target} was locked for {manifest.python_platform} and pins wheels "
        f"this host ({host}) cannot install: {listed}{more}"
    )


def _system_site_packages(venv: Path) -> bool:
    config = venv / "pyvenv.cfg"
    for line in config.read_text(encoding="utf-8").splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "include-system-site-packages":
            return value.strip().lower() == "true"
    return False


def _prepare_venv(
    manifest: EnvManifest, venv: Path, python: str | None, system_site_packages: bool | None
) -> bool:
    """Create the venv (True) or check the existing one fits the manifest (False)."""
    existing = venv_python(venv)
    if (venv / "pyvenv.cfg").is_file() and existing.exists():
        version = _interpreter_version(str(existing))
        if version != manifest.python:
            raise DllmError(
                f"{venv} runs Python {version}; manifest {manifest.target} is for {manifest.python}",
                hint=f"remove {venv} or pass another --venv",
            )
        if system_site_packages is not None and system_site_packages != _system_site_packages(venv):
            raise DllmError(
                f"{venv} was created {'without' if system_site_packages else 'with'} "
                "system site packages",
                hint=f"remove {venv} to recreate it, or match --system-site-packages",
            )
        if python is not None:
            _check_python_fits(python, venv, version)
        return False
    if venv.exists() and any(entry.name != MARK for entry in venv.iterdir()):
        raise DllmError(
            f"{venv} exists and is not a virtual environment", hint="pass another --venv"
        )
    interpreter = python or sys.executable
    version = _interpreter_version(interpreter)
    if version != manifest.python:
        raise DllmError(
            f"{interpreter} is Python {version}; manifest {manifest.target} needs {manifest.python}",
            hint=f"pass --python with a Python {manifest.python} interpreter",
        )
    # --allow-existing: the folder holds sync's mark already (placed before uv writes anything).
    args = ["venv", str(venv), "--python", interpreter, "--quiet", "--allow-existing"]
    if system_site_packages or (system_site_packages is None and manifest.provided):
        # `provided` packages come from the base interpreter: the venv must see them.
        args.append("--system-site-packages")
    run_uv(args, what=f"creating {venv}", hint="pass --venv with a folder you can write")
    return True


def _check_python_fits(python: str, venv: Path, version: str) -> None:
    """`--python` chooses the interpreter a new venv is made with; an existing venv keeps its
    own. One of the venv's Python version is accepted (it names what the venv already is);
    another, or one that does not run, is refused rather than ignored."""
    keep = f"drop --python to update {venv} with its own Python {version}"
    try:
        given = _interpreter_version(python)
    except DllmError as error:
        raise DllmError(
            f"{error.message}; {venv} exists (Python {version}) and --python only chooses the "
            "interpreter of a venv sync creates",
            hint=f"{keep}, or remove {venv} to create it anew with a working --python",
        ) from None
    if given != version:
        raise DllmError(
            f"--python {python} is Python {given}, but {venv} exists with Python {version}: "
            "sync does not change an existing venv's interpreter",
            hint=f"{keep}, or remove {venv} to create it anew with --python {shlex.quote(python)}",
        )


def _check_provided(manifest: EnvManifest, environment: Environment) -> None:
    problems = []
    for package in manifest.provided:
        found = environment.get(package.name)
        if found is None or not same_version(found.version, package.version):
            have = found.version if found else "absent"
            problems.append(f"{package.name}=={package.version} (base has: {have})")
    if problems:
        raise DllmError(
            "the base interpreter does not provide: " + ", ".join(problems),
            hint="create the venv with --system-site-packages from the interpreter (container) "
            "the manifest was made for (--python)",
        )


def _source_args(manifest: EnvManifest, mirror, offline: bool) -> list[str]:
    if mirror is not None:
        mirror.require_wheels()  # before the venv is made
        args = ["--index-url", mirror.simple_url]
        # A folder mirror needs no network at all; uv's --offline makes sure it uses none.
        return args + (["--offline"] if offline and mirror.is_local else [])
    if offline:
        raise DllmError(
            "--offline needs --mirror DIR|URL", hint="create one with `dllm mirror create`"
        )
    simple = [i.url for i in manifest.indexes if i.kind == "simple"]
    args = ["--index-url", simple[0]] if simple else ["--no-index"]
    for url in simple[1:]:
        args += ["--extra-index-url", url]
    for index in manifest.indexes:
        if index.kind == "find-links":
            args += ["--find-links", index.url]
    return args


def mirror_project_line(manifest: EnvManifest, mirror) -> tuple[str | None, str | None]:
    """The project's requirement line from the mirror (hash from MIRROR.json), if it has it,
    and where it comes from. A mirror's wheel of another version than the manifest's project is
    refused (sync installs this line; `dllm env requirements --mirror` prints it)."""
    if mirror is None:
        return None, None
    project = mirror.index().project
    if project is None or project.name != manifest.project.name:
        return None, None
    if project.version != manifest.project.version:
        raise DllmError(
            f"mirror has {project.name} {project.version}; manifest {manifest.target} is for "
            f"{manifest.project.version}",
            hint="use the mirror made for this release",
        )
    line = f"{project.name}=={project.version} --hash=sha256:{project.sha256}"
    return line, f"{project.name} {project.version} from {mirror.location}"


def _check_consistent(manifest: EnvManifest, interpreter: Path) -> None:
    """The pins are installed without resolution (`--no-deps`): make sure they are one
    consistent set (a hand-edited manifest may pin a version another pin does not accept)."""
    proc = run_uv(
        ["pip", "check", "--python", str(interpreter)],
        what=f"checking the requirements installed in {interpreter}",
        ok_codes=(0, 1),
    )
    if proc.returncode == 0:
        return
    # uv sees only the venv's own site-packages: a requirement on a package the base
    # interpreter provides (system site packages, `provided`) looks missing to it. Judged are the
    # packages sync installs, and what they require of each other (of anything, when the venv
    # sees nothing else).
    installed = {p.name for p in manifest.packages}
    sees_only_its_own = not manifest.provided and not _system_site_packages(
        interpreter.parent.parent
    )
    problems = []
    for line in (proc.stdout + proc.stderr).splitlines():
        line = line.strip()
        parts = line.split("`")
        if not line.startswith("The package `") or len(parts) < 4:
            continue
        try:
            required = canonicalize_name(Requirement(parts[3]).name)
        except InvalidRequirement:
            continue
        requirer = canonicalize_name(parts[1])
        if requirer in installed | {manifest.project.name} and (
            required in installed or sees_only_its_own
        ):
            problems.append(line)
    if problems:
        raise DllmError(
            f"manifest {manifest.target}'s pins do not fit together:\n  " + "\n  ".join(problems),
            hint="the manifest is not one resolved set (edited by hand?): regenerate it with "
            f"`dllm env lock --target {manifest.target}`",
        )


def sync_environment(
    manifest: EnvManifest,
    venv: str | Path,
    *,
    python: str | None = None,
    mirror=None,
    offline: bool = False,
    system_site_packages: bool | None = None,
    command: str | None = None,
) -> SyncResult:
    """`command`: this sync as a `dllm env sync ...` line, kept in the venv's mark while it runs
    (a sync that is killed leaves it: the fix of `dllm env check` and `dllm doctor` names it)."""
    venv = Path(venv).absolute()
    foreign = _foreign_platform(manifest)
    if foreign:
        raise DllmError(
            f"cannot sync {venv}: {foreign}",
            hint="sync on a host of that platform, or use the manifest of this host's target "
            "(`dllm env list`; --target auto picks it)",
        )
    source_args = _source_args(manifest, mirror, offline)
    project = mirror_project_line(manifest, mirror)  # a mirror of another release: before a venv
    problem = _unwritable(venv)
    if problem:
        raise DllmError(
            f"cannot sync {venv}: {problem}",
            hint="pass --venv with a folder you can write (or run as the venv's owner)",
        )
    notes = []
    left = interrupted_sync(venv)  # a sync still running there is refused here
    if left is not None and left.created:
        # Everything in it was made by the sync that was creating it, never complete.
        shutil.rmtree(venv)
        notes.append(f"removed {venv}: a sync that was creating it did not finish")
    elif left is not None:
        notes.append(
            f"{venv}: a sync that was updating it did not finish; every pin is reinstalled"
        )
    existed = venv.exists()
    # Absent or an empty folder: whatever is there after a failure, this sync made.
    fresh = not existed or not any(venv.iterdir())
    mark = None
    with unwinding_on_sigterm():  # SIGTERM too removes what this sync made (then ends dllm)
        try:
            if fresh:  # marked before uv writes anything
                venv.mkdir(parents=True, exist_ok=True)
                mark = SyncMark.place(venv, created=True, target=manifest.target, command=command)
            created = _prepare_venv(manifest, venv, python, system_site_packages)
            if mark is None:  # an existing venv, checked: marked before it is changed
                mark = SyncMark.place(venv, created=False, target=manifest.target, command=command)
            result = _install(
                manifest, venv, created, mirror, source_args, project, reinstall=left is not None
            )
            mark.remove()  # complete
            result.notes[:0] = notes
            return result
        except BaseException:
            if fresh:  # a venv this sync made is removed again, never left half-installed
                shutil.rmtree(venv, ignore_errors=True)
                if existed:
                    venv.mkdir(exist_ok=True)  # the empty folder the user named stays as it was
            if mark is not None and left is None:
                # A failure sync saw (or Ctrl-C, SIGTERM): the venv is as the failure left it,
                # which `dllm env check` describes; only a sync that could not get here (killed)
                # leaves its mark.
                mark.remove()
            elif mark is not None:  # still what the killed sync left: it stays marked
                mark.close()
            raise


def _install(
    manifest: EnvManifest,
    venv: Path,
    created: bool,
    mirror,
    source_args: list[str],
    project: tuple[str | None, str | None],
    *,
    reinstall: bool = False,
) -> SyncResult:
    interpreter = venv_python(venv)
    before = inspect_environment(interpreter)
    _check_provided(manifest, before)
    project_line, project_source = project
    requirements = manifest.requirements_txt()
    if project_line:
        requirements += project_line + "\n"
    result = SyncResult(venv, interpreter, created, installed=len(manifest.packages))
    if requirements:
        with tempfile.TemporaryDirectory(prefix="dllm-sync-") as tmp:
            path = Path(tmp) / "requirements.txt"
            path.write_text(requirements, encoding="utf-8")
            run_uv(
                [
                    "pip",
                    "install",
                    "--python",
                    str(interpreter),
                    "--requirement",
                    str(path),
                    "--require-hashes",
                    "--no-deps",
                    "--only-binary",
                    ":all:",
                    "--index-strategy",
                    "unsafe-best-match",
                    # After an interrupted update: a package uv half-wrote may look installed.
                    *(["--reinstall"] if reinstall else []),
                    *source_args,
                ],
                what=f"installing manifest {manifest.target} into {venv}",
                hint="the mirror must hold every pinned wheel (`dllm mirror verify DIR` lists "
                "what it has)"
                if mirror is not None
                else "the manifest's indexes must be reachable and hold every pinned wheel; "
                "without a network, sync from a mirror: --mirror DIR|URL --offline",
                stream=True,
            )
    result.project = project_source
    if requirements:
        _check_consistent(manifest, interpreter)
    # Remove what the manifest does not list, from the venv itself only (never the base).
    after = inspect_environment(interpreter)
    keep = {p.name for p in manifest.packages} | {p.name for p in manifest.provided}
    keep |= {manifest.project.name} | IGNORED_EXTRAS
    extras = sorted(d.name for d in after.distributions if d.name not in keep and after.own(d))
    if extras:
        run_uv(
            ["pip", "uninstall", "--python", str(interpreter), *extras],
            what=f"removing packages the manifest does not list from {venv}",
        )
        result.removed = extras
    drift = compare(manifest, inspect_environment(interpreter))
    if project_line is None:
        # Without a mirror that carries the project's wheel, the project is the user's to install.
        drift.missing = [m for m in drift.missing if m.name != manifest.project.name]
        if not any(d.name == manifest.project.name for d in after.distributions):
            result.notes.append(
                f"{manifest.project.name} itself is not installed: install its wheel with "
                f"`uv pip install --python {shlex.quote(str(interpreter))} --no-deps WHEEL`"
            )
    result.drift = drift
    # The venv answers `dllm env check` and doctor for itself from now on.
    write_atomic(recorded_manifest_path(venv), dump_manifest(manifest))
    if not drift.clean:
        raise DllmError(
            f"after sync, {venv} still differs: {drift.summary()}",
            hint="packages the base interpreter provides cannot be removed by sync; "
            "create the venv without --system-site-packages",
        )
    return result
